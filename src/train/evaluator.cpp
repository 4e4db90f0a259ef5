// Per-position-bucket evaluation (see evaluator.h).
#include "train/evaluator.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "data/data_loader.h"
#include "model/attention_core.h"
#include "model/lm_loss.h"

namespace ulysses::train {
namespace {

// A fault for tests of the tuner's numerics check only: with ULYSSES_FAULT_SP_EVAL_SCALE=1 in
// the environment, a run with sp > 1 reports its eval loss multiplied by sp, as a mesh whose
// eval loss is silently wrong would. Never set it outside such a test.
double injected_eval_scale(int64_t sp) {
  const char* fault = std::getenv("ULYSSES_FAULT_SP_EVAL_SCALE");
  return fault != nullptr && std::strcmp(fault, "1") == 0 && sp > 1 ? static_cast<double>(sp)
                                                                     : 1.0;
}

}  // namespace

std::vector<int64_t> position_bucket_edges(int64_t length) {
  // length / 2^k for k = kMaxBuckets-1 .. 1, then length: halves from the end, so the last bucket
  // is the second half of the context at every length. Edges that would repeat are dropped.
  constexpr int kMaxBuckets = 6;
  std::vector<int64_t> edges = {0};
  for (int k = kMaxBuckets - 1; k >= 1; --k) {
    const int64_t edge = length >> k;
    if (edge > edges.back()) edges.push_back(edge);
  }
  if (length > edges.back()) edges.push_back(length);
  return edges;
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json out = {{"loss", loss}, {"perplexity", perplexity}, {"tokens", tokens}};
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& b : buckets) {
    rows.push_back({{"begin", b.begin},
                    {"end", b.end},
                    {"loss", b.loss()},
                    {"perplexity", std::exp(b.loss())},
                    {"tokens", b.count}});
  }
  out["buckets"] = rows;
  if (packing) out["packing"] = packing_counts_json(*packing);
  if (!loss_mask.empty()) out["loss_mask"] = loss_mask;
  return out;
}

nlohmann::json packing_counts_json(const data::PackingCounts& counts) {
  return {{"documents", counts.documents}, {"samples", counts.samples},
          {"truncated", counts.truncated}, {"dropped", counts.dropped},
          {"tokens", counts.tokens},       {"padding_tokens", counts.padding_tokens}};
}

EvalResult evaluate(model::LlamaForCausalLM& model, const config::RunConfig& config,
                    comm::DeviceMesh& mesh, const at::Device& device, ZeroPartition* partition) {
  if (partition != nullptr && partition->stage() != 3) partition = nullptr;  // weights whole
  torch::NoGradGuard no_grad;
  const bool bypass_sp = config.attention.disable_in_eval && mesh.sp_size() > 1;
  std::shared_ptr<model::AttentionCore> sp_core = model->attention_core();
  if (bypass_sp) {
    model->set_attention_core(std::make_shared<model::LocalAttentionCore>(
        model::resolve_attention_backend(config.attention.backend, device)));
  }
  const config::DataOptions data = data::eval_data_options(config.data, config.eval);
  config::SequenceOptions seq = config.sequence;
  seq.grad_accum = 1;
  // Without SP, the first rank of each SP group evaluates the group's whole sequences alone, so
  // both modes see exactly the same samples.
  const int64_t sp_size = bypass_sp ? 1 : mesh.sp_size();
  const int64_t sp_rank = bypass_sp ? 0 : mesh.sp_rank();
  const bool contributes = !bypass_sp || mesh.sp_rank() == 0;
  data::DataLoader loader(data, seq, config.model.vocab_size, mesh.dp_size(), mesh.dp_rank(),
                          sp_size, sp_rank, "eval.source", bypass_sp ? 1 : mesh.sp_ring_size());

  const std::vector<int64_t> edges = position_bucket_edges(loader.padded_length());
  const int64_t num_buckets = static_cast<int64_t>(edges.size()) - 1;
  at::Tensor sums = at::zeros({num_buckets}, at::kDouble);    // [buckets]
  at::Tensor counts = at::zeros({num_buckets}, at::kDouble);  // [buckets]
  at::Tensor edge_tensor = at::tensor(std::vector<int64_t>(edges.begin() + 1, edges.end()));

  const int64_t steps = std::max<int64_t>(config.eval.steps, 1);
  if (!contributes && partition != nullptr) {
    for (int64_t step = 1; step <= steps; ++step) partition->walk_units();
  }
  const int64_t eval_steps = contributes ? steps : 0;
  for (int64_t step = 1; step <= eval_steps; ++step) {
    data::Batch batch = loader.micro_batch(step, 0);
    model::AttentionContext ctx;
    ctx.doc_ids = batch.doc_ids.defined() ? batch.doc_ids.to(device) : batch.doc_ids;
    ctx.documents = batch.documents;
    const at::Tensor input_ids = batch.input_ids.to(device);
    const at::Tensor position_ids = batch.position_ids.to(device);
    at::Tensor hidden;  // [bs, T, h]
    if (partition != nullptr) {  // unit by unit, in walk_units' order
      const at::Tensor layers_out =
          model->model->forward_layers(partition->embed(input_ids), position_ids, ctx);
      partition->gather_unit(ZeroPartition::kHead);
      hidden = model->model->norm(layers_out);
    } else {
      hidden = model->forward_hidden(input_ids, position_ids, ctx);
    }
    const int64_t local_len = hidden.size(1);
    // Position of each local token within its sample, for bucketing.
    const at::Tensor& positions = loader.shard_positions();  // [T]
    at::Tensor bucket_of = at::searchsorted(edge_tensor, positions, /*out_int32=*/false,
                                            /*right=*/true);  // [T]
    constexpr int64_t kTile = 1024;  // logits [bs, kTile, V] at a time
    at::Tensor token_loss = model::lm_token_losses(hidden, model->lm_head_weight(), batch.labels,
                                                   kTile)
                                .to(at::kCPU, at::kDouble);  // [bs, T], one copy per batch
    if (partition != nullptr) partition->release_unit(ZeroPartition::kHead);
    at::Tensor valid = batch.labels.ne(model::kIgnoreLabel).to(at::kDouble);  // [bs, T] CPU
    at::Tensor rows = bucket_of.expand({token_loss.size(0), local_len}).reshape({-1});
    sums.index_add_(0, rows, (token_loss * valid).reshape({-1}));
    counts.index_add_(0, rows, valid.reshape({-1}));
  }
  at::Tensor packed = at::cat({sums, counts}).to(device);
  mesh.world().all_reduce(packed, comm::ReduceOp::kSum);
  packed = packed.to(at::kCPU);

  EvalResult result;
  result.packing = loader.packing_counts();
  result.loss_mask = loader.loss_mask_prefix();
  double total_sum = 0.0;
  int64_t total_count = 0;
  for (int64_t b = 0; b < num_buckets; ++b) {
    BucketLoss bucket;
    bucket.begin = edges[b];
    bucket.end = edges[b + 1];
    bucket.loss_sum = packed[b].item<double>();
    bucket.count = static_cast<int64_t>(packed[num_buckets + b].item<double>());
    total_sum += bucket.loss_sum;
    total_count += bucket.count;
    result.buckets.push_back(bucket);
  }
  result.tokens = total_count;
  result.loss = total_count ? total_sum / total_count : 0.0;
  result.loss *= injected_eval_scale(mesh.sp_size());
  result.perplexity = std::exp(result.loss);
  if (bypass_sp) model->set_attention_core(sp_core);
  return result;
}

}  // namespace ulysses::train
