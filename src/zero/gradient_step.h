// One optimizer step's forward/backward over all micro-batches, with the loss and gradient
// semantics: loss = (sum of token cross-entropies over every valid label of the global
// batch) / (number of those labels); the gradients are exactly those of that loss.
//
// How: every rank adds up its valid labels over its micro-batches, one all-reduce over the world
// gives N; each micro-batch backpropagates (its loss sum) / N into fp32 accumulation buffers
// (grad_buffers.h); after the last one the buffers are summed over the whole world (SP ranks hold
// partial gradients of the shared weights, DP ranks gradients of other samples). No averaging of
// per-rank means, so no sp-times factor.
#pragma once
#include <vector>

#include "comm/mesh.h"
#include "data/batch.h"
#include "model/llama.h"
#include "zero/grad_buffers.h"
#include "zero/layer_all_reduce.h"
#include "zero/overlapped_host_update.h"
#include "zero/overlapped_shard_update.h"
#include "zero/zero_partition.h"

namespace ulysses::train {

// Choices of compute_gradients that change memory use, never the result.
struct GradientOptions {
  // memory.tiled_loss: 1 = model::lm_loss_sum; N or auto = sp::tiled_lm_loss_sum with that many
  // tiles (auto resolved per micro-batch by sp::resolve_loss_tiles).
  config::TileCount loss_tiles;
  // Where gradients accumulate and are reduced from (the trainer keeps one for the whole run).
  // Null: compute_gradients uses temporary buffers and leaves the sums in each parameter's .grad()
  // in the parameter's dtype. Not owned.
  GradientBuffers* buffers = nullptr;
  int64_t bucket_bytes = kDefaultGradBucketBytes;  // size of one gradient all-reduce
  // false: leave options.buffers holding this rank's own sums, unreduced (ZeRO reduces them
  // itself: zero_optimizer.h). REQUIRES options.buffers when false.
  bool reduce = true;
  // ZeRO stage 2/3 (not owned; `buffers` is then unused): the embedding, the layers (through the
  // partition's layer runner) and the head (final norm + LM head + loss) run as units; each
  // unit's gradients are reduce-scattered into the partition's shards as soon as its backward is
  // done, per micro-batch. Backward runs in two parts: the head's (its gradients complete), then
  // the layers' and the embedding's from the head's input gradient.
  ZeroPartition* partition = nullptr;
  // Stages 0 and 1 (not owned; may be null): the layer hooks that start each layer's all-reduce
  // of `buffers` during the backward of the last micro-batch (layer_all_reduce.h); the rest is
  // summed by buffers->all_reduce, here (reduce) or by ZeroOptimizer::reduce_gradients.
  LayerAllReduce* layer_all_reduce = nullptr;
  // Stage 0 with the optimizer and gradients on the host (not owned; may be null): armed for the
  // last micro-batch (its layer hooks hand each finished layer's gradients to the host update),
  // and told what buffers->all_reduce has summed. REQUIRES: reduce, no partition.
  OverlappedHostUpdate* host_update = nullptr;
  // ZeRO stages 1-3 with the optimizer and gradient shards on the host (not owned; may be null):
  // armed for the last micro-batch, whose reductions make the shards final (stages 2 and 3; stage
  // 1's are summed by ZeroOptimizer::reduce_gradients afterwards).
  OverlappedShardUpdate* shard_update = nullptr;
};

struct StepLoss {
  double loss = 0.0;         // global token-weighted mean cross-entropy of the step
  double loss_sum = 0.0;     // global sum of token cross-entropies
  int64_t valid_tokens = 0;  // N, over the whole global batch
};

// Runs forward + backward for `micro_batches` (this rank's, already on the model's device),
// accumulating in fp32 into options.buffers (zeroed first), then sums them over the world
// (unless options.reduce is false). With
// options.buffers the result is buffers->grads(); without, each parameter's .grad().
// Returns the global loss. Every rank of `mesh` must call it with the same number of micro-batches.
// `ctx` carries the attention options (doc_ids are taken from each batch).
StepLoss compute_gradients(model::LlamaForCausalLM& model,
                           const std::vector<data::Batch>& micro_batches, comm::DeviceMesh& mesh,
                           const GradientOptions& options = {});


}  // namespace ulysses::train
