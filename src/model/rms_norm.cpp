// RMSNorm (see rms_norm.h).
#include "model/rms_norm.h"

#include <torch/autograd.h>

#include "kernels/fused_kernels.h"
#include "model/plain_layers.h"

namespace ulysses::model {
namespace {

bool is_half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// x [..., h] in the compute dtype: fp32 for fp16/bf16 inputs, the input's dtype otherwise.
at::Tensor in_compute_dtype(const at::Tensor& x) {
  return is_half(x.scalar_type()) ? x.to(at::kFloat) : x;
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
// (kernels::rms_norm_forward/backward; their 1/rms is [rows] rather than [..., 1]).
struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps, bool fused) {
    ctx->saved_data["fused"] = fused;
    if (fused) {
      kernels::RmsNormOutput out = kernels::rms_norm_forward(x, weight, eps);
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
      kernels::RmsNormGrads fused = kernels::rms_norm_backward(
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

RMSNormImpl::RMSNormImpl(int64_t hidden_size, double eps_value, bool fused)
    : eps(eps_value), fused_kernels(fused) {
  TORCH_CHECK(hidden_size > 0 && eps_value > 0, "RMSNorm: hidden_size and eps must be positive");
  at::Tensor ones = new_parameter({hidden_size});
  if (!ShapesOnlyScope::active()) ones.fill_(1.0);
  weight = register_parameter("weight", ones);
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const bool fused = fused_kernels && kernels::rms_norm_fusable(x, weight) &&
                     (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
  return RmsNormFunction::apply(x, weight, eps, fused);
}

}  // namespace ulysses::model
