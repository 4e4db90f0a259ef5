// Self-attention of a Llama decoder layer with HF names q_proj/k_proj/v_proj/o_proj (no biases):
// projections and RoPE here, softmax(QK^T)V behind an AttentionCore (local or Ulysses SP).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "config/options.h"
#include "model/attention_core.h"
#include "model/plain_layers.h"

namespace ulysses::model {

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  // Shapes from options: h, hq = num_heads, hkv = num_kv_heads, hd = head_dim (0 = h / hq).
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

  Linear q_proj{nullptr};  // weight [hq*hd, h]
  Linear k_proj{nullptr};  // weight [hkv*hd, h]
  Linear v_proj{nullptr};  // weight [hkv*hd, h]
  Linear o_proj{nullptr};  // weight [h, hq*hd]

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  std::shared_ptr<AttentionCore> core_;
};
TORCH_MODULE(LlamaAttention);

// hd: options.head_dim, or hidden_size / num_heads when 0.
int64_t resolved_head_dim(const config::ModelOptions& options);

}  // namespace ulysses::model
