// Fused attention through at::scaled_dot_product_attention with one kernel family selected
// (flash, memory-efficient, cuDNN, or SDPA's own choice). Exists only on LibTorch >= 2.0; the
// source compiles to nothing on 1.13 and local_attention never calls it there.
#pragma once
#include <ATen/ATen.h>

#include "common/torch_compat.h"
#include "model/attention_core.h"

// cuDNN attention can be selected through at::globalContext() from LibTorch 2.4 on.
#if ULYSSES_TORCH2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
#define ULYSSES_HAS_CUDNN_SDPA 1
#else
#define ULYSSES_HAS_CUDNN_SDPA 0
#endif

namespace ulysses::model {

#if ULYSSES_TORCH2
// Same contract as local_attention (attention_core.h) for backend kFlash, kEfficient, kCudnn or
// kSdpaAuto: q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd] -> [bs, sl, hq, hd] (input dtype).
// k/v are expanded to hq heads; with doc_ids a bool mask [bs, 1, sl, sl] is passed and flash or
// cudnn requests run the efficient kernel. The global SDP switches are restored on return.
// Throws UserError("attention.backend: ...") when the selected kernel rejects the inputs.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend);
#endif

}  // namespace ulysses::model
