// SwiGLU MLP of a Llama decoder layer, HF names gate_proj/up_proj/down_proj, no biases:
// down_proj(silu(gate_proj(x)) * up_proj(x)).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "config/options.h"
#include "model/plain_layers.h"

namespace ulysses::model {

class LlamaMLPImpl : public torch::nn::Module {
 public:
  // Shapes from options.hidden_size (h) and options.intermediate_size (ffn).
  explicit LlamaMLPImpl(const config::ModelOptions& options);

  // x [..., h] -> [..., h]. Row-wise independent, so it may be applied to any tile of tokens.
  at::Tensor forward(const at::Tensor& x);

  Linear gate_proj{nullptr};  // weight [ffn, h]
  Linear up_proj{nullptr};    // weight [ffn, h]
  Linear down_proj{nullptr};  // weight [h, ffn]
};
TORCH_MODULE(LlamaMLP);

}  // namespace ulysses::model
