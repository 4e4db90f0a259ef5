// Exact global-batch loss and gradients over a dp x sp mesh (see gradient_step.h).
#include "train/gradient_step.h"

#include <optional>

#include "model/lm_loss.h"
#include "profile/phase_timer.h"
#include "sp/tiled_logits_loss.h"

namespace ulysses::train {

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

  std::optional<GradientBuffers> temporary;
  GradientBuffers* buffers = options.buffers;
  if (buffers == nullptr) buffers = &temporary.emplace(model->parameters());
  buffers->zero();
  double local_loss_sum = 0.0;
  for (const auto& b : micro_batches) {
    model::AttentionContext ctx;
    ctx.doc_ids = b.doc_ids;
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
    local_loss_sum += loss.sum.item<double>();
  }

  TORCH_CHECK(options.reduce || options.buffers != nullptr,
              "compute_gradients: reduce = false needs options.buffers");
  if (options.reduce) buffers->all_reduce(mesh.world(), options.bucket_bytes);
  if (temporary) temporary->copy_to_param_grads();
  at::Tensor loss_sum = at::tensor({local_loss_sum}, at::kDouble);
  mesh.world().all_reduce(loss_sum, comm::ReduceOp::kSum);

  StepLoss out;
  out.loss_sum = loss_sum.item<double>();
  out.valid_tokens = global_valid;
  out.loss = out.loss_sum * inv_count;
  return out;
}

}  // namespace ulysses::train
