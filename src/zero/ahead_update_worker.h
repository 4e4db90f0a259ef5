// The host thread behind the overlapped optimizer updates (optim.overlap_host_update): it updates
// each entry of an offloaded AdamW ahead, as soon as its owner says the entry's gradient is final,
// and keeps the entry's part of the gradient norm for the end of the step.
#pragma once
#include <c10/core/Event.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "optim/adamw.h"

namespace ulysses::train {

// Entries 0..n-1 are those of one AdamW (kHost), entry i's gradient gradient(i). One step:
//   begin_step(lr); hand_on(...) any number of times, as entries become final; wait_and_norm(...);
//   then the owner's AdamW::finish_ahead(lr(), grads, clip factor, skipped).
// For each entry handed on, the worker thread (beside backward or the gradient reduction) waits
// for the task's events, computes the entry's part of the gradient norm
// (host_gradient_square_sums: its 64K-element chunks' fp64 sums of squares) and updates it as if
// nothing clipped (AdamW::update_ahead, keeping its old state). wait_and_norm computes the same
// sums for the entries not handed on and lets the owner add the norm up from all of them, in
// entry order, so that it equals the norm taken after backward bit for bit; AdamW::finish_ahead
// then commits (no clip), redoes the update from the kept state with the clip factor (clip), or
// undoes it (not finite). The worker runs no collective, so the owner's stay in the same order on
// every rank.
// The first error of an update ahead ends the step's work ahead (later tasks are skipped);
// wait_and_norm undoes what was updated ahead and rethrows it.
// Invariants: handed(i) for every entry in a task queued or done this step; sums_[i] is written
// by the worker for a handed entry, by wait_and_norm for the others, and read only while the
// worker is idle.
// Not thread-safe apart from its own thread; holds a reference to `adamw`.
class AheadUpdateWorker {
 public:
  // Entry i's gradient (undefined: none this step), the same tensor from the entry's hand_on to
  // the end of the step; called on the worker thread and by wait_and_norm.
  using GradientFn = std::function<at::Tensor(size_t)>;
  // The gradient norm from every entry's chunks' sums of squares ([n], entry order).
  using NormOfSumsFn = std::function<double(const std::vector<std::vector<double>>&)>;

  // Starts the worker. REQUIRES: adamw kHost (the owner checks it); threads >= 0
  // (host_gradient_square_sums').
  AheadUpdateWorker(AdamW& adamw, GradientFn gradient, int64_t threads);
  // Finishes the tasks queued, then stops the worker.
  ~AheadUpdateWorker();
  AheadUpdateWorker(const AheadUpdateWorker&) = delete;
  AheadUpdateWorker& operator=(const AheadUpdateWorker&) = delete;

  // Before the step's gradients: waits for anything left from an interrupted step, forgets it,
  // and begins the AdamW step ahead (AdamW::begin_ahead) at learning rate lr.
  void begin_step(double lr);
  // The step's learning rate.
  double lr() const { return lr_; }
  // Whether entry i was handed on this step.
  bool handed(size_t i) const { return handed_[i]; }
  // Queues the update of `entries` (final for this step, none handed on before) once `events`
  // have completed (the copies the gradients come from; empty on the CPU). Returns at once.
  void hand_on(std::vector<size_t> entries, std::vector<c10::Event> events = {});

  // After the step's gradients (the end of backward): waits for the worker and adds its busy
  // time before this call to ms_before_backward_end. If an update ahead failed, undoes every
  // update ahead (AdamW::finish_ahead with skip) and rethrows its error. Otherwise computes, in
  // the profile phase "optimizer_norm", the sums of squares of the entries not handed on and
  // returns norm_of_sums(sums) (in that phase too).
  double wait_and_norm(const NormOfSumsFn& norm_of_sums);

  // Milliseconds of the worker's updates before wait_and_norm was called, over every step.
  double ms_before_backward_end() const { return ms_ahead_; }
  // Entries updated ahead in the last step.
  int64_t last_step_updated_ahead() const { return last_ahead_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Task {
    std::vector<size_t> entries;
    std::vector<c10::Event> events;  // to wait for before reading the gradients (GPU)
  };
  void work();
  void wait_idle();

  AdamW& adamw_;
  GradientFn gradient_;
  int64_t threads_;
  double lr_ = 0.0;
  std::vector<bool> handed_;               // [n]: given to the worker this step
  std::vector<std::vector<double>> sums_;  // [n]: the entry's chunks' sums of squares
  double ms_ahead_ = 0.0;
  int64_t last_ahead_ = 0;
  // The worker and its queue (everything below mutex_ is guarded by it).
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> intervals_;  // worker busy spans
  std::thread worker_;
};

}  // namespace ulysses::train
