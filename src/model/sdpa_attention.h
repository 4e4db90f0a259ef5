// Fused attention through at::scaled_dot_product_attention with one kernel family selected
// (flash, memory-efficient, cuDNN, or SDPA's own choice), on CUDA and on CPU (PyTorch's fused
// flash-attention CPU kernel), so no [sl, sl] scores are materialised.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "common/document_runs.h"
#include "common/torch_compat.h"
#include "model/attention_core.h"

namespace ulysses::model {

// Largest packed-document mask [bs, sl, sl] (bool) sdpa_attention builds: 64 MiB, i.e. sl 8192 at
// bs 1. Longer packed sequences go through the block-diagonal path.
inline constexpr int64_t kMaxDenseDocMaskBytes = int64_t{64} << 20;

// The runs sdpa_attention's block-diagonal path needs for doc_ids [bs, sl] (document_runs, read on
// the host: one device sync), or null when doc_ids is undefined or the dense mask serves
// (bs * sl * sl <= kMaxDenseDocMaskBytes). For callers that have no host runs: find them once per
// forward, not once per layer.
std::shared_ptr<const DocumentRuns> block_diagonal_runs(const at::Tensor& doc_ids);

// The SDP kernel families one call may use: the process-wide switches of at::globalContext().
struct SdpKernels {
  bool flash = false;
  bool efficient = false;
  bool math = false;  // SDPA's own math kernel: [sl, sl] scores
  bool cudnn = false;
  bool operator==(const SdpKernels&) const = default;
};

// What `backend` allows on CUDA (`cuda`) or CPU: exactly its family; for kSdpaAuto every fused
// family, plus SDPA's math kernel on CPU only (on CUDA it would silently materialise [sl, sl]
// scores, so a call that no fused kernel takes fails instead).
// REQUIRES: backend != kMath.
SdpKernels sdp_kernels_for(AttentionBackend backend, bool cuda);

// Same contract as local_attention (attention_core.h) for backend kFlash, kEfficient, kCudnn or
// kSdpaAuto: q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd] -> [bs, sl, hq, hd] (input dtype).
// GQA runs natively (enable_gqa, LibTorch >= 2.5) except where CUDA's memory-efficient kernel runs
// (forced, fp32, or a dense mask), which rejects it: there k/v are expanded to hq heads.
// With doc_ids (packed documents) two paths give the same result:
//  - block-diagonal, when a dense mask would take more than max_dense_mask_bytes (bs * sl * sl
//    bytes) and each document is one contiguous run of its id: with flash or auto where
//    varlen_flash_applies (CUDA, fp16/bf16), every document of the batch in one varlen flash
//    launch (recorded as kernel "flash_varlen"); otherwise one causal SDPA call per document of
//    each sample. Either way no [sl, sl] mask ever exists;
//  - otherwise a bool mask [bs, 1, sl, sl], with flash or cudnn requests on CUDA running the
//    efficient kernel (those CUDA kernels take no arbitrary mask).
// `documents` (null or document_runs(doc_ids), found on the host) spares the block-diagonal path
// reading doc_ids on the host; without it that path costs one device sync per call.
// Kernel switches: sets the global SDP switches to sdp_kernels_for(the kernel run, q's device) and
// leaves them so; a run uses one selection, so only its first call changes them. Records the
// kernel SDPA chose in attention_kernels_used().
// Throws UserError("attention.backend: ...") when an explicitly selected kernel rejects the
// inputs, and on CUDA when auto finds no fused kernel for them (math is not a silent fallback
// there); out-of-memory errors (is_out_of_memory_text) and other failures of kSdpaAuto
// propagate as they are, so out-of-memory keeps its own exit status.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend,
                          int64_t max_dense_mask_bytes = kMaxDenseDocMaskBytes,
                          const DocumentRuns* documents = nullptr);

}  // namespace ulysses::model
