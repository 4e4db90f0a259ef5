// The host update overlapped with backward (see overlapped_host_update.h).
#include "zero/overlapped_host_update.h"

#include <cmath>
#include <string>

#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "zero/layer_all_reduce.h"

namespace ulysses::train {

OverlappedHostUpdate::OverlappedHostUpdate(model::LlamaForCausalLM& model,
                                           GradientBuffers& buffers, AdamW& adamw,
                                           int64_t world_size, int64_t threads)
    : buffers_(buffers),
      adamw_(adamw),
      world_size_(world_size),
      worker_(adamw, [this](size_t i) { return buffers_.grads()[i]; }, threads) {
  TORCH_CHECK(adamw.placement() == OptimizerPlacement::kHost,
              "OverlappedHostUpdate: the optimizer must be offloaded (kHost)");
  TORCH_CHECK(world_size >= 1, "OverlappedHostUpdate: world_size must be >= 1");
  layer_params_ =
      layer_parameter_ranges(model, buffers.params(), "OverlappedHostUpdate: the buffers");
  const std::vector<at::Tensor> optimized = adamw.parameters();
  TORCH_CHECK(optimized.size() == buffers.params().size(),
              "OverlappedHostUpdate: the optimizer is not over the model's parameters");
  for (size_t i = 0; i < optimized.size(); ++i) {
    TORCH_CHECK(optimized[i].is_same(buffers.params()[i]),
                "OverlappedHostUpdate: the optimizer's parameters are not in the model's order");
  }
}

OverlappedHostUpdate::~OverlappedHostUpdate() = default;

void OverlappedHostUpdate::begin_step(double lr) { worker_.begin_step(lr); }

void OverlappedHostUpdate::reduce_layer(int64_t layer) {
  if (!armed_ || world_size_ > 1) return;  // several ranks: on_summed, after their sum
  const auto [first, last] = layer_params_.at(static_cast<size_t>(layer));
  std::vector<size_t> ready;
  for (size_t i = first; i < last; ++i) {
    if (!worker_.handed(i) && buffers_.grads()[i].defined() && buffers_.host_sum_ready(i)) {
      ready.push_back(i);
    }
  }
  if (ready.empty()) return;
  worker_.hand_on(std::move(ready), buffers_.mark_host_copies());
}

GradientBuffers::SummedFn OverlappedHostUpdate::on_summed() {
  return [this](size_t flat, int64_t end) {
    std::vector<size_t> ready;
    const auto& grads = buffers_.grads();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (worker_.handed(i) || !grads[i].defined() ||
          buffers_.flat_index(i) != static_cast<int>(flat)) {
        continue;
      }
      if (buffers_.flat_offset(i) + grads[i].numel() <= end) ready.push_back(i);
    }
    worker_.hand_on(std::move(ready));
  };
}

OverlappedHostUpdate::Result OverlappedHostUpdate::finish_step(double grad_clip) {
  armed_ = false;
  Result result;
  result.grad_norm = worker_.wait_and_norm(host_gradient_norm_of_sums);
  result.skipped = !std::isfinite(result.grad_norm);
  const double scale = result.skipped ? 1.0 : clip_coefficient(result.grad_norm, grad_clip);
  adamw_.finish_ahead(worker_.lr(), buffers_.grads(), scale, result.skipped);
  return result;
}

}  // namespace ulysses::train
