// RMSNorm's autograd op and its ATen path, the fused kernels' row plan and predicate (see
// rms_norm.h); the kernels are in rms_norm_cuda.cu, and in a build without them their entry
// points here refuse to run.
#include "kernels/rms_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>

#include "kernels/fused_kernels.h"
#include "kernels/tensor_checks.h"

namespace ulysses::kernels {
namespace {

constexpr int64_t kMaxThreads = 512;     // the kernels' __launch_bounds__
constexpr int64_t kMaxRowElements = 32;  // iters * vec: registers per array and thread

// x [..., h] in the compute dtype: fp32 for fp16/bf16 inputs, the input's dtype otherwise.
at::Tensor in_compute_dtype(const at::Tensor& x) {
  return is_half_dtype(x.scalar_type()) ? x.to(at::kFloat) : x;
}

// The normalized input in x's dtype, as HF: normalized in the compute dtype, then cast back.
at::Tensor normalized(const at::Tensor& xc, const at::Tensor& inv_rms, at::ScalarType dtype) {
  return (xc * inv_rms).to(dtype);
}

// y = weight * normalized(x) with a backward of its own, so that the graph saves only x (its
// dtype), the weight and 1/rms [..., 1] in the compute dtype: the composed ops would save an fp32
// copy of a bf16 x and the normalized x besides. The backward recomputes what it needs from those
// and rounds where autograd through the composed ops rounds: the gradient of the normalized x in
// x's dtype, the gradient of x once at the end. fused: the fused CUDA kernels compute the same
// (rms_norm_forward/backward; their 1/rms is [rows] rather than [..., 1]).
struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps, bool fused) {
    ctx->saved_data["fused"] = fused;
    if (fused) {
      RmsNormOutput out = rms_norm_forward(x, weight, eps);
      ctx->save_for_backward({x, weight, out.inv_rms});
      return out.y;
    }
    const at::Tensor xc = in_compute_dtype(x);                                       // [..., h]
    const at::Tensor inv_rms = at::rsqrt(xc.pow(2).mean(-1, /*keepdim=*/true) + eps);  // [..., 1]
    ctx->save_for_backward({x, weight, inv_rms});
    return weight * normalized(xc, inv_rms, x.scalar_type());
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& inv_rms = saved[2];
    const at::Tensor& grad = grads[0];  // [..., h], the output's dtype
    if (ctx->saved_data["fused"].toBool()) {
      RmsNormGrads fused = rms_norm_backward(
          grad, x, weight, inv_rms, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
      return {fused.grad_x, fused.grad_weight, at::Tensor(), at::Tensor()};
    }
    const at::Tensor xc = in_compute_dtype(x);
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(1)) {
      grad_weight = (grad * normalized(xc, inv_rms, x.scalar_type()))
                        .sum_to_size(weight.sizes())
                        .to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      // d normalized, rounded to x's dtype as the cast's input; then through xc * inv_rms with
      // inv_rms = (mean(xc^2) + eps)^-1/2:
      // d xc = inv_rms * g - xc * inv_rms^3 * mean(g * xc).
      const at::Tensor g = in_compute_dtype((grad * weight).to(x.scalar_type()));  // [..., h]
      const at::Tensor mean_gx = (g * xc).mean(-1, /*keepdim=*/true);               // [..., 1]
      grad_x = (inv_rms * g - xc * (inv_rms.pow(3) * mean_gx)).to(x.scalar_type());
    }
    return {grad_x, grad_weight, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool fused) {
  const bool use_kernels = fused && is_half_dtype(x.scalar_type()) && rms_norm_fusable(x, weight);
  return RmsNormFunction::apply(x, weight, eps, use_kernels);
}

RowPlan rms_norm_row_plan(int64_t h, int64_t element_size, bool aligned) {
  TORCH_CHECK(h >= 1 && (element_size == 2 || element_size == 4),
              "rms_norm_row_plan: h ", h, ", element size ", element_size);
  const int64_t full_vec = 16 / element_size;
  const int64_t vec = (aligned && h % full_vec == 0) ? full_vec : 1;
  const int64_t loads = h / vec;                                     // per row
  const int64_t threads = std::min(kMaxThreads, (loads + 31) / 32 * 32);
  const int64_t needed = (loads + threads - 1) / threads;            // loads per thread
  RowPlan plan;
  plan.vec = static_cast<int>(vec);
  plan.threads = static_cast<int>(threads);
  for (int64_t iters = 1; iters <= 8 && iters * vec <= kMaxRowElements; iters *= 2) {
    if (iters >= needed) {
      plan.iters = static_cast<int>(iters);
      break;
    }
  }
  return plan;
}

bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight) {
  if (!fused_kernels_built() || !x.defined() || !weight.defined()) return false;
  if (!x.is_cuda() || weight.device() != x.device()) return false;
  if (!kernel_dtype(x.scalar_type()) || weight.scalar_type() != x.scalar_type()) return false;
  if (x.dim() < 1 || weight.dim() != 1 || x.size(-1) != weight.size(0) || x.numel() == 0) {
    return false;
  }
  if (!x.is_contiguous() || !weight.is_contiguous()) return false;
  return rms_norm_plan(x, weight).supported();
}

RowPlan rms_norm_plan(const at::Tensor& x, const at::Tensor& weight) {
  return rms_norm_row_plan(x.size(-1), x.element_size(), aligned16(x) && aligned16(weight));
}

#ifndef ULYSSES_FUSED_KERNELS
RmsNormOutput rms_norm_forward(const at::Tensor&, const at::Tensor&, double) {
  refuse_without_kernels("rms_norm_forward");
}

RmsNormGrads rms_norm_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, bool, bool) {
  refuse_without_kernels("rms_norm_backward");
}
#endif

}  // namespace ulysses::kernels
