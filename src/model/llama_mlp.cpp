// SwiGLU MLP (see llama_mlp.h).
#include "model/llama_mlp.h"

#include <torch/autograd.h>

#include "kernels/fused_kernels.h"

namespace ulysses::model {
namespace {

// silu(gate) * up through the fused kernels: saves gate and up only (the ATen ops save silu's
// output besides), the backward one kernel for both gradients. gate, up [..., ffn] -> [..., ffn]
struct FusedSwigluFunction : public torch::autograd::Function<FusedSwigluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return kernels::swiglu_forward(gate, up);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    kernels::SwigluGrads g = kernels::swiglu_backward(grads[0], saved[0], saved[1]);
    return {g.grad_gate, g.grad_up};
  }
};

bool half_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

}  // namespace

LlamaMLPImpl::LlamaMLPImpl(const config::ModelOptions& o) : fused_kernels(o.fused_kernels) {
  const int64_t h = o.hidden_size, ffn = o.intermediate_size;
  gate_proj = register_module("gate_proj", Linear(h, ffn));
  up_proj = register_module("up_proj", Linear(h, ffn));
  down_proj = register_module("down_proj", Linear(ffn, h));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  if (!fused_kernels) return down_proj(at::silu(gate_proj(x)) * up_proj(x));  // [..., h]
  const at::Tensor gate = gate_proj(x), up = up_proj(x);                   // [..., ffn]
  if (half_dtype(gate) && kernels::swiglu_fusable(gate, up)) {
    return down_proj(FusedSwigluFunction::apply(gate, up));
  }
  return down_proj(at::silu(gate) * up);
}

}  // namespace ulysses::model
