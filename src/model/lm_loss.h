// The LM head + token cross-entropy as a (sum, count) pair, so that the step loss is
// sum over all ranks / count over all ranks (SPEC 5.4), never a mean of per-rank means.
#pragma once
#include <ATen/ATen.h>

namespace ulysses::model {

inline constexpr int64_t kIgnoreLabel = -100;

struct LossSum {
  at::Tensor sum;     // scalar fp32 (fp64 for fp64 hidden), differentiable
  int64_t count = 0;  // number of valid labels (label != -100)
};

// logits = hidden @ lm_head_weight^T computed in fp32 (fp64 when hidden is fp64), then
// cross-entropy with reduction SUM over labels != -100. A batch without valid labels gives sum 0.
//   hidden [bs, T, h], lm_head_weight [V, h], labels [bs, T] int64 (-100 or in [0, V))
// The full [bs*T, V] logits exist in memory; TiledLogitsLoss (src/sp) avoids that.
// Synchronizes with the device once to read count.
LossSum lm_loss_sum(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                    const at::Tensor& labels);

}  // namespace ulysses::model
