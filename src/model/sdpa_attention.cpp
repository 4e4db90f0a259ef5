// at::scaled_dot_product_attention with a selected kernel family (see sdpa_attention.h).
#include "model/sdpa_attention.h"

#include <ATen/Context.h>

#include <cmath>
#include <mutex>
#include <optional>

#include "common/error.h"
#include "model/varlen_flash_attention.h"

namespace ulysses::model {
namespace {

// Sets the global SDP switches to `wanted`, writing only those that differ, so that a run (one
// selection) sets them once. Serialised: the switches are process-wide.
void use_sdp_kernels(const SdpKernels& wanted) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto& ctx = at::globalContext();
  if (ctx.userEnabledFlashSDP() != wanted.flash) ctx.setSDPUseFlash(wanted.flash);
  if (ctx.userEnabledMemEfficientSDP() != wanted.efficient) {
    ctx.setSDPUseMemEfficient(wanted.efficient);
  }
  if (ctx.userEnabledMathSDP() != wanted.math) ctx.setSDPUseMath(wanted.math);
#if ULYSSES_HAS_CUDNN_SDPA
  if (ctx.userEnabledCuDNNSDP() != wanted.cudnn) ctx.setSDPUseCuDNN(wanted.cudnn);
#endif
}

// attention_kernels_used()'s name of an at::SDPBackend value (at::_fused_sdp_choice).
std::string sdp_kernel_name(int64_t choice) {
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::math:
      return "sdpa_math";
    case at::SDPBackend::flash_attention:
      return "flash";
    case at::SDPBackend::efficient_attention:
      return "efficient";
    case at::SDPBackend::cudnn_attention:
      return "cudnn";
    default:
      return "sdpa_backend_" + std::to_string(choice);
  }
}

// The first line of a LibTorch error.
std::string first_line(const c10::Error& e) {
  const std::string what = e.what_without_backtrace();
  return what.substr(0, what.find('\n'));
}

// The error for inputs that no kernel `kernel` allows can take.
UserError no_kernel_error(AttentionBackend kernel, bool cuda, const c10::Error& e) {
  if (kernel == AttentionBackend::kSdpaAuto && cuda) {
    return UserError(
        "attention.backend: auto found no fused kernel (flash, efficient, cudnn) for these "
        "inputs, and SDPA's math kernel would materialise [sl, sl] scores; set "
        "attention.backend: math to run that way (" + first_line(e) + ")");
  }
  return UserError("attention.backend: " + attention_backend_name(kernel) +
                   " cannot run these inputs: " + first_line(e));
}

}  // namespace

std::shared_ptr<const DocumentRuns> block_diagonal_runs(const at::Tensor& doc_ids) {
  if (!doc_ids.defined() || doc_ids.size(0) * doc_ids.size(1) * doc_ids.size(1) <=
                                kMaxDenseDocMaskBytes) {
    return nullptr;
  }
  return std::make_shared<const DocumentRuns>(document_runs(doc_ids));
}

SdpKernels sdp_kernels_for(AttentionBackend backend, bool cuda) {
  TORCH_CHECK(backend != AttentionBackend::kMath, "sdp_kernels_for: math uses no SDP kernel");
  const bool all = backend == AttentionBackend::kSdpaAuto;
  SdpKernels kernels;
  kernels.flash = all || backend == AttentionBackend::kFlash;
  kernels.efficient = all || backend == AttentionBackend::kEfficient;
  kernels.math = all && !cuda;
  kernels.cudnn = all || backend == AttentionBackend::kCudnn;
  return kernels;
}

at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend,
                          int64_t max_dense_mask_bytes, const DocumentRuns* documents) {
  TORCH_CHECK(backend != AttentionBackend::kMath,
              "sdpa_attention: math goes through local_attention");
  const int64_t bs = q.size(0), sl = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2);
  const int64_t group = hq / hkv;
  at::Tensor q_t = q.transpose(1, 2);  // [bs, hq, sl, hd]
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  std::optional<at::Tensor> mask;  // [bs, 1, sl, sl] bool, true = may attend
  bool is_causal = true;
  AttentionBackend kernel = backend;
  DocumentRuns derived;                  // found here when the caller gave none
  const DocumentRuns* blocks = nullptr;  // block-diagonal path: the documents of each sample
  if (doc_ids.defined() && bs * sl * sl > max_dense_mask_bytes) {
    if (documents == nullptr) {
      derived = document_runs(doc_ids);  // reads doc_ids on the host
      documents = &derived;
    }
    TORCH_CHECK(documents->empty() || static_cast<int64_t>(documents->size()) == bs,
                "sdpa_attention: documents of ", documents->size(), " samples for bs ", bs);
    if (!documents->empty()) blocks = documents;
  }
  if (blocks != nullptr &&
      (kernel == AttentionBackend::kFlash || kernel == AttentionBackend::kSdpaAuto) &&
      varlen_flash_applies(q, k, *blocks)) {
    record_attention_kernel("flash_varlen");
    try {
      return varlen_flash_attention(q, k, v, *blocks);  // [bs, sl, hq, hd]
    } catch (const c10::Error& e) {
      if (is_out_of_memory_text(e.what_without_backtrace())) throw;
      throw no_kernel_error(kernel, /*cuda=*/true, e);
    }
  }
  if (doc_ids.defined() && blocks == nullptr) {
    at::Tensor same_doc = doc_ids.unsqueeze(2).eq(doc_ids.unsqueeze(1));          // [bs, sl, sl]
    at::Tensor causal = at::ones({sl, sl}, q.options().dtype(at::kBool)).tril();  // [sl, sl]
    mask = same_doc.logical_and(causal).unsqueeze(1);
    is_causal = false;
    if (q.is_cuda() &&
        (kernel == AttentionBackend::kFlash || kernel == AttentionBackend::kCudnn)) {
      kernel = AttentionBackend::kEfficient;  // these CUDA kernels take no arbitrary mask
    }
  }
  // Native GQA (enable_gqa) runs in SDPA's flash, cuDNN and math kernels and on the CPU; CUDA's
  // memory-efficient kernel rejects it ("Invalid backend", seen on an H100 with LibTorch 2.11),
  // and it is the only fused CUDA kernel for fp32 and for a dense mask, so there K/V are
  // expanded to hq heads.
  const bool native_gqa = ULYSSES_HAS_SDPA_GQA && group > 1 &&
                          (!q.is_cuda() || (half && kernel != AttentionBackend::kEfficient &&
                                                  !mask.has_value()));
  at::Tensor k_t = (native_gqa || group == 1 ? k : k.repeat_interleave(group, 2))
                       .transpose(1, 2);  // [bs, hkv or hq, sl, hd]
  at::Tensor v_t = (native_gqa || group == 1 ? v : v.repeat_interleave(group, 2))
                       .transpose(1, 2);  // [bs, hkv or hq, sl, hd]
  [[maybe_unused]] const bool gqa = native_gqa;

  if (q.is_cuda() && !half &&
      (kernel == AttentionBackend::kFlash || kernel == AttentionBackend::kCudnn)) {
    throw UserError("attention.backend: " + attention_backend_name(kernel) +
                    " needs fp16/bf16 activations on CUDA (memory.precision: bf16)");
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  use_sdp_kernels(sdp_kernels_for(kernel, q.is_cuda()));
  // q/k/v of one SDPA call: the whole batch, or one document of one sample.
  auto slice = [&](const at::Tensor& t, int64_t b, int64_t start, int64_t length) {
    return t.narrow(0, b, 1).narrow(2, start, length);  // [1, heads, length, hd]
  };
  // The kernel SDPA picks under these switches, asked before any compute (the first document
  // stands for the others): recorded, and refused in one line when there is none.
  auto first_call = [&](const at::Tensor& t) {  // [1 or bs, heads, length or sl, hd]
    return blocks == nullptr ? t : slice(t, 0, (*blocks)[0][0].first, (*blocks)[0][0].second);
  };
  try {
#if ULYSSES_HAS_SDPA_GQA
    const int64_t choice = at::_fused_sdp_choice(first_call(q_t), first_call(k_t), first_call(v_t),
                                                 mask, /*dropout_p=*/0.0, is_causal, scale, gqa);
#else
    const int64_t choice = at::_fused_sdp_choice(first_call(q_t), first_call(k_t), first_call(v_t),
                                                 mask, /*dropout_p=*/0.0, is_causal, scale);
#endif
    record_attention_kernel(sdp_kernel_name(choice));
  } catch (const c10::Error& e) {
    throw no_kernel_error(kernel, q.is_cuda(), e);
  }
  auto sdpa = [&](const at::Tensor& qs, const at::Tensor& ks, const at::Tensor& vs) {
#if ULYSSES_HAS_SDPA_GQA
    return at::scaled_dot_product_attention(qs, ks, vs, mask, /*dropout_p=*/0.0, is_causal,
                                            scale, gqa);
#else
    return at::scaled_dot_product_attention(qs, ks, vs, mask, /*dropout_p=*/0.0, is_causal,
                                            scale);
#endif
  };
  auto call = [&] {
    if (blocks == nullptr) return sdpa(q_t, k_t, v_t);  // [bs, hq, sl, hd]
    // Block-diagonal: each document attends causally to itself only.
    std::vector<at::Tensor> samples;
    for (int64_t b = 0; b < bs; ++b) {
      std::vector<at::Tensor> pieces;
      for (const auto& [start, length] : (*blocks)[b]) {
        pieces.push_back(sdpa(slice(q_t, b, start, length), slice(k_t, b, start, length),
                              slice(v_t, b, start, length)));  // [1, hq, length, hd]
      }
      samples.push_back(pieces.size() == 1 ? pieces[0] : at::cat(pieces, 2));  // [1, hq, sl, hd]
    }
    return samples.size() == 1 ? samples[0] : at::cat(samples, 0);  // [bs, hq, sl, hd]
  };
  if (kernel == AttentionBackend::kSdpaAuto) return call().transpose(1, 2);  // [bs, sl, hq, hd]
  try {
    return call().transpose(1, 2);  // [bs, sl, hq, hd]
  } catch (const c10::Error& e) {
    // Out of memory keeps its exit status (12): it is not bad input. A forced kernel family that
    // cannot take these inputs ("No available kernel") is a configuration the user chose.
    if (is_out_of_memory_text(e.what_without_backtrace())) throw;
    throw no_kernel_error(kernel, q.is_cuda(), e);
  }
}

}  // namespace ulysses::model
