// GEMMs whose result is wider than their operands (fp32 from bf16/fp16 operands), for sums over
// sequence tiles: the weight gradients of TiledMLP and TiledLogitsLoss, and the loss's logits.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace ulysses::sp {

// Rows of `a` whose product add_matmul_ makes at a time when it cannot accumulate inside the GEMM.
inline constexpr int64_t kProductRowBlock = 8192;

// sum [m, n] += a [m, k] @ b [k, n], in place. a and b share one dtype; sum has that dtype, or is
// fp32 with bf16/fp16 operands. Same dtype: one GEMM that adds into sum. fp32 sum of bf16/fp16
// operands on CUDA with LibTorch >= 2.8: one GEMM that accumulates in fp32 and adds into sum in
// fp32, so nothing is rounded to the operands' dtype. Elsewhere: the product of kProductRowBlock
// rows of a at a time in the operands' dtype (accumulated in fp32 inside the GEMM, rounded once),
// added to sum (a temporary of at most kProductRowBlock x n). No device sync.
// REQUIRES: the shapes and dtypes above; sum contiguous (TORCH_CHECK).
void add_matmul_(at::Tensor& sum, const at::Tensor& a, const at::Tensor& b);

// a [m, k] @ b [k, n] -> [m, n] in `dtype`: a's and b's dtype, or fp32 for bf16/fp16 operands.
// fp32 from bf16/fp16 on CUDA with LibTorch >= 2.8: the GEMM writes fp32 (no rounding to the
// operands' dtype, no second pass over the result); elsewhere the product in the operands' dtype,
// then converted. REQUIRES: a and b share one dtype (TORCH_CHECK).
at::Tensor matmul_as(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype);

}  // namespace ulysses::sp
