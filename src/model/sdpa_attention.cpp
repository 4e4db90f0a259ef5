// at::scaled_dot_product_attention with a selected kernel family (see sdpa_attention.h).
#include "model/sdpa_attention.h"

#include <ATen/Context.h>

#include <cmath>

#include "common/error.h"

namespace ulysses::model {
namespace {

// Enables exactly the SDP kernels wanted for one call and restores the previous switches.
// kSdpaAuto enables every kernel (SDPA's math kernel included, as its last resort).
class SdpKernelScope {
 public:
  explicit SdpKernelScope(AttentionBackend backend) {
    auto& ctx = at::globalContext();
    flash_ = ctx.userEnabledFlashSDP();
    efficient_ = ctx.userEnabledMemEfficientSDP();
    math_ = ctx.userEnabledMathSDP();
#if ULYSSES_HAS_CUDNN_SDPA
    cudnn_ = ctx.userEnabledCuDNNSDP();
#endif
    const bool all = backend == AttentionBackend::kSdpaAuto;
    ctx.setSDPUseFlash(all || backend == AttentionBackend::kFlash);
    ctx.setSDPUseMemEfficient(all || backend == AttentionBackend::kEfficient);
    ctx.setSDPUseMath(all);
#if ULYSSES_HAS_CUDNN_SDPA
    ctx.setSDPUseCuDNN(all || backend == AttentionBackend::kCudnn);
#endif
  }
  ~SdpKernelScope() {
    auto& ctx = at::globalContext();
    ctx.setSDPUseFlash(flash_);
    ctx.setSDPUseMemEfficient(efficient_);
    ctx.setSDPUseMath(math_);
#if ULYSSES_HAS_CUDNN_SDPA
    ctx.setSDPUseCuDNN(cudnn_);
#endif
  }
  SdpKernelScope(const SdpKernelScope&) = delete;
  SdpKernelScope& operator=(const SdpKernelScope&) = delete;

 private:
  bool flash_ = true, efficient_ = true, math_ = true, cudnn_ = false;
};

}  // namespace

at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend) {
  TORCH_CHECK(backend != AttentionBackend::kMath,
              "sdpa_attention: math goes through local_attention");
  const int64_t sl = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2);
  const int64_t group = hq / hkv;
  at::Tensor q_t = q.transpose(1, 2);  // [bs, hq, sl, hd]
#if ULYSSES_HAS_SDPA_GQA
  at::Tensor k_t = k.transpose(1, 2);  // [bs, hkv, sl, hd]
  at::Tensor v_t = v.transpose(1, 2);  // [bs, hkv, sl, hd]
  const bool gqa = group > 1;
#else
  at::Tensor k_t = (group == 1 ? k : k.repeat_interleave(group, 2)).transpose(1, 2);  // [bs, hq, sl, hd]
  at::Tensor v_t = (group == 1 ? v : v.repeat_interleave(group, 2)).transpose(1, 2);  // [bs, hq, sl, hd]
#endif

  std::optional<at::Tensor> mask;  // [bs, 1, sl, sl] bool, true = may attend
  bool is_causal = true;
  AttentionBackend kernel = backend;
  if (doc_ids.defined()) {
    at::Tensor same_doc = doc_ids.unsqueeze(2).eq(doc_ids.unsqueeze(1));          // [bs, sl, sl]
    at::Tensor causal = at::ones({sl, sl}, q.options().dtype(at::kBool)).tril();  // [sl, sl]
    mask = same_doc.logical_and(causal).unsqueeze(1);
    is_causal = false;
    if (q.is_cuda() &&
        (kernel == AttentionBackend::kFlash || kernel == AttentionBackend::kCudnn)) {
      kernel = AttentionBackend::kEfficient;  // these CUDA kernels take no arbitrary mask
    }
  }
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  if (q.is_cuda() && !half &&
      (kernel == AttentionBackend::kFlash || kernel == AttentionBackend::kCudnn)) {
    throw UserError("attention.backend: " + attention_backend_name(kernel) +
                    " needs fp16/bf16 activations on CUDA (memory.precision: bf16)");
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  SdpKernelScope scope(kernel);
  auto call = [&] {
#if ULYSSES_HAS_SDPA_GQA
    return at::scaled_dot_product_attention(q_t, k_t, v_t, mask, /*dropout_p=*/0.0, is_causal,
                                            scale, gqa);
#else
    return at::scaled_dot_product_attention(q_t, k_t, v_t, mask, /*dropout_p=*/0.0, is_causal,
                                            scale);
#endif
  };
  if (kernel == AttentionBackend::kSdpaAuto) return call().transpose(1, 2);  // [bs, sl, hq, hd]
  try {
    return call().transpose(1, 2);  // [bs, sl, hq, hd]
  } catch (const c10::Error& e) {
    // Out of memory keeps its exit status (12): it is not bad input. A forced kernel family that
    // cannot take these inputs ("No available kernel") is a configuration the user chose.
    std::string what = e.what_without_backtrace();
    if (is_out_of_memory_text(what)) throw;
    throw UserError("attention.backend: " + attention_backend_name(kernel) +
                    " cannot run these inputs: " + what.substr(0, what.find('\n')));
  }
}

}  // namespace ulysses::model
