// SwiGLU's autograd op and its ATen path, the fused kernels' predicate (see swiglu.h); the kernels
// are in swiglu_cuda.cu, and in a build without them their entry points here refuse to run.
#include "kernels/swiglu.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <cstdint>

#include "kernels/fused_kernels.h"
#include "kernels/tensor_checks.h"

namespace ulysses::kernels {
namespace {

// silu(gate) * up through the fused kernels: saves gate and up only (the ATen ops save silu's
// output besides), the backward one kernel for both gradients. gate, up [..., ffn] -> [..., ffn]
struct FusedSwigluFunction : public torch::autograd::Function<FusedSwigluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swiglu_forward(gate, up);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    SwigluGrads g = swiglu_backward(grads[0], saved[0], saved[1]);
    return {g.grad_gate, g.grad_up};
  }
};

}  // namespace

bool swiglu_uses_kernels(bool fused, const at::Tensor& gate, const at::Tensor& up) {
  return fused && is_half_dtype(gate.scalar_type()) && swiglu_fusable(gate, up);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  if (swiglu_uses_kernels(fused, gate, up)) return FusedSwigluFunction::apply(gate, up);
  return at::silu(gate) * up;
}

bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up) {
  if (!fused_kernels_built() || !gate.defined() || !up.defined()) return false;
  if (!gate.is_cuda() || up.device() != gate.device()) return false;
  if (!kernel_dtype(gate.scalar_type()) || up.scalar_type() != gate.scalar_type()) return false;
  if (gate.sizes() != up.sizes() || gate.numel() == 0) return false;
  return gate.is_contiguous() && up.is_contiguous();
}

#ifndef ULYSSES_FUSED_KERNELS
at::Tensor swiglu_forward(const at::Tensor&, const at::Tensor&) {
  refuse_without_kernels("swiglu_forward");
}

SwigluGrads swiglu_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  refuse_without_kernels("swiglu_backward");
}
#endif

}  // namespace ulysses::kernels
