// The offloaded optimizer's host update hidden behind the gradient reduction at ZeRO stages 1-3
// (optim.overlap_host_update): each shard's host AdamW update starts on a host thread as soon as
// the shard's gradient sum has landed, and the step commits after the norm is known.
#pragma once
#include <cstdint>
#include <vector>

#include "zero/ahead_update_worker.h"
#include "zero/grad_buffers.h"
#include "zero/zero_optimizer.h"

namespace ulysses::train {

// ZeroOptimizer with the optimizer offloaded and every gradient shard in host memory
// (ZeroOptimizer::overlap_applies), one AheadUpdateWorker entry per shard. A shard is final:
//  - stage 1 (flat layout): once the flat's all-reduce has summed every bucket up to the end of
//    this rank's shard (on_summed, given to ZeroOptimizer::reduce_gradients: the buckets started
//    during backward and then the rest, waited for in the flat's order), so its update overlaps
//    the sums of the buckets after it;
//  - stages 2 and 3 (parameter layout): once its unit's reduce-scatter of the step's last
//    micro-batch has landed (ZeroPartition::set_on_reduced, armed by compute_gradients; a tied
//    embedding after both of its units'), during the backward of the units below.
// The worker then updates it ahead (at stage 3 the weight shards, which no gather reads again in
// this step) and takes its part of the norm. finish_step adds the norm up as ZeroOptimizer::clip
// does (shards in order, chunks in order, one all-reduce), then AdamW::finish_ahead commits (no
// clip), redoes the update from the kept state with the clip factor (clip) or undoes it (not
// finite), and ZeroOptimizer::publish_step gathers or uploads the shards as step() does. So the
// norm, weights and moments equal clip() then step() bit for bit, with every collective in the
// same order on every rank (the worker runs none).
// Not thread-safe apart from that worker; holds references to `zero` (which must outlive it).
class OverlappedShardUpdate {
 public:
  // REQUIRES: zero.overlap_applies() (TORCH_CHECK); threads >= 0 (host_gradient_square_sums').
  // Installs the partition's reduction callback (parameter layout) until destruction.
  OverlappedShardUpdate(ZeroOptimizer& zero, int64_t threads);
  ~OverlappedShardUpdate();
  OverlappedShardUpdate(const OverlappedShardUpdate&) = delete;
  OverlappedShardUpdate& operator=(const OverlappedShardUpdate&) = delete;

  // Before the step's compute_gradients: updates ahead run at learning rate lr.
  void begin_step(double lr);
  // compute_gradients: true during the last micro-batch (parameter layout: its reductions make
  // the shards final).
  void arm(bool armed) { armed_ = armed; }
  // For ZeroOptimizer::reduce_gradients (flat layout): hands on each shard once it is summed.
  GradientBuffers::SummedFn on_summed();

  struct Result {
    double grad_norm = 0.0;  // ZeroOptimizer::clip's norm of the step's gradients
    bool skipped = false;    // not finite: no update, nothing changed
  };
  // Collective, after compute_gradients and ZeroOptimizer::reduce_gradients (in place of clip
  // and step): waits for the worker, completes the step with clip_coefficient(norm, grad_clip)
  // and, unless skipped, publishes the updated shards. Rethrows the worker's error, if any, with
  // the optimizer state put back.
  Result finish_step(double grad_clip, double lr);

  // Milliseconds of the optimizer's host work done before finish_step was called (during
  // backward and the gradient reduction), summed over every step.
  double ms_before_backward_end() const { return worker_.ms_before_backward_end(); }
  // Shards updated ahead in the last step.
  int64_t last_step_updated_ahead() const { return worker_.last_step_updated_ahead(); }
  // Shards (AdamW entries) this rank updates per step.
  int64_t shards() const { return static_cast<int64_t>(grads_.size()); }

 private:
  ZeroOptimizer& zero_;
  AdamW& adamw_;
  std::vector<at::Tensor> grads_;           // [S_f] per shard: zero_.shard_grads()
  std::vector<int64_t> reductions_needed_;  // parameter layout: per shard, its units
  bool armed_ = false;
  std::vector<int64_t> reductions_seen_;  // per shard: its reductions while armed
  AheadUpdateWorker worker_;              // entry f: shard f, its gradient grads_[f]
};

}  // namespace ulysses::train
