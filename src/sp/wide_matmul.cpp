// Wide-result GEMMs (see wide_matmul.h).
#include "sp/wide_matmul.h"

#include <algorithm>

#include "common/torch_compat.h"

namespace ulysses::sp {
namespace {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Whether one GEMM can take a's and b's dtype and give `result` dtype here (mm with out_dtype).
bool gemm_writes(const at::Tensor& a, at::ScalarType result) {
#if ULYSSES_HAS_GEMM_OUT_DTYPE
  return a.is_cuda() && is_half(a.scalar_type()) && result == at::kFloat;
#else
  (void)a;
  (void)result;
  return false;
#endif
}

// Whether addmm with out_dtype accepts an fp32 `self` (and out) with a's half dtype on a's device:
// asked once per process with a 16 x 16 call, since the releases that have out_dtype differ here
// (2.8 and 2.9 require `self` in the operands' dtype on CUDA) and no version macro says which.
bool gemm_accumulates_wide(const at::Tensor& a) {
#if ULYSSES_HAS_GEMM_OUT_DTYPE
  static const bool accepted = [&a] {
    const at::Tensor operand = at::ones({16, 16}, a.options());                  // [16, 16] half
    at::Tensor sum = at::zeros({16, 16}, a.options().dtype(at::kFloat));         // [16, 16] fp32
    try {
      at::addmm_out(sum, sum, operand, operand, at::kFloat);
    } catch (const c10::Error&) {
      return false;
    }
    return true;
  }();
  return accepted;
#else
  (void)a;
  return false;
#endif
}

}  // namespace

WideSum wide_sum_of(const at::Tensor& a) {
  if (!gemm_writes(a, at::kFloat)) return WideSum::kNarrowBlocks;
  return gemm_accumulates_wide(a) ? WideSum::kInGemm : WideSum::kWideBlocks;
}

void add_matmul_wide_(WideSum how, at::Tensor& sum, const at::Tensor& a, const at::Tensor& b,
                      int64_t row_block) {
  TORCH_CHECK(sum.scalar_type() == at::kFloat && is_half(a.scalar_type()) &&
                  b.scalar_type() == a.scalar_type(),
              "add_matmul_wide_: an fp32 sum of bf16/fp16 products, got a ", sum.scalar_type(),
              " sum of ", a.scalar_type(), " x ", b.scalar_type());
  TORCH_CHECK(sum.is_contiguous(), "add_matmul_wide_: the sum must be contiguous");
  TORCH_CHECK(row_block > 0, "add_matmul_wide_: row_block ", row_block);
  if (how == WideSum::kInGemm) {
    TORCH_CHECK(wide_sum_of(a) == WideSum::kInGemm,
                "add_matmul_wide_: this LibTorch cannot accumulate ", a.scalar_type(),
                " products into an fp32 sum inside the GEMM on ", a.device());
#if ULYSSES_HAS_GEMM_OUT_DTYPE
    at::addmm_out(sum, sum, a, b, at::kFloat);  // [m, n] fp32 += a @ b, in the GEMM
#endif
    return;
  }
  const int64_t rows = a.size(0);
  const bool wide = how == WideSum::kWideBlocks;
  const bool in_gemm = wide && gemm_writes(a, at::kFloat);
  // Wide blocks where no GEMM writes fp32 from half operands: exact fp32 copies of the operands.
  const at::Tensor b_wide = wide && !in_gemm ? b.to(at::kFloat) : at::Tensor();  // [k, n] fp32
  at::Tensor product;  // [min(row_block, m), n] fp32, reused by every block (kWideBlocks on CUDA)
  if (in_gemm) product = at::empty({std::min(row_block, rows), b.size(1)}, sum.options());
  for (int64_t row = 0; row < rows; row += row_block) {
    const int64_t block = std::min(row_block, rows - row);
    const at::Tensor a_block = a.narrow(0, row, block);  // [block, k]
    at::Tensor sum_block = sum.narrow(0, row, block);    // [block, n] fp32
    if (!wide) {
      sum_block.add_(at::mm(a_block, b));  // [block, n] in the operands' dtype
    } else if (in_gemm) {
#if ULYSSES_HAS_GEMM_OUT_DTYPE
      at::Tensor block_product = product.narrow(0, 0, block);  // [block, n] fp32
      at::mm_out(block_product, a_block, b, at::kFloat);
      sum_block.add_(block_product);
#endif
    } else {
      sum_block.add_(at::mm(a_block.to(at::kFloat), b_wide));  // [block, n] fp32
    }
  }
}

void add_matmul_(at::Tensor& sum, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "add_matmul_: operands ", a.scalar_type(),
              " and ", b.scalar_type());
  TORCH_CHECK(sum.scalar_type() == a.scalar_type() ||
                  (sum.scalar_type() == at::kFloat && is_half(a.scalar_type())),
              "add_matmul_: a ", sum.scalar_type(), " sum of ", a.scalar_type(), " products");
  TORCH_CHECK(sum.is_contiguous(), "add_matmul_: the sum must be contiguous");
  if (sum.scalar_type() == a.scalar_type()) {
    sum.addmm_(a, b);  // [m, n]
    return;
  }
  add_matmul_wide_(wide_sum_of(a), sum, a, b);
}

at::Tensor matmul_as(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "matmul_as: operands ", a.scalar_type(),
              " and ", b.scalar_type());
#if ULYSSES_HAS_GEMM_OUT_DTYPE
  if (dtype != a.scalar_type() && gemm_writes(a, dtype)) return at::mm(a, b, dtype);  // [m, n]
#endif
  return at::mm(a, b).to(dtype);  // [m, n]; no copy when dtype is the operands'
}

}  // namespace ulysses::sp
