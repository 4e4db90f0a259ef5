// LM head + summed cross-entropy (see lm_loss.h).
#include "model/lm_loss.h"

namespace ulysses::model {

LossSum lm_loss_sum(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                    const at::Tensor& labels) {
  TORCH_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                  hidden.size(1) == labels.size(1),
              "lm_loss_sum: hidden ", hidden.sizes(), " does not match labels ", labels.sizes());
  TORCH_CHECK(lm_head_weight.dim() == 2 && lm_head_weight.size(1) == hidden.size(2),
              "lm_loss_sum: lm_head_weight ", lm_head_weight.sizes(), " does not match hidden ",
              hidden.sizes());
  const at::ScalarType compute = at::promote_types(hidden.scalar_type(), at::kFloat);
  const int64_t hidden_size = hidden.size(2);
  at::Tensor flat_hidden = hidden.reshape({-1, hidden_size}).to(compute);   // [bs*T, h]
  at::Tensor logits = at::linear(flat_hidden, lm_head_weight.to(compute));  // [bs*T, V]
  at::Tensor flat_labels = labels.reshape({-1}).to(at::kLong);              // [bs*T]
  LossSum out;
  out.sum =
      at::cross_entropy_loss(logits, flat_labels, /*weight=*/{}, at::Reduction::Sum, kIgnoreLabel);
  out.count = flat_labels.ne(kIgnoreLabel).sum().item<int64_t>();
  return out;
}

}  // namespace ulysses::model
