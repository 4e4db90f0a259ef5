// The decoder of every supported family (Llama, Qwen2/2.5, Qwen3, Mistral: their differences are
// the flags of config/model_family.h) with HF module names, so named_parameters() yields
// "model.embed_tokens.weight", "model.layers.<i>.self_attn.q_proj.weight", ...,
// "model.norm.weight", "lm_head.weight" (absent with tie_embeddings) in HF's order.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>

#include "config/options.h"
#include "model/attention_core.h"
#include "model/llama_decoder_layer.h"
#include "model/plain_layers.h"
#include "model/rms_norm.h"
#include "model/rotary.h"

namespace ulysses::model {

// Runs one decoder layer; the default calls layer.forward. Memory features (activation
// checkpointing, offload) install their own to wrap each layer.
// x [bs, T, h]; cos/sin [bs, T, hd] -> [bs, T, h].
using LayerRunner = std::function<at::Tensor(LlamaDecoderLayerImpl& layer, const at::Tensor& x,
                                             const at::Tensor& cos, const at::Tensor& sin,
                                             const AttentionContext& ctx)>;

// HF LlamaModel: embed_tokens, layers, norm. RoPE tables are computed once per forward.
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const config::ModelOptions& options);

  // input_ids [bs, T] int64, position_ids [bs, T] int64 global positions -> [bs, T, h],
  // final-normed. Layer i sees ctx with layer_index = i, and run_core = ctx.run_core unless
  // skip_all_but_last is set, in which case only the last layer runs its core. Packed batches
  // without ctx.documents get block_diagonal_runs(ctx.doc_ids), found once for every layer
  // (sdpa_attention.h).
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids,
                     const AttentionContext& ctx);

  // The decoder layers alone (ZeRO stage 2/3 run the embedding and the final norm as their own
  // units): hidden [bs, T, h] (embedded), position_ids [bs, T] -> [bs, T, h], not normed.
  at::Tensor forward_layers(const at::Tensor& hidden, const at::Tensor& position_ids,
                            const AttentionContext& ctx);

  LlamaDecoderLayer layer(int64_t index) const;  // REQUIRES: 0 <= index < num_layers()
  int64_t num_layers() const { return static_cast<int64_t>(layers->size()); }
  const RotaryEmbedding& rotary() const { return rotary_; }

  Embedding embed_tokens{nullptr};        // weight [V, h]
  torch::nn::ModuleList layers{nullptr};  // L x LlamaDecoderLayer
  RMSNorm norm{nullptr};                  // weight [h]

  LayerRunner layer_runner;        // empty = layer.forward
  bool skip_all_but_last = false;  // attention.skip_all_but_last

 private:
  RotaryEmbedding rotary_;
};
TORCH_MODULE(LlamaModel);

// When a model's weights get their values: at construction (on CPU in fp32, from
// init_llama_weights), or later by materialize_weights (materialize.h), which puts them straight
// where they will live. A deferred model's weights are uninitialized host memory that nothing has
// touched, so that it takes no resident memory before materialize_weights replaces it. A
// shapes-only model's weights are placeholders (plain_layers.h ShapesOnlyScope) that take no
// memory at all: ZeRO-3's sharded build (zero_partition.h) gives each rank its shards only.
enum class WeightInit { kAtConstruction, kDeferred, kShapesOnly };

// HF LlamaForCausalLM: `model` and, unless tie_embeddings, `lm_head`. The LM head and loss are
// applied by the caller (lm_loss.h) from forward_hidden() and lm_head_weight(), so that they can be
// tiled. By default construction draws every weight on CPU in fp32 from init_llama_weights(seed =
// options.init_seed); move with .to(device, dtype) afterwards.
// Throws UserError("model.<field>: ...") for unusable shapes.
class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  // options.head_dim 0 means hidden_size / num_heads.
  explicit LlamaForCausalLMImpl(const config::ModelOptions& options,
                                WeightInit init = WeightInit::kAtConstruction);

  // input_ids [bs, T] int64, position_ids [bs, T] int64 -> final-normed hidden [bs, T, h].
  at::Tensor forward_hidden(const at::Tensor& input_ids, const at::Tensor& position_ids,
                            const AttentionContext& ctx);

  // The LM head weight [V, h]: lm_head.weight, or model.embed_tokens.weight when tied.
  at::Tensor lm_head_weight() const;

  // Every layer's attention uses `core` (REQUIRES: not null; shared by all layers).
  void set_attention_core(std::shared_ptr<AttentionCore> core);
  // The core of layer 0: the one set_attention_core installed in every layer.
  std::shared_ptr<AttentionCore> attention_core() const;
  // attention.skip_all_but_last: all but the last layer skip their attention core.
  void set_skip_all_but_last(bool skip) { model->skip_all_but_last = skip; }
  // Wraps every layer call (activation checkpointing); an empty runner restores the default.
  void set_layer_runner(LayerRunner runner) { model->layer_runner = std::move(runner); }
  // Runs every layer's MLP through `runner` (TiledMLP); an empty runner restores the default.
  void set_mlp_runner(const MlpRunner& runner);

  // The options with head_dim resolved.
  const config::ModelOptions& options() const { return options_; }

  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // weight [V, h]; null when tie_embeddings

 private:
  config::ModelOptions options_;
};
TORCH_MODULE(LlamaForCausalLM);

// Deterministic init: walks module.named_parameters() in order and fills every 2-D parameter
// (Linear/Embedding weight) with N(0, std) drawn in fp32, every bias with 0 and every other 1-D
// parameter (norm weight) with 1, as transformers initializes them, by init_weight_range
// (weight_init.h): same seed and shapes -> bit-identical weights on every rank and mesh, and equal
// to the shards a ZeRO-3 rank draws on its own. REQUIRES: parameters on CPU, fp32.
void init_llama_weights(torch::nn::Module& module, uint64_t seed, double std);

// Whether a parameter name ends in ".bias" (q/k/v projections of Qwen2).
bool is_bias(const std::string& parameter_name);

}  // namespace ulysses::model
