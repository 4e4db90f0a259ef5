// Wide-result GEMMs (see wide_matmul.h).
#include "sp/wide_matmul.h"

#include <algorithm>

#include "common/torch_compat.h"

namespace ulysses::sp {
namespace {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Whether one GEMM can take a's and b's dtype and give `result` dtype here.
bool gemm_writes(const at::Tensor& a, at::ScalarType result) {
#if ULYSSES_HAS_GEMM_OUT_DTYPE
  return a.is_cuda() && is_half(a.scalar_type()) && result == at::kFloat;
#else
  (void)a;
  (void)result;
  return false;
#endif
}

}  // namespace

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
#if ULYSSES_HAS_GEMM_OUT_DTYPE
  if (gemm_writes(a, sum.scalar_type())) {
    at::addmm_out(sum, sum, a, b, sum.scalar_type());  // [m, n] fp32 += a @ b, in the GEMM
    return;
  }
#endif
  const int64_t rows = a.size(0);
  for (int64_t row = 0; row < rows; row += kProductRowBlock) {
    const int64_t block = std::min(kProductRowBlock, rows - row);
    sum.narrow(0, row, block).add_(at::mm(a.narrow(0, row, block), b));  // [block, n]
  }
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
