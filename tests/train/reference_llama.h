// An independent reference for the equivalence tests: the loss and every gradient of one global
// batch, computed from the model's weights with plain ATen ops in fp64 (embedding, RMSNorm, RoPE,
// causal softmax attention with GQA and document masks, SwiGLU MLP, LM head, at::cross_entropy_loss
// with mean reduction and ignore_index -100, backward). No project code sits between the weights
// and the gradients, so a bug shared by every mesh's compute_gradients (loss scaling, RoPE,
// masking, GQA grouping) shows here. The families' additions follow transformers' modeling files:
// Qwen2 adds biases to q_proj, k_proj and v_proj (Qwen2Attention); Qwen3 applies an RMSNorm over
// hd to each query and key head after the projection and before RoPE (Qwen3Attention.q_norm,
// k_norm), and its hq * hd need not equal h. Which family has which is written here, not read from
// config/model_family.h, so a wrong flag in the project's table shows as a missing or unexpected
// weight.
#pragma once
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "config/options.h"

namespace ulysses::testing {

struct ReferenceResult {
  double loss = 0.0;         // mean cross-entropy over labels != -100
  int64_t valid_tokens = 0;  // labels != -100
  std::map<std::string, at::Tensor> grads;  // HF parameter name -> gradient, fp64
};

namespace reference_detail {

// x [..., h] fp64, weight [h] -> weight * x / sqrt(mean(x^2) + eps)
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return weight * (x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps));
}

// HF rotate_half convention. x [bs, sl, heads, hd], cos/sin [bs, sl, hd] -> [bs, sl, heads, hd]
inline at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2);
}

// What a family adds to the Llama block, as transformers' classes define it.
struct FamilyTerms {
  bool qkv_bias = false;  // Qwen2: q_proj, k_proj, v_proj have biases (o_proj has none)
  bool qk_norm = false;   // Qwen3: RMSNorm over hd of each q and k head, before RoPE
};

inline FamilyTerms family_terms(const std::string& family) {
  if (family == "llama" || family == "mistral") return {};
  if (family == "qwen2") return {.qkv_bias = true, .qk_norm = false};
  TORCH_CHECK(family == "qwen3", "reference: unknown model family '", family, "'");
  return {.qkv_bias = false, .qk_norm = true};
}

}  // namespace reference_detail

// The loss and gradients of one process holding the whole global batch.
//   weights: every parameter by HF name (any float dtype; copied to fp64 leaves here)
//   input_ids, labels, position_ids [bs, sl] int64; doc_ids [bs, sl] int64 or undefined
// REQUIRES: options.head_dim resolved (> 0), rope_scaling_type "" (no llama3 scaling here),
// sliding_window 0 or >= sl (no window is applied here). `weights` holds the family's parameters by
// transformers' names: a missing one throws; an extra one comes back with an undefined gradient.
inline ReferenceResult reference_loss_and_gradients(
    const config::ModelOptions& options, const std::map<std::string, at::Tensor>& weights,
    const at::Tensor& input_ids, const at::Tensor& labels, const at::Tensor& position_ids,
    const at::Tensor& doc_ids) {
  namespace rd = reference_detail;
  TORCH_CHECK(options.head_dim > 0 && options.rope_scaling_type.empty(),
              "reference: needs an explicit head_dim and no RoPE scaling");
  torch::AutoGradMode grad_mode(true);
  std::map<std::string, at::Tensor> w;  // fp64 leaves
  for (const auto& [name, t] : weights) {
    w[name] = t.detach().to(at::kDouble).clone().requires_grad_(true);
  }
  const int64_t bs = input_ids.size(0), sl = input_ids.size(1);
  const int64_t hq = options.num_heads, hkv = options.num_kv_heads, hd = options.head_dim;
  TORCH_CHECK(options.sliding_window == 0 || options.sliding_window >= sl,
              "reference: a sliding window shorter than the sequence is not modelled");
  const rd::FamilyTerms family = rd::family_terms(options.family);
  // x [bs, sl, h] -> [bs, sl, heads, hd]: the projection `name` (with its bias in Qwen2), then
  // (Qwen3, q and k only) the per-head RMSNorm `norm`.
  auto project = [&](const at::Tensor& x, const std::string& p, const std::string& name,
                     int64_t heads, const char* norm) {
    const std::string proj = p + "self_attn." + name;
    at::Tensor bias = family.qkv_bias ? w.at(proj + ".bias") : at::Tensor();
    at::Tensor out = at::linear(x, w.at(proj + ".weight"), bias).view({bs, sl, heads, hd});
    if (family.qk_norm && norm != nullptr) {
      out = rd::rms_norm(out, w.at(p + "self_attn." + norm + ".weight"), options.rms_norm_eps);
    }
    return out;
  };

  // RoPE tables from the positions: angle = position * theta^(-2i/hd), duplicated over halves.
  at::Tensor inv_freq = at::pow(options.rope_theta, -at::arange(0, hd, 2, at::kDouble) / hd);
  at::Tensor angles = position_ids.to(at::kDouble).unsqueeze(-1) * inv_freq;  // [bs, sl, hd/2]
  at::Tensor emb = at::cat({angles, angles}, -1);                             // [bs, sl, hd]
  at::Tensor cos = emb.cos(), sin = emb.sin();

  // May attend: j <= i and (packed) same document. [bs, 1, sl, sl]
  at::Tensor allowed = at::ones({sl, sl}, at::kBool).tril().expand({bs, sl, sl});
  if (doc_ids.defined()) {
    allowed = allowed.logical_and(doc_ids.unsqueeze(2).eq(doc_ids.unsqueeze(1)));
  }
  allowed = allowed.unsqueeze(1);

  at::Tensor x = at::embedding(w.at("model.embed_tokens.weight"), input_ids);  // [bs, sl, h]
  for (int64_t layer = 0; layer < options.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    at::Tensor h = rd::rms_norm(x, w.at(p + "input_layernorm.weight"), options.rms_norm_eps);
    at::Tensor q = project(h, p, "q_proj", hq, "q_norm");   // [bs, sl, hq, hd]
    at::Tensor k = project(h, p, "k_proj", hkv, "k_norm");  // [bs, sl, hkv, hd]
    at::Tensor v = project(h, p, "v_proj", hkv, nullptr);   // [bs, sl, hkv, hd]
    q = rd::rope(q, cos, sin);
    k = rd::rope(k, cos, sin);
    // GQA: query head i reads kv head i / (hq / hkv).
    k = k.repeat_interleave(hq / hkv, 2);
    v = v.repeat_interleave(hq / hkv, 2);
    at::Tensor scores = at::matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-1, -2)) /
                        std::sqrt(static_cast<double>(hd));  // [bs, hq, sl, sl]
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    at::Tensor attn = at::matmul(at::softmax(scores, -1), v.transpose(1, 2));  // [bs, hq, sl, hd]
    attn = attn.transpose(1, 2).reshape({bs, sl, hq * hd});
    x = x + at::linear(attn, w.at(p + "self_attn.o_proj.weight"));
    h = rd::rms_norm(x, w.at(p + "post_attention_layernorm.weight"), options.rms_norm_eps);
    at::Tensor mlp = at::silu(at::linear(h, w.at(p + "mlp.gate_proj.weight"))) *
                     at::linear(h, w.at(p + "mlp.up_proj.weight"));
    x = x + at::linear(mlp, w.at(p + "mlp.down_proj.weight"));
  }
  x = rd::rms_norm(x, w.at("model.norm.weight"), options.rms_norm_eps);
  const at::Tensor& head =
      options.tie_embeddings ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight");
  at::Tensor logits = at::linear(x, head);  // [bs, sl, V]
  at::Tensor loss = at::cross_entropy_loss(logits.view({bs * sl, -1}), labels.reshape({-1}), {},
                                           at::Reduction::Mean, /*ignore_index=*/-100);
  loss.backward();

  ReferenceResult out;
  out.loss = loss.item<double>();
  out.valid_tokens = labels.ne(-100).sum().item<int64_t>();
  for (const auto& [name, t] : w) out.grads[name] = t.grad();
  return out;
}

}  // namespace ulysses::testing
