// AdamW with torch.optim.AdamW semantics (decoupled weight decay, bias correction, amsgrad=false),
// over a list of named parameters, with its state exposed as named tensors for checkpoints.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/options.h"

namespace ulysses::train {

// (name, tensor) pairs, in a fixed order: parameters in, optimizer state out.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One update of parameter p with gradient g at this parameter's step t (1-based), in torch's op
// order (torch/csrc/api/src/optim/adamw.cpp, identical to torch.optim.AdamW's single-tensor path):
//   p   *= 1 - lr * weight_decay
//   m    = b1 * m + (1 - b1) * g
//   v    = b2 * v + (1 - b2) * g * g
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   p   -= (lr / (1 - b1^t)) * m / denom
// A parameter whose grad() is undefined is skipped entirely: no decay, and its own step t does not
// advance (torch keeps one step counter per parameter; so does this class).
//
// Precision: the update runs in the parameter's dtype (fp32 or fp64) with torch ops. Mixed
// precision (bf16 parameters with an fp32 master copy, SPEC 5.5) and optimizer offload (master
// and states in host memory, a fused multi-threaded CPU loop) are later issues: they add a master
// tensor per Slot that update_slot() updates in place of the parameter, then copy back.
//
// Not thread-safe. The optimizer holds references to the parameter tensors (shared storage): the
// caller's module sees every update.
class AdamW {
 public:
  // REQUIRES: names unique; every tensor defined, floating fp32 or fp64, dense.
  // Throws UserError "optim.<key>: ..." when lr < 0, eps < 0, weight_decay < 0 or a beta is
  // outside [0, 1). State (exp_avg, exp_avg_sq) is allocated here as zeros like each parameter.
  AdamW(NamedTensors params, const config::OptimOptions& options);

  // One optimizer step at learning rate lr (from lr_at()), using each parameter's .grad().
  // Parameters with an undefined grad are skipped. Gradients are read, never modified.
  // REQUIRES: lr >= 0; each defined grad is dense, with the parameter's shape and dtype.
  void step(double lr);

  // Number of step() calls so far (after load_state: the loaded count plus later calls).
  int64_t step_count() const { return step_count_; }

  // The parameters, in construction order (for clip_grad_norm and the trainer).
  std::vector<at::Tensor> parameters() const;

  // Optimizer state for a checkpoint, three entries per parameter in construction order:
  //   "<param>.exp_avg"     first moment,  [param shape], param dtype, param device
  //   "<param>.exp_avg_sq"  second moment, [param shape], param dtype, param device
  //   "<param>.step"        [] int64 on CPU, this parameter's own update count
  // The moment tensors alias the live state (no copy): write them out before the next step().
  // The global step count is step_count(), saved by the caller next to these.
  NamedTensors state_tensors() const;

  // Restores a state written by state_tensors() and the step_count() saved with it, so that later
  // steps continue bit-for-bit. Values are copied into the existing state tensors (to the
  // parameters' devices). All checks run before anything is copied: on error nothing changes.
  // Throws UserError "<source>: ..." naming the entry when an entry is missing, unexpected or
  // duplicated, or has another shape or dtype than its parameter's state, or when a step is < 0.
  void load_state(const NamedTensors& state, int64_t step_count,
                  const std::string& source = "optimizer state");

  const config::OptimOptions& options() const { return options_; }

 private:
  // Invariants: exp_avg and exp_avg_sq have param's shape, dtype and device; step >= 0.
  struct Slot {
    std::string name;
    at::Tensor param;       // [any shape], fp32 or fp64, updated in place
    at::Tensor exp_avg;     // [param shape] first moment m
    at::Tensor exp_avg_sq;  // [param shape] second moment v
    int64_t step = 0;       // updates applied to this parameter (bias-correction exponent)
  };

  void update_slot(Slot& slot, const at::Tensor& grad, double lr);

  std::vector<Slot> slots_;
  config::OptimOptions options_;
  int64_t step_count_ = 0;
};

}  // namespace ulysses::train
