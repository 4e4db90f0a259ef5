// Llama decoder layer (see llama_decoder_layer.h).
#include "model/llama_decoder_layer.h"

namespace ulysses::model {

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const config::ModelOptions& o) {
  // HF registers self_attn, mlp, input_layernorm, post_attention_layernorm in this order.
  self_attn = register_module("self_attn", LlamaAttention(o));
  mlp = register_module("mlp", LlamaMLP(o));
  input_layernorm = register_module(
      "input_layernorm", RMSNorm(o.hidden_size, o.rms_norm_eps, o.fused_kernels));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", RMSNorm(o.hidden_size, o.rms_norm_eps, o.fused_kernels));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                          const at::Tensor& sin, const AttentionContext& ctx) {
  at::Tensor hidden = x + self_attn->forward(input_layernorm(x), cos, sin, ctx);  // [bs, T, h]
  at::Tensor normed = post_attention_layernorm(hidden);                           // [bs, T, h]
  return hidden + (mlp_runner ? mlp_runner(*mlp, normed) : mlp(normed));          // [bs, T, h]
}

}  // namespace ulysses::model
