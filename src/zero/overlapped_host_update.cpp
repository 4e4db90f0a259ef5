// The host update overlapped with backward (see overlapped_host_update.h).
#include "zero/overlapped_host_update.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "profile/phase_timer.h"
#include "zero/layer_all_reduce.h"

namespace ulysses::train {

OverlappedHostUpdate::OverlappedHostUpdate(model::LlamaForCausalLM& model,
                                           GradientBuffers& buffers, AdamW& adamw,
                                           int64_t world_size, int64_t threads)
    : buffers_(buffers),
      adamw_(adamw),
      world_size_(world_size),
      threads_(threads),
      handed_(buffers.params().size(), false),
      sums_(buffers.params().size()) {
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
  worker_ = std::thread([this] { work(); });
}

OverlappedHostUpdate::~OverlappedHostUpdate() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void OverlappedHostUpdate::begin_step(double lr) {
  wait_idle();  // nothing left from an interrupted step
  lr_ = lr;
  std::fill(handed_.begin(), handed_.end(), false);
  for (auto& s : sums_) s.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    intervals_.clear();
    error_ = nullptr;
  }
  adamw_.begin_ahead();
}

void OverlappedHostUpdate::hand_on(std::vector<size_t> indices, std::vector<c10::Event> copies) {
  for (size_t i : indices) handed_[i] = true;
  if (indices.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(indices), std::move(copies)});
  }
  wake_.notify_all();
}

void OverlappedHostUpdate::reduce_layer(int64_t layer) {
  if (!armed_ || world_size_ > 1) return;  // several ranks: on_summed, after their sum
  const auto [first, last] = layer_params_.at(static_cast<size_t>(layer));
  std::vector<size_t> ready;
  for (size_t i = first; i < last; ++i) {
    if (!handed_[i] && buffers_.grads()[i].defined() && buffers_.host_sum_ready(i)) {
      ready.push_back(i);
    }
  }
  if (ready.empty()) return;
  hand_on(std::move(ready), buffers_.mark_host_copies());
}

GradientBuffers::SummedFn OverlappedHostUpdate::on_summed() {
  return [this](size_t flat, int64_t end) {
    std::vector<size_t> ready;
    const auto& grads = buffers_.grads();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (handed_[i] || !grads[i].defined() || buffers_.flat_index(i) != static_cast<int>(flat)) {
        continue;
      }
      if (buffers_.flat_offset(i) + grads[i].numel() <= end) ready.push_back(i);
    }
    hand_on(std::move(ready), {});
  };
}

void OverlappedHostUpdate::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const bool failed = error_ != nullptr;
    lock.unlock();
    const Clock::time_point start = Clock::now();
    std::exception_ptr failure;
    if (!failed) {  // after an error the rest waits for finish_step, which rethrows it
      try {
        for (c10::Event& copied : task.copies) copied.synchronize();
        std::vector<at::Tensor> grads;
        grads.reserve(task.indices.size());
        for (size_t i : task.indices) {
          const at::Tensor& g = buffers_.grads()[i];
          sums_[i] = host_gradient_square_sums(g, threads_);
          grads.push_back(g);
        }
        adamw_.update_ahead(task.indices, grads, lr_);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    const Clock::time_point end = Clock::now();
    lock.lock();
    if (failure && !error_) error_ = failure;
    intervals_.emplace_back(start, end);
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

void OverlappedHostUpdate::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

OverlappedHostUpdate::Result OverlappedHostUpdate::finish_step(double grad_clip) {
  const Clock::time_point backward_end = Clock::now();
  armed_ = false;
  wait_idle();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [start, end] : intervals_) {
      if (start < backward_end) {
        ms_ahead_ +=
            std::chrono::duration<double, std::milli>(std::min(end, backward_end) - start).count();
      }
    }
    intervals_.clear();
    if (error_) {
      std::exception_ptr error = error_;
      error_ = nullptr;
      adamw_.finish_ahead(lr_, std::vector<at::Tensor>(buffers_.grads().size()), 1.0,
                          /*skip=*/true);  // leave the state as it was before the step
      std::rethrow_exception(error);
    }
  }
  last_ahead_ = adamw_.updated_ahead();
  Result result;
  {
    profile::ScopedPhase part("optimizer_norm", profile::Category::kOptimizer);
    const auto& grads = buffers_.grads();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!handed_[i]) sums_[i] = host_gradient_square_sums(grads[i], threads_);
    }
    result.grad_norm = host_gradient_norm_of_sums(sums_);
  }
  result.skipped = !std::isfinite(result.grad_norm);
  const double scale = result.skipped ? 1.0 : clip_coefficient(result.grad_norm, grad_clip);
  adamw_.finish_ahead(lr_, buffers_.grads(), scale, result.skipped);
  return result;
}

}  // namespace ulysses::train
