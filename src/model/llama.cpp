// Llama-family decoder and its deterministic init (see llama.h).
#include "model/llama.h"

#include <optional>

#include "common/error.h"
#include "kernels/fused_kernels.h"
#include "model/plain_layers.h"
#include "model/sdpa_attention.h"
#include "model/weight_init.h"

namespace ulysses::model {
namespace {

config::ModelOptions checked_options(config::ModelOptions o) {
  auto positive = [](int64_t value, const char* key) {
    if (value <= 0) {
      throw UserError(std::string("model.") + key + ": must be > 0, got " + std::to_string(value));
    }
  };
  positive(o.hidden_size, "hidden_size");
  positive(o.num_layers, "num_layers");
  positive(o.num_heads, "num_heads");
  positive(o.num_kv_heads, "num_kv_heads");
  positive(o.intermediate_size, "intermediate_size");
  positive(o.vocab_size, "vocab_size");
  if (!(o.rms_norm_eps > 0)) throw UserError("model.rms_norm_eps: must be > 0");
  if (!(o.init_std >= 0)) throw UserError("model.init_std: must be >= 0");
  if (o.fused_kernels && !kernels::fused_kernels_built()) {
    throw UserError(
        "model.fused_kernels: true needs a build with the fused CUDA kernels (a CUDA LibTorch "
        "and nvcc); this one has none");
  }
  o.head_dim = resolved_head_dim(o);
  return o;
}

}  // namespace

LlamaModelImpl::LlamaModelImpl(const config::ModelOptions& o) : rotary_(o) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) layers->push_back(LlamaDecoderLayer(o));
  norm = register_module("norm", RMSNorm(o.hidden_size, o.rms_norm_eps, o.fused_kernels));
}

LlamaDecoderLayer LlamaModelImpl::layer(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < num_layers(), "layer ", index, " out of range");
  return LlamaDecoderLayer(layers->ptr<LlamaDecoderLayerImpl>(static_cast<size_t>(index)));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                   const AttentionContext& ctx) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.sizes() == position_ids.sizes(),
              "LlamaModel: input_ids ", input_ids.sizes(), " and position_ids ",
              position_ids.sizes(), " must both be [bs, T]");
  return norm(forward_layers(embed_tokens(input_ids), position_ids, ctx));  // [bs, T, h]
}

at::Tensor LlamaModelImpl::forward_layers(const at::Tensor& embedded,
                                          const at::Tensor& position_ids,
                                          const AttentionContext& ctx) {
  at::Tensor hidden = embedded;                        // [bs, T, h]
  RotaryCosSin rope = rotary_.forward(position_ids);   // [bs, T, hd] fp32
  at::Tensor cos = rope.cos.to(hidden.scalar_type());  // [bs, T, hd]
  at::Tensor sin = rope.sin.to(hidden.scalar_type());  // [bs, T, hd]
  // Packed documents: found once per forward when the caller has no host runs, so that no layer
  // reads doc_ids back from the device.
  AttentionContext shared = ctx;
  if (shared.documents == nullptr) shared.documents = block_diagonal_runs(ctx.doc_ids);
  const int64_t count = num_layers();
  for (int64_t i = 0; i < count; ++i) {
    AttentionContext layer_ctx = shared;
    layer_ctx.layer_index = i;
    layer_ctx.run_core = ctx.run_core && (!skip_all_but_last || i == count - 1);
    LlamaDecoderLayer current = layer(i);
    hidden = layer_runner ? layer_runner(*current, hidden, cos, sin, layer_ctx)
                          : current->forward(hidden, cos, sin, layer_ctx);
  }
  return hidden;  // [bs, T, h]
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const config::ModelOptions& options, WeightInit init)
    : options_(checked_options(options)) {
  std::optional<ShapesOnlyScope> shapes_only;
  if (init == WeightInit::kShapesOnly) shapes_only.emplace();
  model = register_module("model", LlamaModel(options_));
  if (!options_.tie_embeddings) {
    lm_head = register_module("lm_head", Linear(options_.hidden_size, options_.vocab_size));
  }
  if (init == WeightInit::kAtConstruction) {
    init_llama_weights(*this, options_.init_seed, options_.init_std);
  }
}

at::Tensor LlamaForCausalLMImpl::forward_hidden(const at::Tensor& input_ids,
                                                const at::Tensor& position_ids,
                                                const AttentionContext& ctx) {
  return model->forward(input_ids, position_ids, ctx);
}

at::Tensor LlamaForCausalLMImpl::lm_head_weight() const {
  return options_.tie_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

void LlamaForCausalLMImpl::set_attention_core(std::shared_ptr<AttentionCore> core) {
  TORCH_CHECK(core != nullptr, "set_attention_core: null core");
  for (int64_t i = 0; i < model->num_layers(); ++i) model->layer(i)->self_attn->set_core(core);
}

void LlamaForCausalLMImpl::set_mlp_runner(const MlpRunner& runner) {
  for (int64_t i = 0; i < model->num_layers(); ++i) model->layer(i)->mlp_runner = runner;
}

std::shared_ptr<AttentionCore> LlamaForCausalLMImpl::attention_core() const {
  return model->layer(0)->self_attn->core();
}

void init_llama_weights(torch::nn::Module& module, uint64_t seed, double std) {
  torch::NoGradGuard no_grad;
  size_t index = 0;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor& p = item.value();
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == at::kFloat && p.is_contiguous(),
                "init_llama_weights: ", item.key(), " must be CPU fp32 (init before .to())");
    init_weight_range(index++, item.key(), p.sizes(), seed, std, 0, p.view({-1}));
  }
}

bool is_bias(const std::string& parameter_name) {
  const std::string suffix = ".bias";
  return parameter_name.size() >= suffix.size() &&
         parameter_name.compare(parameter_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace ulysses::model
