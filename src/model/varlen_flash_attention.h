// Packed documents in one flash-attention launch: the variable-length ("varlen") form of the flash
// kernel takes every document of the micro-batch as one run of a flat token sequence, so a batch
// of many short documents costs one kernel per layer instead of one SDPA call per document.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "common/document_runs.h"

namespace ulysses::model {

// Whether varlen_flash_attention can run q [bs, sl, hq, hd] with k [bs, sl, hkv, hd]: CUDA,
// fp16/bf16, hd a multiple of 8 and at most 256, hq a multiple of hkv, and `documents` holding one
// list of runs per sample (not empty).
bool varlen_flash_applies(const at::Tensor& q, const at::Tensor& k, const DocumentRuns& documents);

// Causal attention within each document: q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd] ->
// [bs, sl, hq, hd] (q's dtype), each token attending to the tokens of its own run up to itself,
// GQA native (hq / hkv query heads share a KV head). Differentiable (its own backward through the
// varlen flash backward kernel). The runs' cumulative offsets go to the device once per call
// (a non-blocking copy from page-locked memory: no host sync).
// REQUIRES: varlen_flash_applies(q, k, documents); the runs of each sample cover [0, sl) in order.
at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const DocumentRuns& documents);

}  // namespace ulysses::model
