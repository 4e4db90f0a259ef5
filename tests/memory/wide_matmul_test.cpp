// add_matmul_'s ways of summing bf16/fp16 products into an fp32 sum, each held to the fp64
// reference: the fp32-product blocks (the way CUDA takes where addmm cannot accumulate into an fp32
// `self`) within fp32 accumulation (rel 1e-5), the operand-dtype blocks (the CPU way) within one
// rounding of the operands' dtype (bf16 rel 8e-3), for one block and for blocks with a partial last.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

#include "sp/wide_matmul.h"

namespace ulysses {
namespace {

constexpr double kFp32SumRelTol = 1e-5;  // fp32 products, fp32 accumulation over k = 96
constexpr double kBf16RelTol = 8e-3;     // one bf16 rounding of each block's product (2^-8 = 3.9e-3)

at::Tensor randn(at::IntArrayRef sizes, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, gen, at::kFloat);
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor want64 = want.to(at::kDouble);
  return ((got.to(at::kDouble) - want64).norm() / want64.norm()).item<double>();
}

struct Case {
  at::Tensor start;  // [m, n] fp32, the sum before the call
  at::Tensor a;      // [m, k] half
  at::Tensor b;      // [k, n] half
  at::Tensor want;   // [m, n] fp64: start + a @ b
};

Case make_case(at::ScalarType half) {
  const int64_t m = 10, k = 96, n = 7;
  Case c;
  c.start = randn({m, n}, 11);
  c.a = randn({m, k}, 12).to(half);
  c.b = randn({k, n}, 13).to(half);
  c.want = c.start.to(at::kDouble) + at::mm(c.a.to(at::kDouble), c.b.to(at::kDouble));
  return c;
}

at::Tensor run(sp::WideSum how, const Case& c, int64_t row_block) {
  at::Tensor sum = c.start.clone();
  sp::add_matmul_wide_(how, sum, c.a, c.b, row_block);
  return sum;
}

TEST(WideSumOf, CpuSumsProductsInTheOperandsDtype) {
  EXPECT_EQ(sp::wide_sum_of(at::zeros({2, 2}, at::kBFloat16)), sp::WideSum::kNarrowBlocks);
  EXPECT_EQ(sp::wide_sum_of(at::zeros({2, 2}, at::kHalf)), sp::WideSum::kNarrowBlocks);
}

class WideBlocks : public testing::TestWithParam<int64_t> {};

// The way CUDA builds take when addmm rejects an fp32 `self` with half operands (LibTorch 2.8,
// 2.9): products written in fp32 and added block by block, nothing rounded to bf16/fp16.
TEST_P(WideBlocks, MatchTheFp64ReferenceWithinFp32Accumulation) {
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    const Case c = make_case(half);
    const at::Tensor got = run(sp::WideSum::kWideBlocks, c, GetParam());
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_LT(relative_error(got, c.want), kFp32SumRelTol) << half;
  }
}

// The CPU way: each block's product rounded once to the operands' dtype, then added in fp32.
TEST_P(WideBlocks, NarrowBlocksMatchTheFp64ReferenceWithinOneBf16Rounding) {
  const Case c = make_case(at::kBFloat16);
  const double error = relative_error(run(sp::WideSum::kNarrowBlocks, c, GetParam()), c.want);
  EXPECT_LT(error, kBf16RelTol);
  // The case tells the two ways apart: a bf16 product is off by far more than fp32 accumulation.
  EXPECT_GT(error, 10 * kFp32SumRelTol);
}

INSTANTIATE_TEST_SUITE_P(RowBlocks, WideBlocks,
                         testing::Values(int64_t{3}, int64_t{10}, sp::kProductRowBlock));

TEST(AddMatmul, CpuFp32SumOfBf16IsTheNarrowBlocksSum) {
  const Case c = make_case(at::kBFloat16);
  at::Tensor sum = c.start.clone();
  sp::add_matmul_(sum, c.a, c.b);
  EXPECT_TRUE(at::equal(sum, run(sp::WideSum::kNarrowBlocks, c, sp::kProductRowBlock)));
}

TEST(AddMatmul, InGemmIsRefusedWhereTheLibraryCannot) {
  const Case c = make_case(at::kBFloat16);
  EXPECT_THROW(run(sp::WideSum::kInGemm, c, sp::kProductRowBlock), c10::Error);
}

TEST(AddMatmul, RefusesMismatchedDtypesAndBadRowBlocks) {
  const Case c = make_case(at::kBFloat16);
  at::Tensor sum = c.start.clone();
  EXPECT_THROW(sp::add_matmul_(sum, c.a, c.b.to(at::kHalf)), c10::Error);
  EXPECT_THROW(sp::add_matmul_wide_(sp::WideSum::kWideBlocks, sum, c.a, c.b, 0), c10::Error);
  at::Tensor half_sum = c.start.to(at::kHalf);
  EXPECT_THROW(sp::add_matmul_(half_sum, c.a, c.b), c10::Error);
}

}  // namespace
}  // namespace ulysses
