// The offloaded optimizer's host update hidden behind backward (optim.overlap_host_update), as
// DeepSpeed's ZeRO-Offload does: each parameter's host AdamW update starts on a host thread as
// soon as its gradient is final for the step, and the step commits after the norm is known.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "memory/activation_checkpoint.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "zero/ahead_update_worker.h"
#include "zero/grad_buffers.h"

namespace ulysses::train {

// Zero stage 0, optimizer and gradients on the host (GradientBuffers on_host, AdamW kHost), one
// AheadUpdateWorker entry per parameter: each parameter is updated ahead (its weights uploaded)
// and its part of the gradient norm taken once its gradient is final; finish_step adds the norm
// up in host_gradient_norm's order and lets AdamW::finish_ahead commit, redo the update with the
// clip factor or undo it. So the weights, moments and norm equal those of host_gradient_norm,
// clip_coefficient and AdamW::step after backward bit for bit.
// A gradient is final:
//  - in a world of 1, after its decoder layer's backward of the step's last micro-batch (the
//    layer hooks: reduce_layer, armed by compute_gradients), if its sum is then on the host
//    (GradientBuffers::host_sum_ready; the worker first waits for the copy's event on a GPU);
//  - in a larger world, once its sum over the world has landed (GradientBuffers::all_reduce's
//    on_summed): those updates overlap the sums of the later buckets, not backward, which the
//    host sums follow.
// The rest (embedding, final norm, head; whatever was not final) is updated in finish_step.
// Not thread-safe apart from that worker; holds references to everything it is given.
class OverlappedHostUpdate : public memory::LayerParameterHooks {
 public:
  // REQUIRES: buffers on_host, made over model->parameters() in their order; adamw kHost over the
  // same parameters in the same order; world_size >= 1; threads >= 0 (host_gradient_norm's).
  OverlappedHostUpdate(model::LlamaForCausalLM& model, GradientBuffers& buffers, AdamW& adamw,
                       int64_t world_size, int64_t threads);
  ~OverlappedHostUpdate() override;
  OverlappedHostUpdate(const OverlappedHostUpdate&) = delete;
  OverlappedHostUpdate& operator=(const OverlappedHostUpdate&) = delete;

  // Before the step's compute_gradients: updates ahead run at learning rate lr.
  void begin_step(double lr);
  // compute_gradients: true during the last micro-batch's backward.
  void arm(bool armed) { armed_ = armed; }
  void gather_layer(int64_t) override {}
  void release_layer(int64_t) override {}
  void reduce_layer(int64_t layer) override;
  // For GradientBuffers::all_reduce (a world of more than one): hands on what has been summed.
  GradientBuffers::SummedFn on_summed();

  struct Result {
    double grad_norm = 0.0;  // host_gradient_norm of the step's gradients
    bool skipped = false;    // not finite: no update, nothing changed
  };
  // After compute_gradients: waits for the worker, completes the step (see the class comment) with
  // clip_coefficient(norm, grad_clip). Rethrows the worker's error, if any.
  Result finish_step(double grad_clip);

  // Milliseconds of the optimizer's host work done before finish_step was called (during
  // backward and the gradient sum), summed over every step.
  double ms_before_backward_end() const { return worker_.ms_before_backward_end(); }
  // Parameters updated ahead in the last step.
  int64_t last_step_updated_ahead() const { return worker_.last_step_updated_ahead(); }

 private:
  GradientBuffers& buffers_;
  AdamW& adamw_;
  int64_t world_size_;
  std::vector<std::pair<size_t, size_t>> layer_params_;  // per layer: [first, last) of params
  bool armed_ = false;
  AheadUpdateWorker worker_;  // entry i: parameter i, its gradient buffers_.grads()[i]
};

}  // namespace ulysses::train
