// One micro-batch as one rank sees it: its SP shard of each sample's inputs, labels
// (shifted before sharding) and global position ids, plus full-sequence document ids when packed.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "common/document_runs.h"

namespace ulysses::data {

// Label value of positions that do not count in the loss (as in torch's cross_entropy).
inline constexpr int64_t kIgnoreIndex = -100;

// Tensors are int64 on CPU; the caller moves them to its device. `documents` stays on the host
// and goes with the batch into model::AttentionContext, so attention needs no copy of doc_ids
// back from the device.
struct Batch {
  at::Tensor input_ids;     // [bs, sl/sp] int64; padding positions hold 0
  at::Tensor labels;        // [bs, sl/sp] int64, -100 = ignored
  at::Tensor position_ids;  // [bs, sl/sp] int64: global positions (per-document when packed)
  at::Tensor doc_ids;       // [bs, sl] int64 full-sequence document ids when packed, else undefined
  // document_runs(doc_ids), found on the host when the batch was built; null when not packed.
  std::shared_ptr<const DocumentRuns> documents;
  int64_t valid_tokens = 0;  // labels != -100 in this shard
};

}  // namespace ulysses::data
