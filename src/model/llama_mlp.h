// SwiGLU MLP of a Llama decoder layer, HF names gate_proj/up_proj/down_proj, no biases:
// down_proj(silu(gate_proj(x)) * up_proj(x)). With model.fused_kernels, silu(gate) * up runs as
// one fused CUDA kernel (and its backward as one) where the tensors allow.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "config/options.h"
#include "model/plain_layers.h"

namespace ulysses::model {

class LlamaMLPImpl : public torch::nn::Module {
 public:
  // Shapes from options.hidden_size (h) and options.intermediate_size (ffn); the fused SwiGLU
  // kernels where options.fused_kernels and kernels::swiglu_uses_kernels hold (kernels/swiglu.h).
  explicit LlamaMLPImpl(const config::ModelOptions& options);

  // x [..., h] -> [..., h]. Row-wise independent, so it may be applied to any tile of tokens.
  at::Tensor forward(const at::Tensor& x);

  Linear gate_proj{nullptr};  // weight [ffn, h]
  Linear up_proj{nullptr};    // weight [ffn, h]
  Linear down_proj{nullptr};  // weight [h, ffn]
  bool fused_kernels = false;
};
TORCH_MODULE(LlamaMLP);

}  // namespace ulysses::model
