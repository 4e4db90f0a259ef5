// One Llama decoder layer, HF names: x + self_attn(input_layernorm(x)), then
// + mlp(post_attention_layernorm(.)). Registration order follows HF (self_attn, mlp, norms).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "config/options.h"
#include "model/llama_attention.h"
#include "model/llama_mlp.h"
#include "model/rms_norm.h"

namespace ulysses::model {

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const config::ModelOptions& options);

  // x [bs, T, h]; cos/sin [bs, T, hd] -> [bs, T, h].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const AttentionContext& ctx);

  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr};           // weight [h]
  RMSNorm post_attention_layernorm{nullptr};  // weight [h]
};
TORCH_MODULE(LlamaDecoderLayer);

}  // namespace ulysses::model
