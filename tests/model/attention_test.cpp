// local_attention (math backend) against a naive per-head, per-query loop in double precision;
// backend resolution; SDPA on CPU against math; LocalAttentionCore's skip mode.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/torch_compat.h"
#include "model/attention_core.h"

#include <ATen/SDPBackend.h>

namespace ulysses::model {
namespace {

// softmax over {j <= i, same doc} of q_i . k_j / sqrt(hd), one head at a time, in double.
// q [bs, sl, hq, hd], k/v [bs, sl, hkv, hd], doc_ids [bs, sl] or undefined -> [bs, sl, hq, hd] f64
at::Tensor naive_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                           const at::Tensor& doc_in) {
  at::Tensor q = q_in.to(at::kDouble).contiguous(), k = k_in.to(at::kDouble).contiguous(),
             v = v_in.to(at::kDouble).contiguous();
  const int64_t bs = q.size(0), sl = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2);
  at::Tensor out = at::zeros(q.sizes(), at::kDouble);
  auto qa = q.accessor<double, 4>(), ka = k.accessor<double, 4>(), va = v.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t head = 0; head < hq; ++head) {
      const int64_t kv_head = head / (hq / hkv);
      for (int64_t i = 0; i < sl; ++i) {
        std::vector<double> scores;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= i; ++j) {
          if (doc_in.defined() && doc_in[b][j].item<int64_t>() != doc_in[b][i].item<int64_t>()) {
            continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qa[b][i][head][d] * ka[b][j][kv_head][d];
          scores.push_back(dot / std::sqrt(static_cast<double>(hd)));
          keys.push_back(j);
        }
        double max_score = -std::numeric_limits<double>::infinity();
        for (double s : scores) max_score = std::max(max_score, s);
        double denom = 0;
        for (double& s : scores) denom += (s = std::exp(s - max_score));
        for (size_t n = 0; n < keys.size(); ++n) {
          for (int64_t d = 0; d < hd; ++d) {
            oa[b][i][head][d] += scores[n] / denom * va[b][keys[n]][kv_head][d];
          }
        }
      }
    }
  }
  return out;
}

// [bs, sl] documents: batch 0 = {0,0,0,1,1,2,2,2,2}, batch 1 = one document.
at::Tensor example_doc_ids(int64_t bs, int64_t sl) {
  at::Tensor doc = at::zeros({bs, sl}, at::kLong);
  for (int64_t j = 0; j < sl; ++j) doc[0][j] = j < 3 ? 0 : (j < 5 ? 1 : 2);
  return doc;
}

// (hkv, with doc_ids) with hq = 8: GQA 8/2, MQA 8/1, MHA 8/8.
class MathAttentionTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(MathAttentionTest, MatchesNaiveLoop) {
  const auto [hkv, with_docs] = GetParam();
  const int64_t bs = 2, sl = 9, hq = 8, hd = 4;
  torch::manual_seed(7);
  at::Tensor q = torch::randn({bs, sl, hq, hd});   // [bs, sl, hq, hd]
  at::Tensor k = torch::randn({bs, sl, hkv, hd});  // [bs, sl, hkv, hd]
  at::Tensor v = torch::randn({bs, sl, hkv, hd});  // [bs, sl, hkv, hd]
  at::Tensor doc = with_docs ? example_doc_ids(bs, sl) : at::Tensor();
  at::Tensor out = local_attention(q, k, v, doc, AttentionBackend::kMath);
  ASSERT_EQ(out.sizes(), q.sizes());
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  at::Tensor ref = naive_attention(q, k, v, doc);
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), ref, /*rtol=*/1e-5, /*atol=*/1e-5))
      << "max abs diff " << (out.to(at::kDouble) - ref).abs().max().item<double>();
}

INSTANTIATE_TEST_SUITE_P(Heads, MathAttentionTest,
                         ::testing::Combine(::testing::Values<int64_t>(2, 1, 8),
                                            ::testing::Bool()));

TEST(MathAttention, FirstTokenOfEachDocumentSeesOnlyItself) {
  const int64_t bs = 2, sl = 9;
  torch::manual_seed(3);
  at::Tensor q = torch::randn({bs, sl, 4, 8}), k = torch::randn({bs, sl, 2, 8}),
             v = torch::randn({bs, sl, 2, 8});
  at::Tensor out = local_attention(q, k, v, example_doc_ids(bs, sl), AttentionBackend::kMath);
  for (int64_t start : {0, 3, 5}) {
    // query heads 0,1 use kv head 0; 2,3 use kv head 1
    EXPECT_TRUE(at::allclose(out[0][start][1], v[0][start][0], 1e-6, 1e-6)) << start;
    EXPECT_TRUE(at::allclose(out[0][start][3], v[0][start][1], 1e-6, 1e-6)) << start;
  }
}

TEST(MathAttention, StableForLargeScores) {
  torch::manual_seed(11);
  at::Tensor q = torch::randn({1, 16, 4, 8}) * 100, k = torch::randn({1, 16, 2, 8}) * 100,
             v = torch::randn({1, 16, 2, 8});
  at::Tensor out = local_attention(q, k, v, at::Tensor(), AttentionBackend::kMath);
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
  // Scores are ~1e4 here; fp32 rounding of the scores bounds the agreement.
  EXPECT_TRUE(
      at::allclose(out.to(at::kDouble), naive_attention(q, k, v, at::Tensor()), 1e-3, 1e-3));
}

TEST(MathAttention, Bf16AccumulatesInFp32AndReturnsBf16) {
  torch::manual_seed(5);
  at::Tensor q = torch::randn({2, 12, 4, 8}), k = torch::randn({2, 12, 2, 8}),
             v = torch::randn({2, 12, 2, 8});
  at::Tensor q16 = q.to(at::kBFloat16), k16 = k.to(at::kBFloat16), v16 = v.to(at::kBFloat16);
  at::Tensor out = local_attention(q16, k16, v16, at::Tensor(), AttentionBackend::kMath);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  // Reference on the same bf16-rounded inputs; bf16 output rounding is 2^-8 relative.
  at::Tensor ref = naive_attention(q16, k16, v16, at::Tensor());
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), ref, 1e-2, 1e-2));
}

TEST(MathAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(9);
  const auto opts = torch::TensorOptions().dtype(at::kDouble);
  at::Tensor q = torch::randn({1, 6, 4, 3}, opts).requires_grad_(),
             k = torch::randn({1, 6, 2, 3}, opts).requires_grad_(),
             v = torch::randn({1, 6, 2, 3}, opts).requires_grad_();
  at::Tensor doc = torch::tensor({{0, 0, 1, 1, 1, 1}}, at::kLong);
  at::Tensor weights = torch::randn({1, 6, 4, 3}, opts);  // loss = sum(out * weights)
  auto loss_of = [&]() {
    return (local_attention(q, k, v, doc, AttentionBackend::kMath) * weights).sum();
  };
  loss_of().backward();
  const double eps = 1e-6;
  for (at::Tensor* t : {&q, &k, &v}) {
    at::Tensor flat = t->detach().view({-1});
    at::Tensor grad = t->grad().view({-1});
    for (int64_t idx = 0; idx < flat.numel(); idx += 5) {
      torch::NoGradGuard no_grad;
      const double saved = flat[idx].item<double>();
      flat[idx] = saved + eps;
      const double plus = loss_of().item<double>();
      flat[idx] = saved - eps;
      const double minus = loss_of().item<double>();
      flat[idx] = saved;
      const double fd = (plus - minus) / (2 * eps);
      EXPECT_NEAR(grad[idx].item<double>(), fd, 1e-7 + 1e-6 * std::abs(fd)) << idx;
    }
  }
}

TEST(LocalAttentionCore, SkippedCoreReturnsZerosOfQueryShape) {
  LocalAttentionCore core(AttentionBackend::kMath);
  at::Tensor q = torch::randn({2, 5, 4, 8}), k = torch::randn({2, 5, 1, 8}),
             v = torch::randn({2, 5, 1, 8});
  AttentionContext ctx;
  ctx.run_core = false;
  at::Tensor out = core.forward(q, k, v, ctx);
  EXPECT_EQ(out.sizes(), q.sizes());
  EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);
  ctx.run_core = true;
  EXPECT_TRUE(at::equal(core.forward(q, k, v, ctx),
                        local_attention(q, k, v, at::Tensor(), AttentionBackend::kMath)));
  EXPECT_EQ(core.name(), "local(math)");
}

std::string user_error_of(const std::string& name, const at::Device& device) {
  try {
    resolve_attention_backend(name, device);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(ResolveAttentionBackend, AutoIsSdpaOnEveryDevice) {
  EXPECT_EQ(resolve_attention_backend("auto", at::kCPU), AttentionBackend::kSdpaAuto);
  EXPECT_EQ(resolve_attention_backend("math", at::kCPU), AttentionBackend::kMath);
  EXPECT_EQ(resolve_attention_backend("flash", at::kCPU), AttentionBackend::kFlash);
  EXPECT_EQ(attention_backend_name(AttentionBackend::kEfficient), "efficient");
}

TEST(ResolveAttentionBackend, ClearErrors) {
  EXPECT_EQ(
      user_error_of("fastest", at::kCPU),
      "attention.backend: unknown backend 'fastest' (expected auto|math|flash|efficient|cudnn)");
  EXPECT_EQ(user_error_of("efficient", at::kCPU),
            "attention.backend: efficient runs on CUDA only (on CPU use auto, flash or math)");
  EXPECT_EQ(user_error_of("cudnn", at::kCPU),
            "attention.backend: cudnn runs on CUDA only (on CPU use auto, flash or math)");
}

// SDPA on CPU (auto and the forced flash kernel) equals the math reference, forward and backward,
// for GQA / MQA / MHA with and without packed documents. Tolerance: fp32 kernels that sum in a
// different order, 1e-5 absolute on O(1) values.
class CpuSdpaTest
    : public ::testing::TestWithParam<std::tuple<AttentionBackend, int64_t, bool>> {};

TEST_P(CpuSdpaTest, MatchesMathForwardAndBackward) {
  const auto [backend, hkv, packed] = GetParam();
  torch::manual_seed(3);
  const int64_t bs = 2, sl = 9, hq = 8, hd = 16;
  at::Tensor q = torch::randn({bs, sl, hq, hd}), k = torch::randn({bs, sl, hkv, hd}),
             v = torch::randn({bs, sl, hkv, hd}), grad_out = torch::randn({bs, sl, hq, hd});
  at::Tensor doc = packed ? example_doc_ids(bs, sl) : at::Tensor();
  std::vector<at::Tensor> grads[2];
  at::Tensor outs[2];
  const AttentionBackend backends[2] = {AttentionBackend::kMath, backend};
  for (int i = 0; i < 2; ++i) {
    at::Tensor qi = q.clone().requires_grad_(), ki = k.clone().requires_grad_(),
               vi = v.clone().requires_grad_();
    outs[i] = local_attention(qi, ki, vi, doc, backends[i]);
    outs[i].backward(grad_out);
    grads[i] = {qi.grad(), ki.grad(), vi.grad()};
  }
  EXPECT_TRUE(at::allclose(outs[1], outs[0], 0, 1e-5));
  for (int g = 0; g < 3; ++g) EXPECT_TRUE(at::allclose(grads[1][g], grads[0][g], 0, 1e-5)) << g;
}

INSTANTIATE_TEST_SUITE_P(
    Backends, CpuSdpaTest,
    ::testing::Combine(::testing::Values(AttentionBackend::kSdpaAuto, AttentionBackend::kFlash),
                       ::testing::Values(int64_t{2}, int64_t{1}, int64_t{8}),
                       ::testing::Bool()));

// On CPU, SDPA with our inputs selects the fused flash kernel (no [sl, sl] scores), for causal
// GQA and for the packed-document mask alike.
TEST(CpuSdpa, SelectsTheFusedFlashKernel) {
  const int64_t bs = 1, sl = 64, hq = 8, hkv = 2, hd = 32;
  at::Tensor q = torch::randn({bs, hq, sl, hd}), k = torch::randn({bs, hkv, sl, hd}),
             v = torch::randn({bs, hkv, sl, hd});
  at::Tensor mask = at::ones({sl, sl}, at::kBool).tril().view({1, 1, sl, sl});
  const int64_t flash = static_cast<int64_t>(at::SDPBackend::flash_attention);
#if ULYSSES_HAS_SDPA_GQA
  EXPECT_EQ(at::_fused_sdp_choice(q, k, v, {}, 0.0, true, {}, true), flash);
  EXPECT_EQ(at::_fused_sdp_choice(q, k, v, mask, 0.0, false, {}, true), flash);
#else
  at::Tensor k_full = k.repeat_interleave(hq / hkv, 1), v_full = v.repeat_interleave(hq / hkv, 1);
  EXPECT_EQ(at::_fused_sdp_choice(q, k_full, v_full, {}, 0.0, true, {}), flash);
#endif
}

}  // namespace
}  // namespace ulysses::model
