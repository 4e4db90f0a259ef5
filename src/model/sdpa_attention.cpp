// at::scaled_dot_product_attention with a selected kernel family (see sdpa_attention.h).
#include "model/sdpa_attention.h"

#include <ATen/Context.h>

#include <cmath>
#include <unordered_set>

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

std::vector<std::vector<std::pair<int64_t, int64_t>>> document_runs(const at::Tensor& doc_ids) {
  at::Tensor ids = doc_ids.to(at::kCPU, at::kLong).contiguous();  // [bs, sl]
  const int64_t batch = ids.size(0), sl = ids.size(1);
  const int64_t* data = ids.data_ptr<int64_t>();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = data + b * sl;
    std::unordered_set<int64_t> seen;
    int64_t start = 0;
    for (int64_t i = 1; i <= sl; ++i) {
      if (i < sl && row[i] == row[start]) continue;
      if (!seen.insert(row[start]).second) return {};  // this id had an earlier run
      runs[b].emplace_back(start, i - start);
      start = i;
    }
  }
  return runs;
}

at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, AttentionBackend backend,
                          int64_t max_dense_mask_bytes) {
  TORCH_CHECK(backend != AttentionBackend::kMath,
              "sdpa_attention: math goes through local_attention");
  const int64_t sl = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2);
  const int64_t group = hq / hkv;
  at::Tensor q_t = q.transpose(1, 2);  // [bs, hq, sl, hd]
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  std::optional<at::Tensor> mask;  // [bs, 1, sl, sl] bool, true = may attend
  bool is_causal = true;
  AttentionBackend kernel = backend;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> documents;  // block-diagonal path
  if (doc_ids.defined() && q.size(0) * sl * sl > max_dense_mask_bytes) {
    documents = document_runs(doc_ids);
  }
  if (doc_ids.defined() && documents.empty()) {
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
  SdpKernelScope scope(kernel);
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
    if (documents.empty()) return sdpa(q_t, k_t, v_t);  // [bs, hq, sl, hd]
    // Block-diagonal: each document attends causally to itself only.
    std::vector<at::Tensor> samples;
    for (int64_t b = 0; b < static_cast<int64_t>(documents.size()); ++b) {
      std::vector<at::Tensor> pieces;
      for (const auto& [start, length] : documents[b]) {
        auto slice = [&](const at::Tensor& t) {
          return t.narrow(0, b, 1).narrow(2, start, length);  // [1, heads, length, hd]
        };
        pieces.push_back(sdpa(slice(q_t), slice(k_t), slice(v_t)));  // [1, hq, length, hd]
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
    std::string what = e.what_without_backtrace();
    if (is_out_of_memory_text(what)) throw;
    throw UserError("attention.backend: " + attention_backend_name(kernel) +
                    " cannot run these inputs: " + what.substr(0, what.find('\n')));
  }
}

}  // namespace ulysses::model
