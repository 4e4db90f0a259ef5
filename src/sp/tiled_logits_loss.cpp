// LM head + cross-entropy per sequence tile, backward inside forward (see tiled_logits_loss.h).
#include "sp/tiled_logits_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "sp/sequence_tiled_compute.h"
#include "sp/wide_matmul.h"

namespace ulysses::sp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Gradients of the loss sum for an incoming gradient of 1, kept from forward to backward: the
// hidden gradient in the operands' dtype (bf16 for a bf16 model: no fp32 [bs, T, h] buffer), the
// weight gradient, a sum over every tile, in fp32 (fp64 for fp64 operands): a bf16 running sum
// would round once per tile (about 1 % relative error at 64 tiles, against 0.2 % for one rounding).
struct LossGradients {
  at::Tensor hidden;  // [bs, T, h] operand dtype, undefined when not needed
  at::Tensor weight;  // [V, h] fp32 (fp64), undefined when not needed
};

// Loss sum of all tiles (scalar, loss dtype: fp32, fp64 for fp64); fills `grads` for the parts
// that are defined. Per tile of n = bs*T_i rows, with the GEMMs in the operands' dtype:
//   logits = hidden_tile @ W^T [n, V], written in the loss dtype (wide_matmul.h: by the GEMM
//            itself on CUDA, else converted once);
//   the row max (one read), p = softmax(logits) (one fused pass, a new [n, V]), after which the
//            logits are freed, and p's row max (one read), which is p at the logits' argmax,
//            1 / sum of exp(logit - max) >= 1/V: it never underflows, and logsumexp =
//            max - log max(p); the tile's loss sum from [n] values;
//   d(sum CE)/d logits = p - one_hot(label), the -1 scattered into p in place; the rows of
//            ignored labels are not masked in [n, V] but in [n, h]: grad_hidden's rows are zeroed
//            and the hidden rows that multiply p into grad_weight are zeroed;
//   grad_hidden tile = d logits @ W [n, h], grad_weight += d logits^T @ masked hidden [V, h] through
//            add_matmul_ (wide_matmul.h: in the GEMM where the library can).
// Full passes over [n, V] beside the GEMMs: the two maxima, the softmax and, for bf16/fp16
// operands, the conversion of p to the operands' dtype. (A max with its index instead of the
// second maximum costs more than the softmax on a CPU.)
at::Tensor tiled_loss_and_gradients(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                                    const at::Tensor& labels, int64_t tiles, LossGradients& grads) {
  const at::ScalarType operands =
      at::promote_types(hidden.scalar_type(), lm_head_weight.scalar_type());
  const at::ScalarType loss_dtype = at::promote_types(operands, at::kFloat);
  const int64_t batch = hidden.size(0), hidden_size = hidden.size(2);
  at::Tensor weight = lm_head_weight.to(operands);  // [V, h], no copy when the dtypes agree
  at::Tensor loss_sum;                              // [] loss dtype
  for (const SequenceTile& tile : sequence_tiles(hidden.size(1), tiles)) {
    at::Tensor tile_hidden = hidden.narrow(1, tile.start, tile.length)
                                 .reshape({-1, hidden_size})
                                 .to(operands);  // [n, h]
    at::Tensor tile_labels = labels.narrow(1, tile.start, tile.length).reshape({-1});  // [n]
    at::Tensor valid = tile_labels.ne(model::kIgnoreLabel);                             // [n]
    at::Tensor targets = tile_labels.masked_fill(valid.logical_not(), 0).unsqueeze(1);  // [n, 1]
    at::Tensor logits = matmul_as(tile_hidden, weight.t(), loss_dtype);  // [n, V] loss dtype
    at::Tensor row_max = logits.amax(1, /*keepdim=*/true);               // [n, 1]
    at::Tensor label_logits = logits.gather(1, targets);                 // [n, 1]
    at::Tensor probs = at::_softmax(logits, 1, /*half_to_float=*/false);  // [n, V] loss dtype
    logits.reset();
    at::Tensor log_norm = row_max - probs.amax(1, /*keepdim=*/true).log_();  // [n, 1] logsumexp
    at::Tensor mask = valid.to(loss_dtype).unsqueeze(1);                 // [n, 1]
    at::Tensor tile_loss = ((log_norm - label_logits) * mask).sum();     // []
    loss_sum = loss_sum.defined() ? loss_sum.add_(tile_loss) : tile_loss;

    if (!grads.hidden.defined() && !grads.weight.defined()) continue;
    // d(sum CE)/d logits on valid rows; ignored rows are masked on the [n, h] side below.
    probs.scatter_add_(1, targets, at::full({probs.size(0), 1}, -1.0, probs.options()));
    at::Tensor grad_logits = probs.to(operands);  // [n, V] operand dtype; no copy when equal
    probs.reset();
    at::Tensor row_mask = mask.to(operands);  // [n, 1]
    if (grads.hidden.defined()) {
      at::Tensor grad_tile = at::mm(grad_logits, weight).mul_(row_mask);  // [n, h]
      grads.hidden.narrow(1, tile.start, tile.length)
          .copy_(grad_tile.view({batch, tile.length, hidden_size}));
    }
    if (grads.weight.defined()) {
      add_matmul_(grads.weight, grad_logits.t(), tile_hidden * row_mask);  // [V, h]
    }
  }
  return loss_sum;
}

struct TiledLogitsLossFunction : public torch::autograd::Function<TiledLogitsLossFunction> {
  // Returns the loss sum []; need_* say which gradients backward will be asked for.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& lm_head_weight, const at::Tensor& labels,
                            int64_t tiles, bool need_hidden_grad, bool need_weight_grad) {
    const at::ScalarType operands =
        at::promote_types(hidden.scalar_type(), lm_head_weight.scalar_type());
    LossGradients grads;
    if (need_hidden_grad) {
      grads.hidden = at::empty(hidden.sizes(), hidden.options().dtype(operands));  // [bs, T, h]
    }
    if (need_weight_grad) {
      const at::ScalarType sum_dtype = at::promote_types(operands, at::kFloat);
      grads.weight = at::zeros(lm_head_weight.sizes(),
                               lm_head_weight.options().dtype(sum_dtype));  // [V, h]
    }
    at::Tensor loss_sum = tiled_loss_and_gradients(hidden, lm_head_weight, labels, tiles, grads);
    if (grads.hidden.defined()) ctx->saved_data["grad_hidden"] = grads.hidden;
    if (grads.weight.defined()) ctx->saved_data["grad_weight"] = grads.weight;
    ctx->saved_data["hidden_dtype"] = hidden.scalar_type();
    ctx->saved_data["weight_dtype"] = lm_head_weight.scalar_type();
    ctx->saved_data["backward_done"] = false;
    return loss_sum;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    TORCH_CHECK(!ctx->saved_data["backward_done"].toBool(),
                "tiled_lm_loss_sum: backward can run only once (retain_graph is not supported)");
    ctx->saved_data["backward_done"] = true;
    const at::Tensor& scale = grad_outputs[0];  // [] d(outer loss) / d(loss sum)
    // Scales a kept gradient in place and hands it out, freeing it from the context at once.
    auto take = [&](const char* key, const char* dtype_key) {
      auto it = ctx->saved_data.find(key);
      if (it == ctx->saved_data.end()) return at::Tensor();
      at::Tensor g = it->second.toTensor();
      ctx->saved_data.erase(it);
      g.mul_(scale.to(g.scalar_type()));
      return g.to(ctx->saved_data[dtype_key].toScalarType());
    };
    at::Tensor grad_hidden = take("grad_hidden", "hidden_dtype");  // [bs, T, h]
    at::Tensor grad_weight = take("grad_weight", "weight_dtype");  // [V, h]
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

model::LossSum tiled_lm_loss_sum(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                                 const at::Tensor& labels, int64_t tiles) {
  TORCH_CHECK(hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
                  hidden.size(1) == labels.size(1) && hidden.size(1) >= 1,
              "tiled_lm_loss_sum: hidden ", hidden.sizes(), " does not match labels ",
              labels.sizes());
  TORCH_CHECK(lm_head_weight.dim() == 2 && lm_head_weight.size(1) == hidden.size(2),
              "tiled_lm_loss_sum: lm_head_weight ", lm_head_weight.sizes(),
              " does not match hidden ", hidden.sizes());
  TORCH_CHECK(tiles >= 1, "tiled_lm_loss_sum: tiles must be >= 1, got ", tiles);
  const bool grad_mode = at::GradMode::is_enabled();
  model::LossSum out;
  at::Tensor long_labels = labels.to(at::kLong);  // [bs, T]
  out.sum = TiledLogitsLossFunction::apply(hidden, lm_head_weight, long_labels, tiles,
                                           grad_mode && hidden.requires_grad(),
                                           grad_mode && lm_head_weight.requires_grad());
  out.count = long_labels.ne(model::kIgnoreLabel).sum();  // [] int64
  return out;
}

int64_t auto_loss_tiles(int64_t batch, int64_t local_seq_len, int64_t vocab_size) {
  TORCH_CHECK(batch >= 1 && local_seq_len >= 1 && vocab_size >= 1, "auto_loss_tiles: batch ", batch,
              ", local_seq_len ", local_seq_len, ", vocab_size ", vocab_size);
  const int64_t logits_bytes = batch * local_seq_len * vocab_size * 4;  // fp32 [bs*T, V]
  const int64_t tiles = (logits_bytes + kAutoLossTileBytes - 1) / kAutoLossTileBytes;
  return std::clamp<int64_t>(tiles, 1, local_seq_len);
}

int64_t resolve_loss_tiles(const config::TileCount& count, int64_t batch, int64_t local_seq_len,
                           int64_t vocab_size) {
  return count.is_auto() ? auto_loss_tiles(batch, local_seq_len, vocab_size) : count.value;
}

}  // namespace ulysses::sp
