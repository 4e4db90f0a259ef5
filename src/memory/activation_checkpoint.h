// Per-layer activation checkpointing (SPEC 5.5), installed through
// LlamaForCausalLM::set_layer_runner: each decoder layer's forward runs without building a graph
// and keeps only its input hidden state [bs, T, h] (on the device, or offloaded to host memory);
// backward recomputes the layer with grad enabled and backpropagates through it (reentrant style:
// a nested backward accumulates the layer's parameter gradients and yields the input gradient).
//
// Works with any attention core, Ulysses included: every SP rank recomputes its layers in the same
// (reverse) order, so the recompute's all-to-alls pair up across ranks as in the forward. The
// layer's AttentionContext (document ids, layer index, run_core) is kept for the recompute. The
// layers draw no random numbers (no dropout), so no RNG state is stashed.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>

#include "memory/activation_offload.h"
#include "model/llama.h"

namespace ulysses::memory {

// What checkpointing did since it was enabled.
struct CheckpointCounts {
  int64_t layers_checkpointed = 0;  // layer forwards that kept only their input
  int64_t layers_recomputed = 0;    // layer recomputations in backward
  int64_t bytes_offloaded = 0;      // hidden-state bytes stashed in host memory
};

// The state behind a model's checkpointing layer runner. Create with
// enable_activation_checkpointing.
class ActivationCheckpointing : public std::enable_shared_from_this<ActivationCheckpointing> {
 public:
  explicit ActivationCheckpointing(bool offload) : offload_(offload) {}

  // A runner for LlamaForCausalLM::set_layer_runner; it holds a reference to this object.
  // With grad mode off (evaluation) it calls layer.forward directly.
  model::LayerRunner runner();

  bool offload() const { return offload_; }
  CheckpointCounts counts() const;

 private:
  friend struct CheckpointedLayer;
  bool offload_;
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

}  // namespace ulysses::memory
