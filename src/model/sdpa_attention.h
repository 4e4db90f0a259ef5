// Fused attention through at::scaled_dot_product_attention with one kernel family selected
// (flash, memory-efficient, cuDNN, or SDPA's own choice), on CUDA and on CPU (PyTorch's fused
// flash-attention CPU kernel), so no [sl, sl] scores are materialised.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/torch_compat.h"
#include "model/attention_core.h"

namespace ulysses::model {

// Largest packed-document mask [bs, sl, sl] (bool) sdpa_attention builds: 64 MiB, i.e. sl 8192 at
// bs 1. Longer packed sequences go through the block-diagonal path.
inline constexpr int64_t kMaxDenseDocMaskBytes = int64_t{64} << 20;

// Documents of each sample as (start, length) runs of equal doc ids, in order, when every id
// occupies one contiguous run in its sample; an empty result when some id repeats after another
// (then only a mask expresses the attention pattern).
//   doc_ids [bs, sl] int64 (any device; read on the host)
std::vector<std::vector<std::pair<int64_t, int64_t>>> document_runs(const at::Tensor& doc_ids);

// Same contract as local_attention (attention_core.h) for backend kFlash, kEfficient, kCudnn or
// kSdpaAuto: q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd] -> [bs, sl, hq, hd] (input dtype).
// GQA runs natively (enable_gqa, LibTorch >= 2.5) except where CUDA's memory-efficient kernel runs
// (forced, fp32, or a dense mask), which rejects it: there k/v are expanded to hq heads.
// With doc_ids (packed documents) two paths give the same result:
//  - block-diagonal, when a dense mask would take more than max_dense_mask_bytes (bs * sl * sl
//    bytes) and each document is one contiguous run of its id: one causal SDPA call per document
//    of each sample, so no [sl, sl] mask ever exists and every kernel family can run;
//  - otherwise a bool mask [bs, 1, sl, sl], with flash or cudnn requests on CUDA running the
//    efficient kernel (those CUDA kernels take no arbitrary mask).
// Finding the documents reads doc_ids on the host (one device sync per call).
// The global SDP switches are restored on return.
// Throws UserError("attention.backend: ...") when an explicitly selected kernel rejects the
// inputs; out-of-memory errors (is_out_of_memory_text) and every failure of kSdpaAuto propagate
// as they are, so out-of-memory keeps its own exit status.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend,
                          int64_t max_dense_mask_bytes = kMaxDenseDocMaskBytes);

}  // namespace ulysses::model
