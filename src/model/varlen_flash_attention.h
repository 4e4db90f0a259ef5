// Packed documents in one flash-attention launch: the variable-length ("varlen") form of the flash
// kernel takes every document of the micro-batch as one run of a flat token sequence, so a batch
// of many short documents costs one kernel per layer instead of one SDPA call per document.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>
#include <vector>

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

// The varlen flash kernels without autograd, for callers that merge partial results by their
// log-sum-exp themselves (ring attention); the runs' offsets live on the compute device (the
// host, for CPU tensors). n query runs, run i of rows [cu_q[i], cu_q[i+1])
// attending to keys [cu_k[i], cu_k[i+1]); causal: each row sees the keys up to its own position
// (runs of equal length only).
struct VarlenRuns {
  at::Tensor cu_q, cu_k;  // [n + 1] int32 on the compute device
  // [total_q] int64 on the device: row r of run i -> i * max_q + (r - cu_q[i]).
  at::Tensor lse_slots;
  int64_t max_q = 0, max_k = 0;  // the longest run (max_q at least 2)
};

// The runs on `device` from host offsets (each strictly ascending from 0, n + 1 entries, n >= 1:
// every run has query and key rows): one non-blocking copy from page-locked memory per tensor
// kind, no host sync. Throws (TORCH_CHECK) on other offsets.
VarlenRuns varlen_runs(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                       const at::Device& device);

// q [total_q, hq, hd], k/v [total_k, hkv, hd] (contiguous; hq % hkv == 0, GQA native) -> out
// [total_q, hq, hd] (q's dtype) and its log-sum-exp of the scaled scores lse [hq, total_q]
// (natural log; fp32, fp64 for fp64 inputs). CUDA: fp16/bf16, head size a multiple of 8 up to
// 256, compute capability 8.0 or newer, one launch. CPU (any floating dtype): SDPA's CPU flash
// kernel once per run, the same results.
struct VarlenOutput {
  at::Tensor out, lse;
};
VarlenOutput varlen_flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const VarlenRuns& runs, bool causal, double scale);

// The gradients of one varlen_flash_forward call given the rows' final output `out`
// [total_q, hq, hd] (q's dtype) and final log-sum-exp `lse` [hq, total_q] fp32, which may cover
// more keys than this call's (the ring's merged result): dq [total_q, hq, hd], dk/dv
// [total_k, hkv, hd] (q's dtype; dk/dv summed over each KV head's query group by the kernel,
// on CPU in fp32 or fp64 before one rounding).
// REQUIRES: varlen_flash_forward has run in this process (it learns the kernel's LSE layout).
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const VarlenRuns& runs, bool causal,
    double scale);

}  // namespace ulysses::model
