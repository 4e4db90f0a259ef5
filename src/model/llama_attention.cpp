// Llama self-attention: projections + RoPE around an AttentionCore (see llama_attention.h).
#include "model/llama_attention.h"

#include "common/error.h"
#include "config/model_family.h"
#include "model/rotary.h"

namespace ulysses::model {

int64_t resolved_head_dim(const config::ModelOptions& o) {
  if (o.head_dim > 0) return o.head_dim;
  return o.num_heads > 0 ? o.hidden_size / o.num_heads : 0;
}

LlamaAttentionImpl::LlamaAttentionImpl(const config::ModelOptions& o)
    : num_heads_(o.num_heads),
      num_kv_heads_(o.num_kv_heads),
      head_dim_(resolved_head_dim(o)),
      core_(std::make_shared<LocalAttentionCore>(AttentionBackend::kMath)) {
  if (num_heads_ <= 0) throw UserError("model.num_heads: must be > 0");
  if (num_kv_heads_ <= 0 || num_heads_ % num_kv_heads_ != 0) {
    throw UserError("model.num_kv_heads: must divide num_heads (" + std::to_string(num_heads_) +
                    "), got " + std::to_string(num_kv_heads_));
  }
  if (head_dim_ <= 0) throw UserError("model.head_dim: must be > 0");
  const config::ModelFamily family = config::model_family(o.family);
  const int64_t h = o.hidden_size;
  q_proj = register_module("q_proj", Linear(h, num_heads_ * head_dim_, family.qkv_bias));
  k_proj = register_module("k_proj", Linear(h, num_kv_heads_ * head_dim_, family.qkv_bias));
  v_proj = register_module("v_proj", Linear(h, num_kv_heads_ * head_dim_, family.qkv_bias));
  o_proj = register_module("o_proj", Linear(num_heads_ * head_dim_, h));
  if (family.qk_norm) {  // registered after the projections, as transformers' Qwen3Attention
    q_norm = register_module("q_norm", RMSNorm(head_dim_, o.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, o.rms_norm_eps));
  }
}

void LlamaAttentionImpl::set_core(std::shared_ptr<AttentionCore> core) {
  TORCH_CHECK(core != nullptr, "LlamaAttention::set_core: null core");
  core_ = std::move(core);
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                       const at::Tensor& sin, const AttentionContext& ctx) {
  const int64_t bs = x.size(0), tokens = x.size(1);
  at::Tensor q = q_proj(x).view({bs, tokens, num_heads_, head_dim_});     // [bs, T, hq, hd]
  at::Tensor k = k_proj(x).view({bs, tokens, num_kv_heads_, head_dim_});  // [bs, T, hkv, hd]
  at::Tensor v = v_proj(x).view({bs, tokens, num_kv_heads_, head_dim_});  // [bs, T, hkv, hd]
  if (q_norm) {
    q = q_norm(q);  // [bs, T, hq, hd]
    k = k_norm(k);  // [bs, T, hkv, hd]
  }
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  at::Tensor out = core_->forward(q, k, v, ctx);  // [bs, T, hq, hd]
  TORCH_CHECK(out.sizes() == q.sizes(), "attention core ", core_->name(), " returned ", out.sizes(),
              ", expected ", q.sizes());
  return o_proj(out.reshape({bs, tokens, num_heads_ * head_dim_}));  // [bs, T, h]
}

}  // namespace ulysses::model
