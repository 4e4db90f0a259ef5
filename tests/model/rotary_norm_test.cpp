// RoPE against per-element formulas (incl. llama3 scaling checked against values computed by hand
// from HF's _compute_llama3_parameters), and RMSNorm against its formula.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "common/error.h"
#include "model/rms_norm.h"
#include "model/rotary.h"

namespace ulysses::model {
namespace {

config::ModelOptions rope_options(int64_t hd, double theta) {
  config::ModelOptions o;
  o.hidden_size = hd * 2;
  o.num_heads = 2;
  o.head_dim = hd;
  o.rope_theta = theta;
  return o;
}

TEST(Rotary, InvFreqIsThetaPower) {
  RotaryEmbedding rope(rope_options(16, 10000.0));
  ASSERT_EQ(rope.inv_freq().numel(), 8);
  for (int64_t i = 0; i < 8; ++i) {
    const double expected = std::pow(10000.0, -2.0 * i / 16.0);
    EXPECT_NEAR(rope.inv_freq()[i].item<double>(), expected, 1e-6 * expected) << i;
  }
}

// On a GPU the tables are computed from a device copy of inv_freq kept from the first call: every
// call equals the CPU tables (rel 1e-6: the device's cos/sin round differently).
TEST(Rotary, CosSinOnCudaEqualCpuOnEveryCall) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  RotaryEmbedding rope(rope_options(8, 10000.0));
  const at::Tensor pos = at::arange(64, at::kLong).view({2, 32});  // [bs, T]
  const RotaryCosSin want = rope.forward(pos);
  for (int call = 0; call < 2; ++call) {
    const RotaryCosSin got = rope.forward(pos.to(at::kCUDA));
    ASSERT_TRUE(got.cos.is_cuda());
    EXPECT_TRUE(at::allclose(got.cos.cpu(), want.cos, 1e-6, 1e-6)) << "call " << call;
    EXPECT_TRUE(at::allclose(got.sin.cpu(), want.sin, 1e-6, 1e-6)) << "call " << call;
  }
}

TEST(Rotary, CosSinMatchPerElementFormulaAtGlobalPositions) {
  const int64_t hd = 8;
  RotaryEmbedding rope(rope_options(hd, 10000.0));
  // Second row: a shard starting at global position 100.
  at::Tensor pos = torch::tensor({{0, 1, 2, 3, 4, 5}, {100, 101, 102, 103, 104, 105}}, at::kLong);
  RotaryCosSin cs = rope.forward(pos);
  ASSERT_EQ(cs.cos.sizes(), (std::vector<int64_t>{2, 6, hd}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 6; ++t) {
      for (int64_t d = 0; d < hd; ++d) {
        const double angle = pos[b][t].item<double>() * std::pow(10000.0, -2.0 * (d % 4) / hd);
        // fp32 angles up to ~105 rad: error below 2e-5.
        EXPECT_NEAR(cs.cos[b][t][d].item<double>(), std::cos(angle), 2e-5);
        EXPECT_NEAR(cs.sin[b][t][d].item<double>(), std::sin(angle), 2e-5);
      }
    }
  }
}

TEST(Rotary, ApplyRotaryIsHalfSplitRotation) {
  const int64_t hd = 6, half = 3;
  torch::manual_seed(1);
  at::Tensor x = torch::randn({2, 3, 4, hd});  // [bs, T, heads, hd]
  at::Tensor cos = torch::randn({2, 3, hd}), sin = torch::randn({2, 3, hd});
  at::Tensor y = apply_rotary(x, cos, sin);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t d = 0; d < hd; ++d) {
          const double xd = x[b][t][h][d].item<double>();
          const double partner =
              d < half ? -x[b][t][h][d + half].item<double>() : x[b][t][h][d - half].item<double>();
          const double expected =
              xd * cos[b][t][d].item<double>() + partner * sin[b][t][d].item<double>();
          EXPECT_NEAR(y[b][t][h][d].item<double>(), expected, 1e-5);
        }
}

TEST(Rotary, DotProductDependsOnlyOnRelativePosition) {
  const int64_t hd = 8;
  RotaryEmbedding rope(rope_options(hd, 10000.0));
  torch::manual_seed(2);
  at::Tensor q = torch::randn({1, 1, 1, hd}), k = torch::randn({1, 1, 1, hd});
  auto dot_at = [&](int64_t pq, int64_t pk) {
    RotaryCosSin a = rope.forward(torch::tensor({{pq}}, at::kLong));
    RotaryCosSin b = rope.forward(torch::tensor({{pk}}, at::kLong));
    return (apply_rotary(q, a.cos, a.sin) * apply_rotary(k, b.cos, b.sin)).sum().item<double>();
  };
  EXPECT_NEAR(dot_at(7, 3), dot_at(57, 53), 1e-4);
  EXPECT_NEAR(dot_at(2, 2), (q * k).sum().item<double>(), 1e-5);
}

TEST(Rotary, Llama3ScalingMatchesHfFormula) {
  config::ModelOptions o = rope_options(128, 500000.0);
  o.rope_scaling_type = "llama3";
  o.rope_scaling_factor = 8.0;
  o.rope_low_freq_factor = 1.0;
  o.rope_high_freq_factor = 4.0;
  o.rope_original_max_position = 8192;
  RotaryEmbedding rope(o);
  ASSERT_EQ(rope.inv_freq().numel(), 64);
  // The HF rule per frequency, written out in double.
  for (int64_t i = 0; i < 64; ++i) {
    const double inv = std::pow(500000.0, -2.0 * i / 128.0);
    const double wavelen = 2 * M_PI / inv;
    double expected = inv;  // wavelen < 8192 / 4: unchanged
    if (wavelen > 8192.0) {
      expected = inv / 8.0;
    } else if (wavelen >= 2048.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * inv / 8.0 + smooth * inv;
    }
    EXPECT_NEAR(rope.inv_freq()[i].item<double>(), expected, 2e-6 * expected) << i;
  }
  // Values computed by hand (python, double) from the same formula.
  const std::pair<int64_t, double> by_hand[] = {{0, 1.0},
                                                {20, 0.016560440080994446},   // high freq: kept
                                                {32, 5.248461609929547e-04},  // smoothed band
                                                {40, 3.428102195952591e-05},  // low freq: / 8
                                                {63, 3.068925988914511e-07}};
  for (const auto& [i, value] : by_hand) {
    EXPECT_NEAR(rope.inv_freq()[i].item<double>(), value, 2e-6 * value) << i;
  }
}

TEST(Rotary, UnknownScalingTypeIsUserError) {
  config::ModelOptions o = rope_options(8, 10000.0);
  o.rope_scaling_type = "longrope";  // yarn, linear, dynamic: tests/model/rope_scaling_test.cpp
  EXPECT_THROW(RotaryEmbedding rope(o), UserError);
  o = rope_options(7, 10000.0);
  EXPECT_THROW(RotaryEmbedding rope(o), UserError);  // odd head dim
}

TEST(RMSNorm, MatchesFormula) {
  const double eps = 1e-5;
  RMSNorm norm(8, eps);
  EXPECT_TRUE(at::equal(norm->weight, torch::ones({8})));
  torch::manual_seed(4);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::randn({8}));
  }
  at::Tensor x = torch::randn({2, 3, 8}) * 3;
  at::Tensor y = norm(x);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t) {
      double mean_sq = 0;
      for (int64_t d = 0; d < 8; ++d) mean_sq += std::pow(x[b][t][d].item<double>(), 2) / 8;
      for (int64_t d = 0; d < 8; ++d) {
        const double expected =
            norm->weight[d].item<double>() * x[b][t][d].item<double>() / std::sqrt(mean_sq + eps);
        EXPECT_NEAR(y[b][t][d].item<double>(), expected, 1e-5 * (1 + std::abs(expected)));
      }
    }
}

TEST(RMSNorm, Bf16InputComputesInFp32) {
  RMSNorm norm(16, 1e-5);
  norm->to(at::kBFloat16);
  torch::manual_seed(6);
  at::Tensor x = torch::randn({4, 16}).to(at::kBFloat16);
  at::Tensor y = norm(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  at::Tensor xf = x.to(at::kDouble);
  at::Tensor ref = xf / (xf.pow(2).mean(-1, true) + 1e-5).sqrt();
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), ref, 1e-2, 1e-2));
}

// The norm's own backward against autograd through the formula's ops in float64 (HF's
// LlamaRMSNorm, composed): gradients of x and of the weight, for fp32 (relative 1e-5: fp32
// rounding of a few ops) and bf16 inputs and weights (relative 2e-2: the gradients are rounded to
// bf16, 2^-9, after sums over 64 elements in fp32), with a weight far from its init of ones.
TEST(RMSNorm, OwnBackwardMatchesAutogradThroughTheFormulaInFloat64) {
  const double eps = 1e-5;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    torch::manual_seed(11);
    RMSNorm norm(64, eps);
    {
      torch::NoGradGuard no_grad;
      norm->weight.copy_(torch::randn({64}) * 0.5 + 1);
    }
    norm->to(dtype);
    const at::Tensor x0 = (torch::randn({2, 5, 64}) * 2).to(dtype);
    const at::Tensor grad_out = torch::randn({2, 5, 64}).to(dtype);
    at::Tensor x = x0.clone().requires_grad_(true);
    norm(x).backward(grad_out);

    at::Tensor xr = x0.to(at::kDouble).requires_grad_(true);
    at::Tensor wr = norm->weight.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor yr = wr * (xr * at::rsqrt(xr.pow(2).mean(-1, true) + eps));
    yr.backward(grad_out.to(at::kDouble));

    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    auto rel = [](const at::Tensor& got, const at::Tensor& want) {
      return ((got.to(at::kDouble) - want).norm() / want.norm()).item<double>();
    };
    EXPECT_EQ(x.grad().scalar_type(), dtype);
    EXPECT_EQ(norm->weight.grad().scalar_type(), dtype);
    EXPECT_LT(rel(x.grad(), xr.grad()), tol) << c10::toString(dtype);
    EXPECT_LT(rel(norm->weight.grad(), wr.grad()), tol) << c10::toString(dtype);
  }
}

// Only the gradients asked for are computed: a frozen weight, or an input without gradient.
TEST(RMSNorm, GradientOfOnlyWhatRequiresIt) {
  RMSNorm norm(8, 1e-5);
  norm->weight.requires_grad_(false);
  at::Tensor x = torch::randn({3, 8}).requires_grad_(true);
  norm(x).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(norm->weight.grad().defined());
  norm->weight.requires_grad_(true);
  norm(torch::randn({3, 8})).sum().backward();
  EXPECT_TRUE(norm->weight.grad().defined());
}

}  // namespace
}  // namespace ulysses::model
