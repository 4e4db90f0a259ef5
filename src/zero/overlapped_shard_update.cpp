// The ZeRO shards' host update overlapped with their gradient reduction (see
// overlapped_shard_update.h).
#include "zero/overlapped_shard_update.h"

#include <algorithm>
#include <cmath>

#include "optim/grad_clip.h"
#include "profile/phase_timer.h"

namespace ulysses::train {

OverlappedShardUpdate::OverlappedShardUpdate(ZeroOptimizer& zero, int64_t threads)
    : zero_(zero),
      adamw_(zero.shard_optimizer()),
      grads_(zero.shard_grads()),
      reductions_seen_(grads_.size(), 0),
      worker_(adamw_, [this](size_t f) { return grads_[f]; }, threads) {
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
        if (++reductions_seen_[i] == reductions_needed_[i] && !worker_.handed(i)) {
          ready.push_back(i);
        }
      }
      worker_.hand_on(std::move(ready));
    });
  }
}

OverlappedShardUpdate::~OverlappedShardUpdate() {
  if (ZeroPartition* partition = zero_.partition()) partition->set_on_reduced({});
}

void OverlappedShardUpdate::begin_step(double lr) {
  worker_.begin_step(lr);
  std::fill(reductions_seen_.begin(), reductions_seen_.end(), 0);
}

GradientBuffers::SummedFn OverlappedShardUpdate::on_summed() {
  return [this](size_t flat, int64_t end) {
    // This rank's shard of flat f: [rank * S_f, (rank + 1) * S_f).
    const int64_t shard_end = (zero_.world().rank() + 1) * grads_.at(flat).numel();
    if (!worker_.handed(flat) && end >= shard_end) worker_.hand_on({flat});
  };
}

OverlappedShardUpdate::Result OverlappedShardUpdate::finish_step(double grad_clip, double lr) {
  TORCH_CHECK(lr == worker_.lr(), "OverlappedShardUpdate::finish_step: lr ", lr,
              " but the step began at ", worker_.lr());
  armed_ = false;
  Result result;
  result.grad_norm = worker_.wait_and_norm([this](const std::vector<std::vector<double>>& sums) {
    return zero_.norm_of_square_sums(sums);  // collective, as clip()'s
  });
  result.skipped = !std::isfinite(result.grad_norm);
  const double scale = result.skipped ? 1.0 : clip_coefficient(result.grad_norm, grad_clip);
  {
    profile::ScopedPhase phase("optimizer");
    // Stage 3: a prefetch still in flight reads the weight shards about to change (none after a
    // backward that ended normally).
    if (zero_.partition() != nullptr) zero_.partition()->begin_weight_update();
    adamw_.finish_ahead(worker_.lr(), grads_, scale, result.skipped);
  }
  if (!result.skipped) zero_.publish_step();
  return result;
}

}  // namespace ulysses::train
