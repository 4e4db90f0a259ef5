// The LM head + token cross-entropy as a (sum, count) pair, so that the step loss is
// sum over all ranks / count over all ranks, never a mean of per-rank means.
#pragma once
#include <ATen/ATen.h>

namespace ulysses::model {

inline constexpr int64_t kIgnoreLabel = -100;

struct LossSum {
  at::Tensor sum;    // scalar fp32 (fp64 for fp64 operands), differentiable
  at::Tensor count;  // [] int64 on the labels' device: the valid labels (label != -100); not read
                     // on the host here, so computing a loss never waits for the device
};

// The LM head of one tile of rows: hidden @ lm_head_weight^T as one GEMM in the operands' dtype
// (bf16 stays bf16: no fp32 copy of the weight), then the logits upcast to the loss dtype, fp32
// (fp64 for fp64 operands), for the softmax.
//   hidden [n, h], lm_head_weight [V, h] -> [n, V] loss dtype
at::Tensor lm_head_logits(const at::Tensor& hidden, const at::Tensor& lm_head_weight);

// Per-row cross-entropy of logits: logsumexp(row) - row[label], 0 where label == -100. When
// log_norm is given it receives the logsumexp of each row, [n, 1] (for a hand-written backward).
//   logits [n, V] (fp32/fp64), labels [n] int64 -> [n] logits' dtype
at::Tensor token_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                               at::Tensor* log_norm = nullptr);

// logits = lm_head_logits(hidden, lm_head_weight), then cross-entropy with reduction SUM over
// labels != -100, through autograd (the gradients flow back in the model's dtype). A batch without
// valid labels gives sum 0.
//   hidden [bs, T, h], lm_head_weight [V, h], labels [bs, T] int64 (-100 or in [0, V))
// The full [bs*T, V] logits exist in memory; TiledLogitsLoss (src/sp) avoids that.
// No device sync.
LossSum lm_loss_sum(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                    const at::Tensor& labels);

// Per-token losses without gradients, `tile_rows` positions of the sequence at a time (so the
// logits exist for one tile only), for evaluation.
//   hidden [bs, T, h], lm_head_weight [V, h], labels [bs, T] -> [bs, T] fp32 (fp64), 0 at -100
// REQUIRES: tile_rows >= 1. No device sync.
at::Tensor lm_token_losses(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                           const at::Tensor& labels, int64_t tile_rows);

}  // namespace ulysses::model
