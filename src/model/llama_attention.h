// Self-attention of a decoder layer with HF names q_proj/k_proj/v_proj/o_proj (q/k/v biases in
// Qwen2) and q_norm/k_norm (Qwen3): projections, norms and RoPE here, softmax(QK^T)V behind an
// AttentionCore (local or Ulysses SP).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "config/options.h"
#include "model/attention_core.h"
#include "model/plain_layers.h"
#include "model/rms_norm.h"

namespace ulysses::model {

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  // Shapes from options: h, hq = num_heads, hkv = num_kv_heads, hd = head_dim (0 = h / hq); the
  // family (config/model_family.h) says whether q/k/v have biases and q/k heads are normalized.
  // The core starts as a LocalAttentionCore(kMath).
  explicit LlamaAttentionImpl(const config::ModelOptions& options);

  // x [bs, T, h]; cos/sin [bs, T, hd] for the tokens' global positions -> [bs, T, h].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const AttentionContext& ctx);

  // REQUIRES: core != nullptr. Shared: the same core may serve every layer.
  void set_core(std::shared_ptr<AttentionCore> core);
  const std::shared_ptr<AttentionCore>& core() const { return core_; }

  int64_t num_heads() const { return num_heads_; }        // hq
  int64_t num_kv_heads() const { return num_kv_heads_; }  // hkv
  int64_t head_dim() const { return head_dim_; }          // hd

  Linear q_proj{nullptr};  // weight [hq*hd, h], bias [hq*hd] (qkv_bias)
  Linear k_proj{nullptr};  // weight [hkv*hd, h], bias [hkv*hd] (qkv_bias)
  Linear v_proj{nullptr};  // weight [hkv*hd, h], bias [hkv*hd] (qkv_bias)
  Linear o_proj{nullptr};  // weight [h, hq*hd]
  RMSNorm q_norm{nullptr};  // weight [hd]; null unless qk_norm (over each query head, before RoPE)
  RMSNorm k_norm{nullptr};  // weight [hd]; null unless qk_norm (over each key head, before RoPE)

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  std::shared_ptr<AttentionCore> core_;
};
TORCH_MODULE(LlamaAttention);

// hd: options.head_dim, or hidden_size / num_heads when 0.
int64_t resolved_head_dim(const config::ModelOptions& options);

}  // namespace ulysses::model
