// Host-side checks the fused kernels' files share: the dtypes they take, 16-byte alignment, and
// the refusal of a build without the kernels.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace ulysses::kernels {

// bf16 or fp16: the dtypes whose statistics the ops compute in fp32.
inline bool is_half_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// The dtypes the kernels are instantiated for: bf16, fp16, fp32.
inline bool kernel_dtype(at::ScalarType t) { return is_half_dtype(t) || t == at::kFloat; }

// True when t's data starts on a 16-byte boundary (the kernels' vector loads).
inline bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// A kernel's entry point in a build without the kernels.
[[noreturn]] inline void refuse_without_kernels(const char* what) {
  TORCH_CHECK(false, what, ": this build has no fused CUDA kernels (not built with CUDA and nvcc)");
}

}  // namespace ulysses::kernels
