// The one interface through which a decoder layer computes softmax(QK^T)V, the local
// (single-process) causal attention every core ends in, and the choice of its backend.
// The layer keeps the q/k/v projections, RoPE and o_proj; only the core sits behind this
// interface, so Ulysses SP (src/sp/) plugs in as another AttentionCore.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "common/document_runs.h"

namespace ulysses::model {

// What a core needs besides q/k/v, per call.
struct AttentionContext {
  at::Tensor doc_ids;  // [bs, sl] int64 full-sequence document ids (packed batches) or undefined
  // document_runs(doc_ids) found on the host (data::Batch::documents), shared by every layer; null
  // when not packed or not known (then the model finds them once per forward when needed).
  std::shared_ptr<const DocumentRuns> documents;
  int64_t layer_index = 0;  // set by the model for each layer
  bool run_core = true;     // false: skip_all_but_last debug mode, return zeros of the right shape
};

// Who computes softmax(QK^T)V for a layer. Implementations must honour ctx.run_core.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // q [bs, T, hq, hd], k/v [bs, T, hkv, hd] (RoPE applied) -> [bs, T, hq, hd]; T = local tokens.
  virtual at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionContext& ctx) = 0;
  virtual std::string name() const = 0;
};

// How local_attention computes. kMath (the reference the tests compare against) runs everywhere
// and materialises scores; the others go through at::scaled_dot_product_attention with one kernel
// family selected: on CUDA flash / efficient / cuDNN, on CPU the fused flash-attention kernel.
// kSdpaAuto (what "auto" resolves to on every device) lets SDPA pick its best kernel per call.
enum class AttentionBackend { kMath, kFlash, kEfficient, kCudnn, kSdpaAuto };

// "math" | "flash" | "efficient" | "cudnn" | "sdpa".
std::string attention_backend_name(AttentionBackend backend);

// Maps the attention.backend config value to a backend usable on `device`: "auto" -> kSdpaAuto
// (CPU and CUDA); "math" -> kMath; "flash" -> kFlash (CUDA or CPU); "efficient" | "cudnn" -> that
// CUDA kernel family. Throws UserError("attention.backend: ...") for an unknown name or a backend
// unavailable on this device or build (e.g. "attention.backend: efficient runs on CUDA only").
AttentionBackend resolve_attention_backend(const std::string& name, const at::Device& device);

// Causal attention over the whole given sequence: position i attends to j <= i (and, when doc_ids
// is defined, only to j with doc_ids[b, j] == doc_ids[b, i]). GQA by grouping: query head i uses
// kv head i / (hq / hkv). Scale 1/sqrt(hd). Numerically stable softmax; for fp16/bf16 inputs the
// math backend accumulates in fp32 and returns the input dtype. Differentiable.
//   q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd] -> [bs, sl, hq, hd]
// The math backend materializes scores [bs, hq, sl, sl] (fp32 for fp16/bf16 inputs).
// Fused backends run GQA natively and, with doc_ids, either pass a [bs, 1, sl, sl] mask or, above
// kMaxDenseDocMaskBytes, run each document on its own (sdpa_attention.h).
// `documents` (null or document_runs(doc_ids), found on the host) spares the fused backends
// reading doc_ids on the host (sdpa_attention.h).
// REQUIRES: q, k, v on one device with one dtype; hq % hkv == 0; doc_ids [bs, sl] int64 or
// undefined; a backend that resolve_attention_backend accepts for that device.
// Throws UserError("attention.backend: ...") when a fused kernel cannot take these inputs
// (e.g. flash with fp32, or on CUDA auto with no fused kernel for them).
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& doc_ids, AttentionBackend backend,
                           const DocumentRuns* documents = nullptr);

// The attention kernels this process has run, each named once, in the order first used: "math"
// (the math backend), or the kernel SDPA chose for a fused backend: "flash", "efficient",
// "cudnn", "sdpa_math" (SDPA's own math kernel, which only auto on CPU may choose). Thread-safe.
std::vector<std::string> attention_kernels_used();

// Adds `kernel` to attention_kernels_used() unless it is there. Thread-safe.
void record_attention_kernel(const std::string& kernel);

// local_attention on the tokens given (no SP). With ctx.run_core == false returns q * 0 (zeros of
// the right shape that keep the graph connected, so no attention compute is done).
class LocalAttentionCore : public AttentionCore {
 public:
  explicit LocalAttentionCore(AttentionBackend backend = AttentionBackend::kMath)
      : backend_(backend) {}
  // q [bs, T, hq, hd], k/v [bs, T, hkv, hd] -> [bs, T, hq, hd]
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionContext& ctx) override;
  std::string name() const override;  // "local(<backend>)"
  AttentionBackend backend() const { return backend_; }

 private:
  AttentionBackend backend_;
};

}  // namespace ulysses::model
