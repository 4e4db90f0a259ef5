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

#include "comm/group.h"
#include "common/document_runs.h"

namespace ulysses::sp {

// Causal attention of this ring rank's block against the whole sequence, differentiable.
//   q [bs, 2C, hq, hd], k/v [bs, 2C, hkv, hd] (RoPE applied; chunk j then chunk 2R-1-j of a
//   [2RC]-position sample; R = ring.size(), j = ring.rank()) -> [bs, 2C, hq, hd].
// GQA by grouping (query head i uses KV head i / (hq / hkv)); scale 1/sqrt(hd). `doc_ids`
// [bs, 2RC] (the whole sample's document ids, packed batches) limits attention to the same
// document; undefined = one document. `documents`: document_runs(doc_ids) found on the host (the
// batch's), or null (then found here, one copy from the device). Softmax statistics and the merged
// output in fp32 for fp16/bf16 inputs, else in the input dtype. Each pair of chunks runs through
// SDPA's flash kernel (forward returning its log-sum-exp, backward taking the final one) when
// `fused` and the kernel takes the inputs (CPU: any floating dtype; CUDA: fp16/bf16, head size a
// multiple of 8 up to 256) and the pair needs no document mask (its chunks lie in one document,
// or there are none); otherwise through scores materialised per pair of chunks ([bs, hq, C, C]).
// Every member of `ring` calls it with the same shapes; `ring` must outlive the autograd graph.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, const DocumentRuns* documents,
                          comm::Group& ring, bool fused = false);

}  // namespace ulysses::sp
