// NVTX ranges and timers inside the model: one "layer" range per decoder layer
// call (payload = layer index), one "mlp" phase (compute) per MLP call, and an "attention" phase
// around a local (non-SP) attention core, installed as wrappers around the model's layer and MLP
// runners and its attention core. (Ulysses attention times its own core, between its
// all-to-alls.) The one profile header that sees the model: only the trainer includes it.
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "model/llama.h"
#include "profile/phase_timer.h"

namespace ulysses::profile {

// A layer runner that opens the "layer" range, then calls `inner` (or layer.forward when
// `inner` is empty: the model's default).
inline model::LayerRunner with_layer_range(model::LayerRunner inner) {
  return [inner = std::move(inner)](model::LlamaDecoderLayerImpl& layer, const at::Tensor& x,
                                    const at::Tensor& cos, const at::Tensor& sin,
                                    const model::AttentionContext& ctx) {
    ScopedRange range("layer", ctx.layer_index);
    return inner ? inner(layer, x, cos, sin, ctx) : layer.forward(x, cos, sin, ctx);
  };
}

// An MLP runner that times the call as phase "mlp", then calls `inner` (or mlp.forward).
inline model::MlpRunner with_mlp_phase(model::MlpRunner inner) {
  return [inner = std::move(inner)](model::LlamaMLPImpl& mlp, const at::Tensor& x) {
    ScopedPhase phase("mlp");
    return inner ? inner(mlp, x) : mlp.forward(x);
  };
}

// Times a local attention core's calls as phase "attention" (a decorator: same name, same
// results).
class TimedAttentionCore : public model::AttentionCore {
 public:
  explicit TimedAttentionCore(std::shared_ptr<model::AttentionCore> inner)
      : inner_(std::move(inner)) {}
  // q [bs, T, hq, hd], k/v [bs, T, hkv, hd] -> [bs, T, hq, hd]
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const model::AttentionContext& ctx) override {
    if (!ctx.run_core) return inner_->forward(q, k, v, ctx);
    ScopedPhase phase("attention");
    return inner_->forward(q, k, v, ctx);
  }
  std::string name() const override { return inner_->name(); }

 private:
  std::shared_ptr<model::AttentionCore> inner_;
};

// Wraps the runners installed so far (activation checkpointing, TiledMLP) in place, so call it
// after the memory features have installed theirs. Calling it twice nests the ranges twice.
inline void install_model_ranges(model::LlamaForCausalLM& model) {
  model->set_layer_runner(with_layer_range(model->model->layer_runner));
  for (int64_t i = 0; i < model->model->num_layers(); ++i) {
    model::LlamaDecoderLayer layer = model->model->layer(i);
    layer->mlp_runner = with_mlp_phase(layer->mlp_runner);
  }
  if (std::dynamic_pointer_cast<model::LocalAttentionCore>(model->attention_core())) {
    model->set_attention_core(std::make_shared<TimedAttentionCore>(model->attention_core()));
  }
}

}  // namespace ulysses::profile
