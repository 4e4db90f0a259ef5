// One micro-batch as one rank sees it: its SP shard of each sample's inputs, labels
// (shifted before sharding) and global position ids, plus full-sequence document ids when packed.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace ulysses::data {

// Label value of positions that do not count in the loss (as in torch's cross_entropy).
inline constexpr int64_t kIgnoreIndex = -100;

// Tensors are int64 on CPU; the caller moves them to its device.
struct Batch {
  at::Tensor input_ids;     // [bs, sl/sp] int64; padding positions hold 0
  at::Tensor labels;        // [bs, sl/sp] int64, -100 = ignored
  at::Tensor position_ids;  // [bs, sl/sp] int64: global positions (per-document when packed)
  at::Tensor doc_ids;       // [bs, sl] int64 full-sequence document ids when packed, else undefined
  int64_t valid_tokens = 0;  // labels != -100 in this shard
};

}  // namespace ulysses::data
