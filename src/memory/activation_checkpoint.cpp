// The checkpointed-layer autograd function and the layer runner that applies it (see header).
#include "memory/activation_checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/graph_only_forward.h"
#include "profile/phase_timer.h"

namespace ulysses::memory {

// Everything one checkpointed layer call needs again in backward. Held by the autograd node.
struct LayerCall : torch::CustomClassHolder {
  std::shared_ptr<torch::nn::Module> owner;  // keeps `layer` alive with the graph
  model::LlamaDecoderLayerImpl* layer = nullptr;
  at::Tensor cos, sin;                // [bs, T, hd]
  model::AttentionContext attention;  // doc_ids [bs, sl] or undefined, layer index, run_core
  std::shared_ptr<OffloadedTensor> offloaded;  // the input in host memory (offload only)
  at::Tensor kept_leaf, kept_out;  // [bs, T, h] the kept graph's input and output (no recompute)
  std::shared_ptr<ActivationCheckpointing> checkpointing;
};

struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  // x [bs, T, h] -> [bs, T, h]. Runs with grad mode off (custom Function forward): no graph.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<LayerCall> call) {
    ActivationCheckpointing& owner = *call->checkpointing;
    const int64_t index = call->attention.layer_index;
    if (owner.hooks_) owner.hooks_->gather_layer(index);
    at::Tensor out;  // [bs, T, h]
    if (owner.recompute_) {
      out = call->layer->forward(x, call->cos, call->sin, call->attention);
      if (owner.offload_) {
        call->offloaded = owner.offloader_.stash(x);  // [bs, T, h] -> host
      } else {
        ctx->save_for_backward({x});  // freed by the engine after backward
      }
      ++owner.checkpointed_;
    } else {  // keep the layer's own graph for the nested backward
      at::AutoGradMode grad_on(true);
      call->kept_leaf = x.detach().requires_grad_(true);
      call->kept_out = call->layer->forward(call->kept_leaf, call->cos, call->sin, call->attention);
      out = call->kept_out.detach();  // the custom node becomes its grad_fn, not the inner graph's
    }
    if (owner.hooks_) owner.hooks_->release_layer(index);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return out;
  }

  // grads[0] [bs, T, h] -> {d x [bs, T, h], none}; parameter grads accumulate in their .grad.
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const c10::intrusive_ptr<torch::CustomClassHolder> holder = ctx->saved_data["call"].toCapsule();
    auto* call = static_cast<LayerCall*>(holder.get());
    ActivationCheckpointing& owner = *call->checkpointing;
    const int64_t index = call->attention.layer_index;
    at::Tensor leaf, out;  // [bs, T, h]
    if (owner.recompute_) {
      at::Tensor input;  // [bs, T, h]
      if (call->offloaded) {
        input = call->offloaded->fetch();
        // Bring the previous layer's input back while this layer recomputes.
        if (auto previous = call->offloaded->previous()) previous->prefetch();
        call->offloaded.reset();
      } else {
        input = ctx->get_saved_variables().at(0);
      }
      if (owner.hooks_) owner.hooks_->gather_layer(index);
      leaf = input.detach().requires_grad_(true);
      {
        profile::ScopedPhase phase("recompute");
        at::AutoGradMode grad_on(true);
        model::GraphOnlyForward graph_only;  // `out` is backpropagated through, never read
        out = call->layer->forward(leaf, call->cos, call->sin, call->attention);
      }
      ++owner.recomputed_;
    } else {
      TORCH_CHECK(call->kept_out.defined(), "layer ", index, ": backward ran twice without recompute");
      leaf = std::move(call->kept_leaf);
      out = std::move(call->kept_out);
      call->kept_leaf.reset();
      call->kept_out.reset();
    }
    if (grads[0].defined()) torch::autograd::backward({out}, {grads[0]});
    out.reset();  // frees the layer's graph (and with it any weights it saved)
    at::Tensor dx = leaf.grad();  // [bs, T, h]
    if (owner.hooks_) {
      owner.hooks_->reduce_layer(index);
      owner.hooks_->release_layer(index);
    }
    return {dx, at::Tensor()};
  }
};

model::LayerRunner ActivationCheckpointing::runner() {
  std::shared_ptr<ActivationCheckpointing> self = shared_from_this();
  return [self](model::LlamaDecoderLayerImpl& layer, const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin, const model::AttentionContext& ctx) -> at::Tensor {
    if (!at::GradMode::is_enabled()) {
      if (!self->hooks_) return layer.forward(x, cos, sin, ctx);
      self->hooks_->gather_layer(ctx.layer_index);
      at::Tensor out = layer.forward(x, cos, sin, ctx);  // [bs, T, h]
      self->hooks_->release_layer(ctx.layer_index);
      return out;
    }
    auto call = c10::make_intrusive<LayerCall>();
    call->owner = layer.shared_from_this();
    call->layer = &layer;
    call->cos = cos;
    call->sin = sin;
    call->attention = ctx;
    call->checkpointing = self;
    // The input must be part of the graph for the layer's parameters to get gradients.
    const at::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
    return CheckpointedLayer::apply(input, std::move(call));
  };
}

CheckpointCounts ActivationCheckpointing::counts() const {
  CheckpointCounts out;
  out.layers_checkpointed = checkpointed_.load();
  out.layers_recomputed = recomputed_.load();
  out.bytes_offloaded = offloader_.bytes_stashed();
  return out;
}

std::shared_ptr<ActivationCheckpointing> enable_activation_checkpointing(
    model::LlamaForCausalLM& model, bool offload) {
  auto checkpointing = std::make_shared<ActivationCheckpointing>(offload);
  model->set_layer_runner(checkpointing->runner());
  return checkpointing;
}

std::shared_ptr<ActivationCheckpointing> enable_layer_hooks(
    model::LlamaForCausalLM& model, bool offload, bool recompute,
    std::shared_ptr<LayerParameterHooks> hooks) {
  TORCH_CHECK(hooks != nullptr, "enable_layer_hooks: null hooks");
  TORCH_CHECK(recompute || !offload, "enable_layer_hooks: offload needs recompute");
  auto checkpointing = std::make_shared<ActivationCheckpointing>(offload, recompute, std::move(hooks));
  model->set_layer_runner(checkpointing->runner());
  return checkpointing;
}

}  // namespace ulysses::memory
