// The ZeRO shards' host update overlapped with their gradient reduction (see
// overlapped_shard_update.h).
#include "zero/overlapped_shard_update.h"

#include <algorithm>
#include <cmath>

#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "profile/phase_timer.h"

namespace ulysses::train {

OverlappedShardUpdate::OverlappedShardUpdate(ZeroOptimizer& zero, int64_t threads)
    : zero_(zero),
      adamw_(zero.shard_optimizer()),
      threads_(threads),
      grads_(zero.shard_grads()),
      handed_(grads_.size(), false),
      reductions_seen_(grads_.size(), 0),
      sums_(grads_.size()) {
  TORCH_CHECK(zero.overlap_applies(),
              "OverlappedShardUpdate: the optimizer must be offloaded with host gradient shards");
  TORCH_CHECK(adamw_.parameters().size() == grads_.size(),
              "OverlappedShardUpdate: one optimizer entry per shard");
  if (ZeroPartition* partition = zero.partition()) {
    for (size_t i = 0; i < grads_.size(); ++i) {
      reductions_needed_.push_back(partition->reductions_per_micro_batch(i));
    }
    partition->set_on_reduced([this](const std::vector<size_t>& params) {
      if (!armed_) return;
      std::vector<size_t> ready;
      for (size_t i : params) {
        if (++reductions_seen_[i] == reductions_needed_[i] && !handed_[i]) ready.push_back(i);
      }
      hand_on(std::move(ready));
    });
  }
  worker_ = std::thread([this] { work(); });
}

OverlappedShardUpdate::~OverlappedShardUpdate() {
  if (ZeroPartition* partition = zero_.partition()) partition->set_on_reduced({});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void OverlappedShardUpdate::begin_step(double lr) {
  wait_idle();  // nothing left from an interrupted step
  lr_ = lr;
  std::fill(handed_.begin(), handed_.end(), false);
  std::fill(reductions_seen_.begin(), reductions_seen_.end(), 0);
  for (auto& s : sums_) s.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    intervals_.clear();
    error_ = nullptr;
  }
  adamw_.begin_ahead();
}

void OverlappedShardUpdate::hand_on(std::vector<size_t> shards) {
  for (size_t f : shards) handed_[f] = true;
  if (shards.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(shards));
  }
  wake_.notify_all();
}

GradientBuffers::SummedFn OverlappedShardUpdate::on_summed() {
  return [this](size_t flat, int64_t end) {
    // This rank's shard of flat f: [rank * S_f, (rank + 1) * S_f).
    const int64_t shard_end = (zero_.world().rank() + 1) * grads_.at(flat).numel();
    if (!handed_[flat] && end >= shard_end) hand_on({flat});
  };
}

void OverlappedShardUpdate::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty()) return;
    std::vector<size_t> shards = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const bool failed = error_ != nullptr;
    lock.unlock();
    const Clock::time_point start = Clock::now();
    std::exception_ptr failure;
    if (!failed) {  // after an error the rest waits for finish_step, which rethrows it
      try {
        std::vector<at::Tensor> grads;
        for (size_t f : shards) {
          sums_[f] = host_gradient_square_sums(grads_[f], threads_);
          grads.push_back(grads_[f]);
        }
        adamw_.update_ahead(shards, grads, lr_);
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

void OverlappedShardUpdate::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

OverlappedShardUpdate::Result OverlappedShardUpdate::finish_step(double grad_clip, double lr) {
  TORCH_CHECK(lr == lr_, "OverlappedShardUpdate::finish_step: lr ", lr, " but the step began at ",
              lr_);
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
      adamw_.finish_ahead(lr_, std::vector<at::Tensor>(grads_.size()), 1.0,
                          /*skip=*/true);  // leave the state as it was before the step
      std::rethrow_exception(error);
    }
  }
  last_ahead_ = adamw_.updated_ahead();
  Result result;
  {
    profile::ScopedPhase part("optimizer_norm", profile::Category::kOptimizer);
    for (size_t f = 0; f < grads_.size(); ++f) {
      if (!handed_[f]) sums_[f] = host_gradient_square_sums(grads_[f], threads_);
    }
    result.grad_norm = zero_.norm_of_square_sums(sums_);  // collective, as clip()'s
  }
  result.skipped = !std::isfinite(result.grad_norm);
  const double scale = result.skipped ? 1.0 : clip_coefficient(result.grad_norm, grad_clip);
  {
    profile::ScopedPhase phase("optimizer");
    // Stage 3: a prefetch still in flight reads the weight shards about to change (none after a
    // backward that ended normally).
    if (zero_.partition() != nullptr) zero_.partition()->begin_weight_update();
    adamw_.finish_ahead(lr_, grads_, scale, result.skipped);
  }
  if (!result.skipped) zero_.publish_step();
  return result;
}

}  // namespace ulysses::train
