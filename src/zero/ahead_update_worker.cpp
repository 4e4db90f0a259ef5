// The overlapped optimizer updates' host thread (see ahead_update_worker.h).
#include "zero/ahead_update_worker.h"

#include <algorithm>

#include "optim/cpu_adam.h"
#include "profile/phase_timer.h"

namespace ulysses::train {

AheadUpdateWorker::AheadUpdateWorker(AdamW& adamw, GradientFn gradient, int64_t threads)
    : adamw_(adamw),
      gradient_(std::move(gradient)),
      threads_(threads),
      handed_(adamw.parameters().size(), false),
      sums_(handed_.size()) {
  worker_ = std::thread([this] { work(); });
}

AheadUpdateWorker::~AheadUpdateWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void AheadUpdateWorker::begin_step(double lr) {
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

void AheadUpdateWorker::hand_on(std::vector<size_t> entries, std::vector<c10::Event> events) {
  for (size_t i : entries) handed_[i] = true;
  if (entries.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(entries), std::move(events)});
  }
  wake_.notify_all();
}

void AheadUpdateWorker::work() {
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
    if (!failed) {  // after an error the rest waits for wait_and_norm, which rethrows it
      try {
        for (c10::Event& event : task.events) event.synchronize();
        std::vector<at::Tensor> grads;
        grads.reserve(task.entries.size());
        for (size_t i : task.entries) {
          grads.push_back(gradient_(i));
          sums_[i] = host_gradient_square_sums(grads.back(), threads_);
        }
        adamw_.update_ahead(task.entries, grads, lr_);
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

void AheadUpdateWorker::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

double AheadUpdateWorker::wait_and_norm(const NormOfSumsFn& norm_of_sums) {
  const Clock::time_point backward_end = Clock::now();
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
      adamw_.finish_ahead(lr_, std::vector<at::Tensor>(handed_.size()), 1.0,
                          /*skip=*/true);  // leave the state as it was before the step
      std::rethrow_exception(error);
    }
  }
  last_ahead_ = adamw_.updated_ahead();
  profile::ScopedPhase part("optimizer_norm", profile::Category::kOptimizer);
  for (size_t i = 0; i < sums_.size(); ++i) {
    if (!handed_[i]) sums_[i] = host_gradient_square_sums(gradient_(i), threads_);
  }
  return norm_of_sums(sums_);
}

}  // namespace ulysses::train
