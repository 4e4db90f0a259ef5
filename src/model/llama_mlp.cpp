// SwiGLU MLP (see llama_mlp.h).
#include "model/llama_mlp.h"

#include "kernels/swiglu.h"

namespace ulysses::model {

LlamaMLPImpl::LlamaMLPImpl(const config::ModelOptions& o) : fused_kernels(o.fused_kernels) {
  const int64_t h = o.hidden_size, ffn = o.intermediate_size;
  gate_proj = register_module("gate_proj", Linear(h, ffn));
  up_proj = register_module("up_proj", Linear(h, ffn));
  down_proj = register_module("down_proj", Linear(ffn, h));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return down_proj(kernels::swiglu(gate_proj(x), up_proj(x), fused_kernels));  // [..., h]
}

}  // namespace ulysses::model
