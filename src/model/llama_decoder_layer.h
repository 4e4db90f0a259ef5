// One Llama decoder layer, HF names: x + self_attn(input_layernorm(x)), then
// + mlp(post_attention_layernorm(.)). Registration order follows HF (self_attn, mlp, norms).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>

#include "config/options.h"
#include "model/llama_attention.h"
#include "model/llama_mlp.h"
#include "model/rms_norm.h"

namespace ulysses::model {

// Runs the MLP of a layer; the default calls mlp.forward. TiledMLP (src/sp/tiled_mlp.h) installs
// one that runs it over sequence tiles. x [bs, T, h] -> [bs, T, h]. The layer uses the result only
// in its last residual add, whose backward reads no values: inside a model::GraphOnlyForward a
// runner may return a tensor of the right shape whose graph gives the right gradients but whose
// values were not computed.
using MlpRunner = std::function<at::Tensor(LlamaMLPImpl& mlp, const at::Tensor& x)>;

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

  MlpRunner mlp_runner;  // empty = mlp->forward
};
TORCH_MODULE(LlamaDecoderLayer);

}  // namespace ulysses::model
