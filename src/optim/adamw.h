// AdamW with torch.optim.AdamW semantics (decoupled weight decay, bias correction, amsgrad=false),
// over a list of named parameters, with its state exposed as named tensors for checkpoints.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/side_streams.h"
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
// Precision and placement: fp32/fp64 parameters on kDevice are updated in place in
// their dtype. bf16/fp16 parameters get an fp32 master copy and fp32 moments: the update runs on
// the master (the gradient converted to fp32), then the master is copied into the parameter. On
// CUDA, every parameter whose gradient has its master's dtype is updated by one multi-tensor
// fused call per dtype (adamw_fused_update_many, torch.optim.AdamW(fused=True)'s kernel); the
// others, and every CPU parameter, by the ATen ops.
// AdamWStates::kParameterDtype (memory.precision bf16-states) keeps no masters: the moments are
// in the parameter's dtype and every update, on any device, is ATen's fused kernel on the
// parameter itself, exactly as torch.optim.AdamW(fused=True) runs it (its step counts are float
// tensors on the parameter's device, one per parameter, incremented before the update; here
// integers converted to float for the call, the same values below 2^24 steps).
// kHost (optimizer offload) keeps master weights (fp32; fp64 for fp64 parameters) and moments in
// host memory for every parameter and updates them with one fused, multi-threaded CPU pass
// (optim/cpu_adam.h: kDevice's op order with a correctly rounded sqrt; the moments equal kDevice's
// bit for bit, the weights to a few ulp per step, ATen's CPU sqrt not being exact). Gradients
// reach that pass as:
//   - host gradients (of host parameters, or of CUDA parameters accumulated on the host during
//     backward: GradientBuffers on_host, what the trainer does): read where they are, no copy
//     (bf16/fp16 converted inline);
//   - CUDA gradients (ZeRO's gradient shards of host masters): in pieces, in the gradient's
//     dtype, through two page-locked download buffers (upload_staging_bytes() each), copied on a
//     side stream (after the work queued on the current stream) while the host updates the
//     previous piece: no host copy of every gradient at once.
// Afterwards the master goes back into the parameter: contiguous host parameters are written by
// the same pass (an fp32/fp64 one is its own master: no copy at all); device parameters of the
// master's dtype get a non_blocking copy from the pinned master on the current stream. Parameters
// of another dtype (bf16/fp16 on a GPU) or not contiguous get their converted weights from the
// pass itself, written into one of two page-locked staging buffers (upload_staging_bytes() each)
// and copied from there without blocking, so that the host updates the next piece of the model
// while the previous one travels, and no fp32 weight crosses the bus. A parameter larger than a
// staging buffer goes in pieces. last_step_uploads() counts these copies.
//
// Not thread-safe. The optimizer holds references to the parameter tensors (shared storage): the
// caller's module sees every update.
// What AdamW keeps beside a bf16/fp16 parameter (fp32/fp64 parameters are updated in place either
// way).
enum class AdamWStates {
  kFp32Masters,     // fp32 master weights and fp32 moments (memory.precision bf16)
  kParameterDtype,  // moments in the parameter's dtype, no masters: torch.optim.AdamW(fused=True)
                    // on a bf16 model (memory.precision bf16-states); kDevice only
};

// Where AdamW keeps master weights and moments.
enum class OptimizerPlacement {
  kDevice,  // with the parameters (memory.offload_optimizer: false)
  kHost,    // host memory, pinned for CUDA parameters; update on the CPU (offload_optimizer: true)
};

// kHost: how one step's updated weights reached the parameters that the host pass does not write
// where they lie (device parameters; host ones too under stage_host_parameters), counted per copy
// (a parameter larger than a staging buffer is several pieces, each one copy).
// Bytes are counted in the parameter's dtype.
struct UploadStats {
  // Converted by the pass into a page-locked staging buffer and copied from there (non_blocking
  // to a device).
  int64_t staged = 0, staged_bytes = 0;
  // Copied from the master itself, of the parameter's dtype (page-locked: non_blocking to a
  // device).
  int64_t direct = 0, direct_bytes = 0;
  // Copies that wait for their end: a non-contiguous parameter larger than a staging buffer;
  // ZeRO's conversions outside AdamW.
  int64_t blocking = 0, blocking_bytes = 0;

  UploadStats& operator+=(const UploadStats& other);
};

class AdamW {
 public:
  // REQUIRES: names unique; every tensor defined, dense, fp32, fp64, bf16 or fp16.
  // Throws UserError "optim.<key>: ..." when lr < 0, eps < 0, weight_decay < 0 or a beta is
  // outside [0, 1). State (master copies where needed, exp_avg, exp_avg_sq as zeros) is allocated
  // here, in host memory for kHost.
  // masters (kHost only; empty: AdamW makes its own): the caller's master weights, masters[i] of
  // params[i], used as they are (not read from the parameter, which may hold anything until the
  // first step writes it): contiguous host tensors of the parameter's shape in its master dtype
  // (fp64 for fp64 parameters, else fp32), page-locked for device parameters, or the parameter
  // itself. The caller owns them: state_tensors() lists no "<param>.master" for them, and
  // load_state and reload_parameters leave them alone. (ZeRO: host master shards whose updated
  // weights go to device shards through the staging path below.)
  // states: kParameterDtype REQUIRES kDevice, no masters and contiguous parameters (TORCH_CHECK).
  AdamW(NamedTensors params, const config::OptimOptions& options,
        OptimizerPlacement placement = OptimizerPlacement::kDevice,
        std::vector<at::Tensor> masters = {}, AdamWStates states = AdamWStates::kFp32Masters);

  // One optimizer step at learning rate lr (from lr_at()), using each parameter's .grad().
  // Parameters with an undefined grad are skipped. Gradients are read, never modified.
  // REQUIRES: lr >= 0; each defined grad is dense, with the parameter's shape, dtype and device.
  void step(double lr);

  // The same step with explicit gradients instead of .grad(): grads[i] is the gradient of
  // parameters()[i]; an undefined grads[i] skips that parameter exactly as an undefined .grad()
  // does (no decay, its step count does not advance). step(lr) is step(lr, each .grad()).
  // grads[i] may be in the parameter's dtype or, for a bf16/fp16 parameter, in fp32 (e.g. an fp32
  // gradient accumulation buffer): the fp32 values then reach the fp32 master unrounded. Gradients
  // are read, never modified, and may be released by the caller after step() returns.
  // grad_scale multiplies every gradient (after its conversion to the master dtype) before the
  // update, without writing it: with clip_coefficient (grad_clip.h) it is clipping folded into the
  // update, the same result bit for bit as clip_gradients then step for gradients in the master
  // dtype (e.g. fp32 accumulation buffers). kHost folds it into the fused pass; kDevice scales a
  // temporary per parameter when grad_scale != 1.
  // REQUIRES: lr >= 0; grad_scale finite and > 0; grads.size() == parameters().size(); each
  // defined grads[i] is dense, on the parameter's device (kHost: or on the host for a device
  // parameter, or on a device for a host parameter), with its shape ([param shape]) and its dtype
  // or fp32 as above (violations trip a TORCH_CHECK naming the parameter).
  // kParameterDtype: each defined grads[i] contiguous, of the parameter's dtype and device, and
  // grad_scale == 1 (clip the gradients first, as torch does: clip_gradients_as_torch).
  void step(double lr, const std::vector<at::Tensor>& grads, double grad_scale = 1.0);

  // The overlapped host update (kHost; optim.overlap_host_update): a step whose parts run ahead,
  // each parameter as soon as its gradient is final (during backward), before the clip factor is
  // known, with the clip applied exactly at the end. One such step is
  //   begin_ahead(); update_ahead(...) any number of times; finish_ahead(...)
  // and equals step(lr, grads, grad_scale) bit for bit (skip: no step() at all), grads being the
  // gradients given to update_ahead and finish_ahead (the same tensors, unchanged in between).
  //  - update_ahead: for each parameters()[indices[k]] with grads[k] defined and not yet updated
  //    ahead in this step: keeps its master weights, moments and step count (and a host
  //    parameter of another dtype than its master), then updates it as step(lr, ..., 1.0) does,
  //    uploads included. Untimed (no profile phases: it may run beside the caller's scopes). It
  //    may run on another thread than the other calls, never at the same time as any of them.
  //  - finish_ahead(lr, grads, grad_scale, skip): skip: every parameter updated ahead gets its
  //    kept state and weights back (a device parameter its restored master, converted as the
  //    upload converts it) and no step is counted; grad_scale == 1: the parameters not updated
  //    ahead are updated, the rest stands; else the kept states come back and step(lr, grads,
  //    grad_scale) updates every parameter (the only second pass: on steps that clip).
  // The kept state is 12 bytes per fp32 parameter of host memory (masters and both moments, fp64:
  // 24), allocated at a parameter's first update ahead.
  // REQUIRES: kHost; lr as step()'s; indices.size() == grads.size(); each grads[k] as step()'s
  // for that parameter; the same lr in update_ahead and finish_ahead.
  void begin_ahead();
  void update_ahead(const std::vector<size_t>& indices, const std::vector<at::Tensor>& grads,
                    double lr);
  void finish_ahead(double lr, const std::vector<at::Tensor>& grads, double grad_scale, bool skip);
  // Parameters updated ahead in the current (or last) overlapped step.
  int64_t updated_ahead() const;

  // Number of step() calls so far (after load_state: the loaded count plus later calls).
  int64_t step_count() const { return step_count_; }

  // The parameters, in construction order (for clip_grad_norm and the trainer).
  std::vector<at::Tensor> parameters() const;

  // Optimizer state for a checkpoint, three entries per parameter in construction order:
  //   "<param>.exp_avg"     first moment,  [param shape], master dtype, master device
  //   "<param>.exp_avg_sq"  second moment, [param shape], master dtype, master device
  //   "<param>.step"        [] int64 on CPU, this parameter's own update count
  // plus, for bf16/fp16 parameters under kFp32Masters only, "<param>.master" (fp32 master
  // weights); under kParameterDtype the moments are in the parameter's dtype and device. The master
  // dtype/device is the parameter's for fp32/fp64 on kDevice, else fp32 (fp64) on the host (kHost)
  // or on the parameter's device (kDevice).
  // The moment tensors alias the live state (no copy): write them out before the next step().
  // The global step count is step_count(), saved by the caller next to these.
  NamedTensors state_tensors() const;

  // Restores a state written by state_tensors() and the step_count() saved with it, so that later
  // steps continue bit-for-bit. Values are copied into the existing state tensors (to the
  // parameters' devices). All checks run before anything is copied: on error nothing changes.
  // Master copies are taken from "<param>.master" entries when present, else re-read from the
  // parameters (so load the weights first).
  // Throws UserError "<source>: ..." naming the entry when an entry is missing, unexpected or
  // duplicated, or has another shape or dtype than its parameter's state, or when a step is < 0.
  void load_state(const NamedTensors& state, int64_t step_count,
                  const std::string& source = "optimizer state");

  // Copies every parameter into its master copy (no-op for parameters updated in place). Call it
  // after changing the parameters outside step(), e.g. after loading weights without load_state.
  void reload_parameters();

  const config::OptimOptions& options() const { return options_; }
  OptimizerPlacement placement() const { return placement_; }
  AdamWStates states() const { return states_; }

  // kHost: bytes of each of the two staging buffers the converted weights pass through (above);
  // 64 MiB unless set. Smaller values cut the model into more pieces. stage_host_parameters: send
  // contiguous host parameters of another dtype through them too instead of letting the pass
  // write them (the device path's pieces and copies, run on a CPU: tests).
  // REQUIRES: bytes >= 64 (TORCH_CHECK). Allocation happens at the next step that needs them.
  void set_upload_staging_bytes(int64_t bytes, bool stage_host_parameters = false);
  int64_t upload_staging_bytes() const { return staging_bytes_; }

  // The copies into the parameters of the last step() (zeros before the first and for kDevice).
  const UploadStats& last_step_uploads() const { return last_uploads_; }

  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

 private:
  // Invariants: exp_avg and exp_avg_sq have the shape, dtype and device of the tensor the update
  // runs on: master when defined, else param. master is contiguous; for kHost it is defined, on the
  // host, and may be param itself (fp32/fp64 contiguous host parameter). step >= 0.
  struct Slot {
    std::string name;
    at::Tensor param;       // [any shape], the module's parameter, updated in place
    at::Tensor master;      // [param shape] fp32/fp64 master weights, or undefined (update param)
    at::Tensor exp_avg;     // [param shape] first moment m
    at::Tensor exp_avg_sq;  // [param shape] second moment v
    int64_t step = 0;       // updates applied to this parameter (bias-correction exponent)
    bool own_master = true;  // false: the caller's (constructor's masters), not saved or reloaded
    // The overlapped update (begin_ahead): whether this step updated it ahead, and the state it
    // had before ([param shape] host copies; kept_param only for a host parameter of another
    // dtype than its master).
    bool ahead = false;
    int64_t kept_step = 0;
    at::Tensor kept_master, kept_exp_avg, kept_exp_avg_sq, kept_param;
  };
  // Puts back the kept state of every slot updated ahead, and its weights.
  void restore_ahead();

  void check_grad(const Slot& slot, const at::Tensor& grad) const;
  void update_slot(Slot& slot, const at::Tensor& grad, double lr, double grad_scale);
  // kHost: counts the step of every slot, then update_streamed. grads[i]: slots[i]'s gradient
  // (host or device).
  void update_on_host(const std::vector<Slot*>& slots, const std::vector<at::Tensor>& grads,
                      double lr, double grad_scale);
  // kHost: the slots in batches. A slot whose gradient is on a device, or whose parameter needs
  // converted weights copied to it (upload_needs_staging), goes in pieces through two download
  // and two staging buffers: the download of batch b + 1 and the copies out of batch b - 1 run
  // while the host updates batch b. A slot that needs neither is one piece read and written where
  // it lies. grads[i] is slots[i]'s gradient, contiguous.
  void update_streamed(const std::vector<Slot*>& slots, const std::vector<at::Tensor>& grads,
                       double lr, double grad_scale);
  // A parameter the pass can neither update in place nor write, of another dtype than its master
  // or not contiguous (bf16 on a GPU).
  bool upload_needs_staging(const Slot& slot) const;
  // Waits until no copy out of staging buffer k is in flight.
  void wait_staging(size_t k);

  std::vector<Slot> slots_;
  config::OptimOptions options_;
  OptimizerPlacement placement_;
  AdamWStates states_;
  int64_t step_count_ = 0;
  SideStreams copy_streams_;  // kHost: device gradients are copied to the host on these
  int64_t staging_bytes_ = int64_t{64} << 20;
  bool stage_host_parameters_ = false;
  at::Tensor staging_[2];    // [staging_bytes_] uint8: converted weights on their way to a device
  at::Tensor downloads_[2];  // [staging_bytes_] uint8: device gradients on their way to the host
  std::vector<c10::Event> staging_copies_[2];  // copies out of staging_[k] still in flight
  std::vector<c10::Event> master_copies_;      // copies out of the masters (same dtype)
  UploadStats last_uploads_;                   // the last step's copies into the parameters
  bool time_phases_ = true;  // update_streamed opens profile phases (not in update_ahead)
};

}  // namespace ulysses::train
