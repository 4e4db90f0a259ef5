// One varlen flash-attention launch per call for packed documents (see varlen_flash_attention.h).
// The ATen ops are declared in every LibTorch build and implemented for CUDA only, so this file
// compiles everywhere and runs only where varlen_flash_applies.
#include "model/varlen_flash_attention.h"

#include <torch/autograd.h>

#include <algorithm>
#include <cmath>

namespace ulysses::model {
namespace {

// Flat-sequence offsets [runs + 1] int32 on the host: the start of every document of every sample
// in the [bs * sl] token order, then bs * sl. Also the longest run.
std::pair<at::Tensor, int64_t> cumulative_offsets(const DocumentRuns& documents, int64_t sl) {
  int64_t count = 0;
  for (const auto& sample : documents) count += static_cast<int64_t>(sample.size());
  at::Tensor offsets = at::empty({count + 1}, at::TensorOptions(at::kInt));
  int32_t* out = offsets.data_ptr<int32_t>();
  int64_t longest = 0, end = 0;
  for (size_t b = 0; b < documents.size(); ++b) {
    for (const auto& [start, length] : documents[b]) {
      const int64_t flat = static_cast<int64_t>(b) * sl + start;
      TORCH_CHECK(flat == end, "varlen_flash_attention: the runs of sample ", b,
                  " do not cover the sequence in order (run at ", start, ")");
      *out++ = static_cast<int32_t>(flat);
      end = flat + length;
      longest = std::max(longest, length);
    }
  }
  TORCH_CHECK(end == static_cast<int64_t>(documents.size()) * sl,
              "varlen_flash_attention: the runs end at ", end, ", not at bs * sl");
  *out = static_cast<int32_t>(end);
  return {offsets, longest};
}

// q [N, hq, hd], k/v [N, hkv, hd] (N = bs * sl, contiguous), offsets [runs + 1] int32 on q's
// device -> [N, hq, hd]. Saves what the flash backward kernel reads: q, k, v, the output, its
// log-sum-exp and the kernel's RNG state (unused without dropout).
struct VarlenFlashFunction : public torch::autograd::Function<VarlenFlashFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& offsets,
                            int64_t longest, double scale) {
    auto [out, logsumexp, rng_state, unused, debug_mask] = at::_flash_attention_forward(
        q, k, v, offsets, offsets, longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false, std::optional<double>(scale));
    ctx->save_for_backward({q, k, v, out, logsumexp, offsets, rng_state, unused});
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    auto [dq, dk, dv] = at::_flash_attention_backward(
        grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
        saved[5], longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true, saved[6], saved[7],
        std::optional<double>(scale));
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool varlen_flash_applies(const at::Tensor& q, const at::Tensor& k, const DocumentRuns& documents) {
  const int64_t hd = q.size(3);
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  return q.is_cuda() && half && hd % 8 == 0 && hd <= 256 && q.size(2) % k.size(2) == 0 &&
         !documents.empty() && static_cast<int64_t>(documents.size()) == q.size(0);
}

at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const DocumentRuns& documents) {
  TORCH_CHECK(varlen_flash_applies(q, k, documents),
              "varlen_flash_attention: needs CUDA fp16/bf16 q with hd % 8 == 0, hd <= 256");
  const int64_t bs = q.size(0), sl = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2);
  auto [host_offsets, longest] = cumulative_offsets(documents, sl);
  const at::Tensor offsets =
      host_offsets.pin_memory().to(q.device(), /*non_blocking=*/true);  // [runs + 1] int32
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor out = VarlenFlashFunction::apply(
      q.reshape({bs * sl, hq, hd}).contiguous(), k.reshape({bs * sl, hkv, hd}).contiguous(),
      v.reshape({bs * sl, hkv, hd}).contiguous(), offsets, longest, scale);  // [bs * sl, hq, hd]
  return out.view({bs, sl, hq, hd});
}

}  // namespace ulysses::model
