// LM head + summed cross-entropy (see lm_loss.h).
#include "model/lm_loss.h"

#include <algorithm>
#include <vector>

namespace ulysses::model {

at::Tensor lm_head_logits(const at::Tensor& hidden, const at::Tensor& lm_head_weight) {
  const at::ScalarType operands = at::promote_types(hidden.scalar_type(), lm_head_weight.scalar_type());
  const at::ScalarType loss_dtype = at::promote_types(operands, at::kFloat);
  return at::linear(hidden.to(operands), lm_head_weight.to(operands)).to(loss_dtype);  // [n, V]
}

at::Tensor token_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                               at::Tensor* log_norm) {
  at::Tensor valid = labels.ne(kIgnoreLabel);                                    // [n]
  at::Tensor targets = labels.masked_fill(valid.logical_not(), 0).unsqueeze(1);  // [n, 1]
  at::Tensor norm = at::logsumexp(logits, {1}, /*keepdim=*/true);                // [n, 1]
  if (log_norm != nullptr) *log_norm = norm;
  return (norm - logits.gather(1, targets)).squeeze(1) * valid.to(logits.scalar_type());  // [n]
}

LossSum lm_loss_sum(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                    const at::Tensor& labels) {
  TORCH_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                  hidden.size(1) == labels.size(1),
              "lm_loss_sum: hidden ", hidden.sizes(), " does not match labels ", labels.sizes());
  TORCH_CHECK(lm_head_weight.dim() == 2 && lm_head_weight.size(1) == hidden.size(2),
              "lm_loss_sum: lm_head_weight ", lm_head_weight.sizes(), " does not match hidden ",
              hidden.sizes());
  at::Tensor logits = lm_head_logits(hidden.reshape({-1, hidden.size(2)}), lm_head_weight);  // [bs*T, V]
  at::Tensor flat_labels = labels.reshape({-1}).to(at::kLong);  // [bs*T]
  LossSum out;
  out.sum =
      at::cross_entropy_loss(logits, flat_labels, /*weight=*/{}, at::Reduction::Sum, kIgnoreLabel);
  out.count = flat_labels.ne(kIgnoreLabel).sum();  // [] int64
  return out;
}

at::Tensor lm_token_losses(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                           const at::Tensor& labels, int64_t tile_rows) {
  TORCH_CHECK(tile_rows >= 1, "lm_token_losses: tile_rows must be >= 1, got ", tile_rows);
  at::NoGradGuard no_grad;
  const int64_t batch = hidden.size(0), length = hidden.size(1), hidden_size = hidden.size(2);
  at::Tensor long_labels = labels.to(hidden.device(), at::kLong);  // [bs, T]
  std::vector<at::Tensor> tiles;
  for (int64_t start = 0; start < length; start += tile_rows) {
    const int64_t len = std::min(tile_rows, length - start);
    at::Tensor logits = lm_head_logits(hidden.narrow(1, start, len).reshape({-1, hidden_size}),
                                       lm_head_weight);  // [bs*len, V]
    tiles.push_back(token_cross_entropy(logits, long_labels.narrow(1, start, len).reshape({-1}))
                        .view({batch, len}));  // [bs, len]
  }
  return at::cat(tiles, 1);  // [bs, T]
}

}  // namespace ulysses::model
