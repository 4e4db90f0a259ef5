// Exact global-batch loss and gradients over a dp x sp mesh (see gradient_step.h).
#include "zero/gradient_step.h"

#include <optional>

#include "model/lm_loss.h"
#include "profile/phase_timer.h"
#include "sp/tiled_logits_loss.h"

namespace ulysses::train {
namespace {

// Loss of the final-normed hidden [bs, T, h] against labels [bs, T], tiled or not.
model::LossSum head_loss(const at::Tensor& hidden, const at::Tensor& weight,
                         const at::Tensor& labels, const config::TileCount& loss_tiles) {
  if (loss_tiles.value == 1) return model::lm_loss_sum(hidden, weight, labels);
  const int64_t tiles =
      sp::resolve_loss_tiles(loss_tiles, hidden.size(0), hidden.size(1), weight.size(0));
  return sp::tiled_lm_loss_sum(hidden, weight, labels, tiles);
}

// One micro-batch under ZeRO stage 2/3 (gradient_step.h, GradientOptions::partition). Returns
// this rank's loss sum, [] fp64 on the loss's device (read once per step, not per micro-batch).
at::Tensor sharded_micro_batch(model::LlamaForCausalLM& model, const data::Batch& b,
                           ZeroPartition& partition, const config::TileCount& loss_tiles,
                           double inv_count) {
  model::AttentionContext ctx;
  ctx.doc_ids = b.doc_ids;
  ctx.documents = b.documents;  // the runs, found on the host: no layer reads doc_ids back
  at::Tensor layers_out;  // [bs, sl/sp, h], before the final norm
  {
    profile::ScopedPhase phase("forward");
    const at::Tensor embedded = partition.embed(b.input_ids);  // [bs, sl/sp, h]
    layers_out = model->model->forward_layers(embedded, b.position_ids, ctx);
  }
  // The head: its own graph from a leaf, so its backward ends (and its gradients are complete)
  // before the layers' backward starts.
  const at::Tensor head_input = layers_out.detach().requires_grad_(true);  // [bs, sl/sp, h]
  model::LossSum loss;
  {
    profile::ScopedPhase phase("loss");
    partition.gather_unit(ZeroPartition::kHead);
    loss = head_loss(model->model->norm(head_input), model->lm_head_weight(), b.labels, loss_tiles);
  }
  const at::Tensor loss_sum = loss.sum.detach().to(at::kDouble);
  {
    profile::ScopedPhase phase("backward");
    (loss.sum * inv_count).backward();
    loss = model::LossSum();  // frees the head's graph (and the gathered weights it saved)
    partition.reduce_unit(ZeroPartition::kHead);
    partition.release_unit(ZeroPartition::kHead);
    layers_out.backward(head_input.grad());
    partition.reduce_pending();  // the embedding's gradient
  }
  return loss_sum;
}

}  // namespace

StepLoss compute_gradients(model::LlamaForCausalLM& model,
                           const std::vector<data::Batch>& micro_batches, comm::DeviceMesh& mesh,
                           const GradientOptions& options) {
  // N: valid labels of the global batch, each rank contributing its count.
  int64_t local_valid = 0;
  for (const auto& b : micro_batches) local_valid += b.valid_tokens;
  at::Tensor counts = at::tensor({static_cast<double>(local_valid)}, at::kDouble);
  mesh.world().all_reduce(counts, comm::ReduceOp::kSum);
  const int64_t global_valid = static_cast<int64_t>(counts.item<double>());
  const double inv_count = 1.0 / static_cast<double>(std::max<int64_t>(global_valid, 1));

  ZeroPartition* partition = options.partition;
  std::optional<GradientBuffers> temporary;
  GradientBuffers* buffers = options.buffers;
  if (partition != nullptr) {
    partition->zero_grads();
  } else {
    if (buffers == nullptr) buffers = &temporary.emplace(model->parameters());
    buffers->zero();
  }
  at::Tensor local_loss_sum;  // [] fp64 on the loss's device: no host sync per micro-batch
  const auto add_loss = [&](const at::Tensor& sum) {
    local_loss_sum = local_loss_sum.defined() ? local_loss_sum + sum : sum;
  };
  LayerAllReduce* layer_all_reduce = partition == nullptr ? options.layer_all_reduce : nullptr;
  for (const auto& b : micro_batches) {
    // The layers' sums start during the last micro-batch's backward, once each layer is done.
    if (layer_all_reduce != nullptr) layer_all_reduce->arm(&b == &micro_batches.back());
    if (options.host_update != nullptr) options.host_update->arm(&b == &micro_batches.back());
    if (options.shard_update != nullptr) options.shard_update->arm(&b == &micro_batches.back());
    if (partition != nullptr) {
      add_loss(sharded_micro_batch(model, b, *partition, options.loss_tiles, inv_count));
      continue;
    }
    model::AttentionContext ctx;
    ctx.doc_ids = b.doc_ids;
    ctx.documents = b.documents;  // the runs, found on the host: no layer reads doc_ids back
    at::Tensor hidden;  // [bs, sl/sp, h]
    {
      profile::ScopedPhase phase("forward");
      hidden = model->forward_hidden(b.input_ids, b.position_ids, ctx);
    }
    model::LossSum loss;
    {
      profile::ScopedPhase phase("loss");
      const at::Tensor weight = model->lm_head_weight();  // [V, h]
      if (options.loss_tiles.value == 1) {
        loss = model::lm_loss_sum(hidden, weight, b.labels);
      } else {
        const int64_t tiles = sp::resolve_loss_tiles(options.loss_tiles, hidden.size(0),
                                                     hidden.size(1), weight.size(0));
        loss = sp::tiled_lm_loss_sum(hidden, weight, b.labels, tiles);
      }
    }
    {
      profile::ScopedPhase phase("backward");
      (loss.sum * inv_count).backward();
    }
    add_loss(loss.sum.detach().to(at::kDouble));
  }

  if (layer_all_reduce != nullptr) layer_all_reduce->arm(false);
  if (options.host_update != nullptr) options.host_update->arm(false);
  if (options.shard_update != nullptr) options.shard_update->arm(false);
  if (buffers != nullptr) buffers->settle();  // optimizer offload: every sum is on the host
  TORCH_CHECK(options.reduce || options.buffers != nullptr || partition != nullptr,
              "compute_gradients: reduce = false needs options.buffers");
  TORCH_CHECK(options.host_update == nullptr || (options.reduce && partition == nullptr &&
                                                 options.buffers != nullptr),
              "compute_gradients: host_update needs reduce, buffers and no partition");
  if (options.reduce && partition == nullptr) {
    buffers->all_reduce(mesh.world(), options.bucket_bytes,
                        options.host_update != nullptr ? options.host_update->on_summed()
                                                       : GradientBuffers::SummedFn());
  }
  if (temporary) temporary->copy_to_param_grads();
  at::Tensor loss_sum = at::zeros({1}, at::kDouble);  // [1] host: its own storage, reduced in place
  if (local_loss_sum.defined()) loss_sum.copy_(local_loss_sum.reshape({1}));
  mesh.world().all_reduce(loss_sum, comm::ReduceOp::kSum);

  StepLoss out;
  out.loss_sum = loss_sum.item<double>();
  out.valid_tokens = global_valid;
  out.loss = out.loss_sum * inv_count;
  return out;
}

}  // namespace ulysses::train
