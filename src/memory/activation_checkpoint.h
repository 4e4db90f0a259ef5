// Per-layer activation checkpointing, installed through
// LlamaForCausalLM::set_layer_runner: each decoder layer's forward runs without building a graph
// and keeps only its input hidden state [bs, T, h] (on the device, or offloaded to host memory);
// backward recomputes the layer with grad enabled and backpropagates through it (reentrant style:
// a nested backward accumulates the layer's parameter gradients and yields the input gradient).
// The recompute is a model::GraphOnlyForward: its output is never read, so TiledMLP builds its
// graph there without running its tiles, which run once, in its own backward.
//
// Works with any attention core, Ulysses included: every SP rank recomputes its layers in the same
// (reverse) order, so the recompute's all-to-alls pair up across ranks as in the forward. The
// layer's AttentionContext (document ids, layer index, run_core) is kept for the recompute. The
// layers draw no random numbers (no dropout), so no RNG state is stashed.
//
// ZeRO stages 2 and 3 reuse the same autograd function with LayerParameterHooks: the runner
// gathers a layer's weights before its forward and before its backward, releases them after each,
// and hands the layer's gradients to reduction as soon as its nested backward returns (they are
// complete for this micro-batch then). Stage 3 always recomputes (a graph kept from the forward
// would keep the gathered weights alive); stage 2 without memory.checkpointing keeps the layer's
// graph from the forward instead (recompute = false) and only uses the reduce hook.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "memory/activation_offload.h"
#include "model/llama.h"

namespace ulysses::memory {

// What checkpointing did since it was enabled.
struct CheckpointCounts {
  int64_t layers_checkpointed = 0;  // layer forwards that kept only their input
  int64_t layers_recomputed = 0;    // layer recomputations in backward
  int64_t bytes_offloaded = 0;      // hidden-state bytes stashed in host memory
};

// Called by the runner around each decoder layer's uses (ZeRO: zero/zero_partition.h). Layer
// indices are AttentionContext::layer_index. Every method is collective over the ZeRO group and
// every rank calls them in the same order (the layers run in the same order on every rank).
class LayerParameterHooks {
 public:
  virtual ~LayerParameterHooks() = default;
  // Before the layer's forward and before its backward recompute: its weights must be whole.
  virtual void gather_layer(int64_t layer) = 0;
  // After the forward (no graph keeps the weights) and after the backward.
  virtual void release_layer(int64_t layer) = 0;
  // After the nested backward: the layer's parameter gradients of this micro-batch are complete.
  virtual void reduce_layer(int64_t layer) = 0;
};

// The state behind a model's checkpointing layer runner. Create with
// enable_activation_checkpointing.
class ActivationCheckpointing : public std::enable_shared_from_this<ActivationCheckpointing> {
 public:
  explicit ActivationCheckpointing(bool offload) : offload_(offload) {}
  // recompute false: the forward builds and keeps the layer's graph (no recompute, no offload:
  // REQUIRES !offload); backward runs it as the nested backward. hooks may be null.
  ActivationCheckpointing(bool offload, bool recompute, std::shared_ptr<LayerParameterHooks> hooks)
      : offload_(offload), recompute_(recompute), hooks_(std::move(hooks)) {}

  // A runner for LlamaForCausalLM::set_layer_runner; it holds a reference to this object.
  // With grad mode off (evaluation) it calls layer.forward directly.
  model::LayerRunner runner();

  bool offload() const { return offload_; }
  CheckpointCounts counts() const;

 private:
  friend struct CheckpointedLayer;
  bool offload_;
  bool recompute_ = true;
  std::shared_ptr<LayerParameterHooks> hooks_;  // null: none
  ActivationOffloader offloader_;
  std::atomic<int64_t> checkpointed_{0};
  std::atomic<int64_t> recomputed_{0};
};

// Installs checkpointing (with host offload of the saved inputs when `offload`) on every layer of
// `model`, replacing any layer runner, and returns its state. Loss and gradients are unchanged up
// to floating-point reassociation in the parameter-gradient sums. Double backward through the same
// graph (retain_graph) is not supported with offload.
std::shared_ptr<ActivationCheckpointing> enable_activation_checkpointing(
    model::LlamaForCausalLM& model, bool offload);

// The ZeRO form (see LayerParameterHooks): recompute as above; hooks not null. With grad mode off
// (evaluation) the runner gathers, runs and releases each layer. REQUIRES: recompute when the
// hooks release weights after the forward (ZeRO-3), since a kept graph would still use them.
std::shared_ptr<ActivationCheckpointing> enable_layer_hooks(
    model::LlamaForCausalLM& model, bool offload, bool recompute,
    std::shared_ptr<LayerParameterHooks> hooks);

}  // namespace ulysses::memory
