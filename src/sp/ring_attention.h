// Ring attention over the sequence: each rank of a ring group holds one block of the sequence
// (all its positions for the heads this rank computes) and the K/V blocks travel around the ring,
// each step's transfer overlapping the attention on the block that arrived before. Blocks are
// zig-zag (data/sequence_layout.h): with R ranks the sample is 2R chunks of C positions, and ring
// rank j holds chunk j then chunk 2R-1-j, so every rank does the same causal work.
//
// Exact: block results merge by their log-sum-exp (online softmax); the backward recomputes each
// block's probabilities from the final log-sum-exp and passes the K/V gradients around the ring
// with the blocks (each rank adds its part while the next block computes), so they arrive at
// their owner summed over every rank.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "comm/group.h"
#include "common/document_runs.h"
#include "model/attention_core.h"

namespace ulysses::sp {

// The math path's default budget for one block of scores: 256 MiB (at hq 8 and C = 32K in fp32,
// 256 query rows at a time).
inline constexpr int64_t kRingScoreBlockBytes = int64_t{256} << 20;

// What one ring_attention call materialised, for tests and diagnostics.
struct RingStats {
  // The most elements of one score (or probability) block the math path held, over the forward
  // and the backward of the call; 0 when every pair ran through a flash kernel. The forward
  // resets it: under activation checkpointing the recompute's forward starts it again, so it
  // then covers the recompute and the backward.
  int64_t largest_score_block = 0;
};

// Whether CUDA's flash kernels can run q [.., hd] on its device: fp16/bf16, head size a multiple
// of 8 up to 256 (SDPA pads other sizes; called directly the kernels refuse them), compute
// capability 8.0 or newer. False for CPU tensors.
bool cuda_flash_runs(const at::Tensor& q);

struct RingOptions {
  // The user's attention.backend. kMath: every pair through the math path. Otherwise the flash
  // kernels where they run: on CUDA with kFlash or kSdpaAuto, fp16/bf16, head size a multiple
  // of 8 up to 256 and compute capability 8.0 or newer; on CPU with any backend but kMath (any
  // floating dtype). A pair without a document mask goes through SDPA's flash kernel; one with
  // documents (when the document ids form runs) through the varlen kernel over the documents
  // both chunks hold (model/varlen_flash_attention.h; on CPU one flash call per document). Every
  // other pair (and every pair under kEfficient or kCudnn) takes the math path.
  model::AttentionBackend backend = model::AttentionBackend::kMath;
  // The math path holds scores for as many query rows at a time as fit in this many bytes (at
  // least one row): one block is [bs, hq, rows, C] in the compute dtype; the forward holds about
  // two such blocks at once, the backward about three.
  int64_t score_block_bytes = kRingScoreBlockBytes;
  // Where the call records what it materialised (reset by the forward), or null. It must outlive
  // the backward.
  RingStats* stats = nullptr;
};

// Causal attention of this ring rank's block against the whole sequence, differentiable.
//   q [bs, 2C, hq, hd], k/v [bs, 2C, hkv, hd] (RoPE applied; chunk j then chunk 2R-1-j of a
//   [2RC]-position sample; R = ring.size(), j = ring.rank()) -> [bs, 2C, hq, hd].
// GQA by grouping (query head i uses KV head i / (hq / hkv)); scale 1/sqrt(hd). `doc_ids`
// [bs, 2RC] (the whole sample's document ids, packed batches) limits attention to the same
// document; undefined = one document. `documents`: document_runs(doc_ids) found on the host (the
// batch's), or null (then found here, one device-to-host copy per call: its backward reuses
// them). Softmax statistics and the merged output in fp32 for fp16/bf16 inputs, else in the input
// dtype. No pair of chunks materialises [C, C] scores: the math path works on query rows in
// blocks of `options.score_block_bytes`.
// Every member of `ring` calls it with the same shapes and options; `ring` must outlive the
// autograd graph.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, const DocumentRuns* documents,
                          comm::Group& ring, const RingOptions& options);

}  // namespace ulysses::sp
