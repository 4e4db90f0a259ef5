// Held-out evaluation: loss and perplexity overall and per position bucket
// (halves of the context from its end: [L/2, L), [L/4, L/2), ...; position_bucket_edges), so a user sees whether the model
// uses the long context. Runs with SP, or without it (attention.disable_in_eval): then the first
// rank of each SP group evaluates the group's whole sequences with local attention.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/options.h"
#include "data/token_source.h"
#include "model/llama.h"
#include "zero/zero_partition.h"

namespace ulysses::train {

struct BucketLoss {
  int64_t begin = 0, end = 0;  // positions [begin, end) within a sample
  double loss_sum = 0.0;
  int64_t count = 0;
  double loss() const { return count ? loss_sum / count : 0.0; }
};

struct EvalResult {
  double loss = 0.0;
  double perplexity = 0.0;
  int64_t tokens = 0;
  std::vector<BucketLoss> buckets;
  std::optional<data::PackingCounts> packing;  // data.packing: documents only
  std::string loss_mask;                        // the mask dataset read, "" = none
  nlohmann::json to_json() const;  // packing and loss_mask only when present
};

// {documents, samples, truncated, dropped, tokens, padding_tokens}: the counts as summary.json and
// evaluation records write them.
nlohmann::json packing_counts_json(const data::PackingCounts& counts);

// Bucket edges for a padded sequence length L: 0, L/32, L/16, L/8, L/4, L/2, L (integer halves,
// repeats dropped), so runs of every size see how the loss falls along the context: 4096 gives
// 0, 128, 256, 512, 1024, 2048, 4096; 131072 gives 0, 4K, 8K, 16K, 32K, 64K, 128K.
// REQUIRES: length >= 1.
std::vector<int64_t> position_bucket_edges(int64_t length);

// Evaluates `model` on config.eval (source, seed, steps) with the run's sequence settings and
// data options (data.packing, data.loss_mask, data.overlong apply to eval.source as to training).
// Every rank of `mesh` must call it. `sp_core` is the attention core used with SP (restored on
// return when SP is bypassed). No gradients are recorded. With a stage-3 `partition` (the
// model's weights released) the forward goes unit by unit as in training: the embedding, each
// layer and the head are gathered for their use and released, never the whole model at once;
// ranks that evaluate nothing (without SP, all but the first of each SP group) walk the same
// gathers. Nothing stays gathered on return (no prefetch runs after the head without autograd).
EvalResult evaluate(model::LlamaForCausalLM& model, const config::RunConfig& config,
                    comm::DeviceMesh& mesh, const at::Device& device,
                    ZeroPartition* partition = nullptr);

}  // namespace ulysses::train
