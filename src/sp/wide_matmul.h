// GEMMs whose result is wider than their operands (fp32 from bf16/fp16 operands), for sums over
// sequence tiles: the weight gradients of TiledMLP and TiledLogitsLoss, and the loss's logits.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace ulysses::sp {

// Rows of `a` whose product add_matmul_ makes at a time when it cannot accumulate inside the GEMM.
inline constexpr int64_t kProductRowBlock = 8192;

// How an fp32 sum of bf16/fp16 products is formed.
enum class WideSum {
  // One GEMM that accumulates in fp32 and adds into the fp32 sum (addmm with out_dtype and an fp32
  // `self`): CUDA, where this LibTorch accepts it (checked once per process by a 16 x 16 call;
  // LibTorch 2.8 and 2.9 reject an fp32 `self` with half operands).
  kInGemm,
  // Per block of kProductRowBlock rows of a: the GEMM writes the product in fp32 into a temporary
  // (mm with out_dtype on CUDA, LibTorch >= 2.8; elsewhere fp32 copies of the operand blocks), which
  // is added to the sum. Nothing is rounded to the operands' dtype.
  kWideBlocks,
  // Per block of kProductRowBlock rows of a: the product in the operands' dtype (accumulated in fp32
  // inside the GEMM, rounded once), added to the sum.
  kNarrowBlocks,
};

// The way add_matmul_ sums products of `a`'s dtype and device into an fp32 sum: kInGemm on CUDA
// where accepted, else kWideBlocks on CUDA with LibTorch >= 2.8, else kNarrowBlocks (CPU always).
// The first CUDA call may run the 16 x 16 check on a's device.
WideSum wide_sum_of(const at::Tensor& a);

// sum [m, n] += a [m, k] @ b [k, n], in place. a and b share one dtype; sum has that dtype, or is
// fp32 with bf16/fp16 operands. Same dtype: one GEMM that adds into sum. fp32 sum of bf16/fp16
// operands: the way wide_sum_of(a) names (a temporary of at most kProductRowBlock x n for the
// block ways). No device sync.
// REQUIRES: the shapes and dtypes above; sum contiguous (TORCH_CHECK).
void add_matmul_(at::Tensor& sum, const at::Tensor& a, const at::Tensor& b);

// add_matmul_ for an fp32 sum of bf16/fp16 products, the way `how` says, `row_block` rows of a
// at a time for the block ways. For tests, which hold every way to the same reference.
// REQUIRES: as add_matmul_, with sum fp32 and a, b bf16/fp16; row_block > 0; kInGemm only where
// wide_sum_of(a) returns it (TORCH_CHECK).
void add_matmul_wide_(WideSum how, at::Tensor& sum, const at::Tensor& a, const at::Tensor& b,
                      int64_t row_block = kProductRowBlock);

// a [m, k] @ b [k, n] -> [m, n] in `dtype`: a's and b's dtype, or fp32 for bf16/fp16 operands.
// fp32 from bf16/fp16 on CUDA with LibTorch >= 2.8: the GEMM writes fp32 (no rounding to the
// operands' dtype, no second pass over the result); elsewhere the product in the operands' dtype,
// then converted. REQUIRES: a and b share one dtype (TORCH_CHECK).
at::Tensor matmul_as(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype);

}  // namespace ulysses::sp
