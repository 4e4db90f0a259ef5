// Backend choice, the math (reference) attention and LocalAttentionCore (see attention_core.h).
#include "model/attention_core.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "common/error.h"
#include "common/torch_compat.h"
#include "model/sdpa_attention.h"

namespace ulysses::model {
namespace {

bool is_half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// attention_kernels_used(), guarded by its mutex. Never destroyed (read at exit).
struct KernelRecord {
  std::mutex mutex;
  std::vector<std::string> kernels;
};
KernelRecord& kernel_record() {
  static KernelRecord* record = new KernelRecord;
  return *record;
}

// Plain causal attention; see local_attention. Scores are [bs, hkv, g * sl, sl] with the g = hq/hkv
// query heads of one kv head stacked along the row dimension, so k/v are never expanded.
at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids) {
  const int64_t bs = q.size(0), sl = q.size(1), hq = q.size(2), hd = q.size(3);
  const int64_t hkv = k.size(2), group = hq / hkv;
  const at::ScalarType compute = is_half(q.scalar_type()) ? at::kFloat : q.scalar_type();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

  at::Tensor q_g = (q.to(compute) * scale)
                       .reshape({bs, sl, hkv, group, hd})
                       .permute({0, 2, 3, 1, 4})
                       .reshape({bs, hkv, group * sl, hd});  // [bs, hkv, g*sl, hd]
  at::Tensor k_g = k.to(compute).permute({0, 2, 1, 3});      // [bs, hkv, sl, hd]
  at::Tensor v_g = v.to(compute).permute({0, 2, 1, 3});      // [bs, hkv, sl, hd]

  at::Tensor scores = at::matmul(q_g, k_g.transpose(-1, -2))
                          .view({bs, hkv, group, sl, sl});  // [bs, hkv, g, sl, sl]
  at::Tensor masked = at::ones({sl, sl}, q.options().dtype(at::kBool)).triu(1);  // [sl, sl]
  if (doc_ids.defined()) {
    TORCH_CHECK(doc_ids.dim() == 2 && doc_ids.size(0) == bs && doc_ids.size(1) == sl,
                "local_attention: doc_ids must be [bs, sl] = [", bs, ", ", sl, "], got ",
                doc_ids.sizes());
    at::Tensor other_doc = doc_ids.unsqueeze(2).ne(doc_ids.unsqueeze(1));  // [bs, sl, sl]
    masked = masked.logical_or(other_doc).view({bs, 1, 1, sl, sl});
  }
  scores.masked_fill_(masked, -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1);                               // [bs, hkv, g, sl, sl]
  at::Tensor out = at::matmul(probs.view({bs, hkv, group * sl, sl}), v_g);  // [bs, hkv, g*sl, hd]
  return out.view({bs, hkv, group, sl, hd})
      .permute({0, 3, 1, 2, 4})
      .reshape({bs, sl, hq, hd})
      .to(q.scalar_type());  // [bs, sl, hq, hd]
}

}  // namespace

std::string attention_backend_name(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kMath:
      return "math";
    case AttentionBackend::kFlash:
      return "flash";
    case AttentionBackend::kEfficient:
      return "efficient";
    case AttentionBackend::kCudnn:
      return "cudnn";
    case AttentionBackend::kSdpaAuto:
      return "sdpa";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown AttentionBackend");
}

AttentionBackend resolve_attention_backend(const std::string& name, const at::Device& device) {
  if (name == "math") return AttentionBackend::kMath;
  // SDPA's fused kernels: flash/efficient/cuDNN on CUDA, the flash-attention CPU kernel on CPU.
  if (name == "auto") return AttentionBackend::kSdpaAuto;
  AttentionBackend fused;
  if (name == "flash") {
    fused = AttentionBackend::kFlash;
  } else if (name == "efficient") {
    fused = AttentionBackend::kEfficient;
  } else if (name == "cudnn") {
    fused = AttentionBackend::kCudnn;
  } else {
    throw UserError("attention.backend: unknown backend '" + name +
                    "' (expected auto|math|flash|efficient|cudnn)");
  }
  if (fused == AttentionBackend::kCudnn && !ULYSSES_HAS_CUDNN_SDPA) {
    throw UserError("attention.backend: cudnn needs LibTorch >= 2.4");
  }
  if (fused != AttentionBackend::kFlash && !device.is_cuda()) {
    throw UserError("attention.backend: " + name +
                    " runs on CUDA only (on CPU use auto, flash or math)");
  }
  if (device.is_cuda() && !compat::kHasCuda) {
    throw UserError("attention.backend: " + name + " needs a CUDA build of LibTorch");
  }
  return fused;
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& doc_ids, AttentionBackend backend,
                           const DocumentRuns* documents) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "local_attention: q/k/v must be [bs, sl, heads, hd]");
  TORCH_CHECK(k.sizes() == v.sizes(), "local_attention: k ", k.sizes(), " and v ", v.sizes(),
              " differ");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "local_attention: q ", q.sizes(), " does not match k ", k.sizes());
  TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "local_attention: hq=", q.size(2),
              " is not a multiple of hkv=", k.size(2));
  if (backend == AttentionBackend::kMath) {
    record_attention_kernel("math");
    return math_attention(q, k, v, doc_ids);
  }
  return sdpa_attention(q, k, v, doc_ids, backend, kMaxDenseDocMaskBytes, documents);
}

std::vector<std::string> attention_kernels_used() {
  KernelRecord& record = kernel_record();
  std::lock_guard<std::mutex> lock(record.mutex);
  return record.kernels;
}

void record_attention_kernel(const std::string& kernel) {
  KernelRecord& record = kernel_record();
  std::lock_guard<std::mutex> lock(record.mutex);
  if (std::find(record.kernels.begin(), record.kernels.end(), kernel) == record.kernels.end()) {
    record.kernels.push_back(kernel);
  }
}

at::Tensor LocalAttentionCore::forward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const AttentionContext& ctx) {
  if (!ctx.run_core) return q * 0;  // skip_all_but_last: right shape, graph kept, no compute
  return local_attention(q, k, v, ctx.doc_ids, backend_, ctx.documents.get());
}

std::string LocalAttentionCore::name() const {
  return "local(" + attention_backend_name(backend_) + ")";
}

}  // namespace ulysses::model
