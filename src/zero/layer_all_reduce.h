// Data-parallel gradient sums that overlap backward (as DDP's bucketed all-reduce does): each
// decoder layer's gradients are summed over the world as soon as that layer's backward of the
// step's last micro-batch is done, while the layers below it still compute.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "memory/activation_checkpoint.h"
#include "model/llama.h"
#include "zero/grad_buffers.h"

namespace ulysses::train {

// Per decoder layer, the [first, last) indices of its parameters in `params`, which must be
// model->parameters() in their order (checked; `who` names the caller in the error). A layer's
// parameters must be adjacent.
std::vector<std::pair<size_t, size_t>> layer_parameter_ranges(model::LlamaForCausalLM& model,
                                                              const std::vector<at::Tensor>& params,
                                                              const char* who);

// The layer hooks of stages 0 and 1 (memory::enable_layer_hooks): weights stay whole (gather and
// release do nothing); after a layer's nested backward, while armed, it starts the all-reduce of
// that layer's slice of `buffers` (GradientBuffers::all_reduce_start). compute_gradients arms it
// for the last micro-batch of a step; GradientBuffers::all_reduce (stage 0: compute_gradients;
// stage 1: ZeroOptimizer::reduce_gradients) then sums the rest (embedding, final norm, LM head)
// and waits. Holds references to `buffers` and `group`.
// REQUIRES: buffers not on_host, made over model->parameters() in their order.
class LayerAllReduce : public memory::LayerParameterHooks {
 public:
  LayerAllReduce(model::LlamaForCausalLM& model, GradientBuffers& buffers, comm::Group& group,
                 int64_t bucket_bytes);

  void arm(bool armed) { armed_ = armed; }
  void gather_layer(int64_t) override {}
  void release_layer(int64_t) override {}
  void reduce_layer(int64_t layer) override;

 private:
  GradientBuffers& buffers_;
  comm::Group& group_;
  int64_t bucket_bytes_;
  bool armed_ = false;
  std::vector<std::pair<size_t, size_t>> layer_params_;  // per layer: [first, last) of params()
};

}  // namespace ulysses::train
