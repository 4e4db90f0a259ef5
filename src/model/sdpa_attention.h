// Fused attention through at::scaled_dot_product_attention with one kernel family selected
// (flash, memory-efficient, cuDNN, or SDPA's own choice), on CUDA and on CPU (PyTorch's fused
// flash-attention CPU kernel), so no [sl, sl] scores are materialised.
#pragma once
#include <ATen/ATen.h>

#include "common/torch_compat.h"
#include "model/attention_core.h"

namespace ulysses::model {

// Same contract as local_attention (attention_core.h) for backend kFlash, kEfficient, kCudnn or
// kSdpaAuto: q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd] -> [bs, sl, hq, hd] (input dtype).
// GQA runs natively (enable_gqa, LibTorch >= 2.5; k/v are expanded to hq heads before that).
// With doc_ids a bool mask [bs, 1, sl, sl] is passed, and flash or cudnn requests on CUDA run the
// efficient kernel (those CUDA kernels take no arbitrary mask). The global SDP switches are
// restored on return.
// Throws UserError("attention.backend: ...") when an explicitly selected kernel rejects the
// inputs; out-of-memory errors (is_out_of_memory_text) and every failure of kSdpaAuto propagate
// as they are, so out-of-memory keeps its own exit status.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend);

}  // namespace ulysses::model
