// What the fused kernels take (see fused_kernels.h): the row plan and the *_fusable predicates, in
// every build; in a build without the kernels, the entry points that refuse to run.
#include "kernels/fused_kernels.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ulysses::kernels {
namespace {

constexpr int64_t kMaxThreads = 512;     // the kernels' __launch_bounds__
constexpr int64_t kMaxRowElements = 32;  // iters * vec: registers per array and thread

bool supported_dtype(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat;
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

bool fused_kernels_built() {
#ifdef ULYSSES_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

RowPlan rms_norm_row_plan(int64_t h, int64_t element_size, bool aligned) {
  TORCH_CHECK(h >= 1 && (element_size == 2 || element_size == 4),
              "rms_norm_row_plan: h ", h, ", element size ", element_size);
  const int64_t full_vec = 16 / element_size;
  const int64_t vec = (aligned && h % full_vec == 0) ? full_vec : 1;
  const int64_t loads = h / vec;                                     // per row
  const int64_t threads = std::min(kMaxThreads, (loads + 31) / 32 * 32);
  const int64_t needed = (loads + threads - 1) / threads;            // loads per thread
  RowPlan plan;
  plan.vec = static_cast<int>(vec);
  plan.threads = static_cast<int>(threads);
  for (int64_t iters = 1; iters <= 8 && iters * vec <= kMaxRowElements; iters *= 2) {
    if (iters >= needed) {
      plan.iters = static_cast<int>(iters);
      break;
    }
  }
  return plan;
}

bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight) {
  if (!fused_kernels_built() || !x.defined() || !weight.defined()) return false;
  if (!x.is_cuda() || weight.device() != x.device()) return false;
  if (!supported_dtype(x.scalar_type()) || weight.scalar_type() != x.scalar_type()) return false;
  if (x.dim() < 1 || weight.dim() != 1 || x.size(-1) != weight.size(0) || x.numel() == 0) {
    return false;
  }
  if (!x.is_contiguous() || !weight.is_contiguous()) return false;
  return rms_norm_row_plan(x.size(-1), x.element_size(), aligned16(x) && aligned16(weight))
      .supported();
}

bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up) {
  if (!fused_kernels_built() || !gate.defined() || !up.defined()) return false;
  if (!gate.is_cuda() || up.device() != gate.device()) return false;
  if (!supported_dtype(gate.scalar_type()) || up.scalar_type() != gate.scalar_type()) return false;
  if (gate.sizes() != up.sizes() || gate.numel() == 0) return false;
  return gate.is_contiguous() && up.is_contiguous();
}

#ifndef ULYSSES_FUSED_KERNELS
namespace {
[[noreturn]] void not_built(const char* what) {
  TORCH_CHECK(false, what, ": this build has no fused CUDA kernels (not built with CUDA and nvcc)");
}
}  // namespace

RmsNormOutput rms_norm_forward(const at::Tensor&, const at::Tensor&, double) {
  not_built("rms_norm_forward");
}

RmsNormGrads rms_norm_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, bool, bool) {
  not_built("rms_norm_backward");
}

at::Tensor swiglu_forward(const at::Tensor&, const at::Tensor&) { not_built("swiglu_forward"); }

SwigluGrads swiglu_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  not_built("swiglu_backward");
}
#endif

}  // namespace ulysses::kernels
