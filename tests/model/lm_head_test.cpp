// The LM head runs its GEMM in the model's dtype and upcasts only the logits (the
// old head copied W to fp32 and ran fp32 GEMMs); per-token losses equal at::cross_entropy_loss.
#include <gtest/gtest.h>

#include "model/lm_loss.h"

namespace ulysses::model {
namespace {

TEST(LmHead, Bf16GemmRunsInBf16AndOnlyTheLogitsAreFp32) {
  at::manual_seed(3);
  at::Tensor hidden = at::randn({16, 256}).to(at::kBFloat16);  // [n, h]
  at::Tensor weight = at::randn({64, 256}).to(at::kBFloat16);  // [V, h]
  at::Tensor logits = lm_head_logits(hidden, weight);          // [n, V]
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  // A bf16 GEMM rounds its output to bf16: every logit is a bf16 value. An fp32 GEMM's are not.
  EXPECT_TRUE(at::equal(logits, at::linear(hidden, weight).to(at::kFloat)));
  at::Tensor fp32_gemm = at::linear(hidden.to(at::kFloat), weight.to(at::kFloat));  // [n, V]
  ASSERT_FALSE(at::equal(fp32_gemm, fp32_gemm.to(at::kBFloat16).to(at::kFloat)))
      << "inputs too tame to tell the two GEMMs apart";
}

TEST(LmHead, Fp32AndFp64KeepTheirDtype) {
  at::Tensor h32 = at::randn({4, 8}), w32 = at::randn({5, 8});
  EXPECT_TRUE(at::equal(lm_head_logits(h32, w32), at::linear(h32, w32)));
  EXPECT_EQ(lm_head_logits(h32.to(at::kDouble), w32.to(at::kDouble)).scalar_type(), at::kDouble);
}

TEST(LmHead, TokenLossesEqualCrossEntropyWithIgnoredLabels) {
  at::manual_seed(5);
  at::Tensor hidden = at::randn({2, 10, 8});                                  // [bs, T, h]
  at::Tensor weight = at::randn({12, 8});                                     // [V, h]
  at::Tensor labels = at::randint(0, 12, {2, 10}, at::kLong);                 // [bs, T]
  labels.index_put_({0, 3}, kIgnoreLabel);
  labels.index_put_({1, 9}, kIgnoreLabel);
  at::Tensor want = at::cross_entropy_loss(at::linear(hidden, weight).reshape({-1, 12}),
                                           labels.reshape({-1}), {}, at::Reduction::None,
                                           kIgnoreLabel)
                        .view({2, 10});
  for (int64_t tile : {1, 3, 10, 64}) {  // tiles of the sequence, the last one short
    at::Tensor got = lm_token_losses(hidden, weight, labels, tile);  // [bs, T]
    EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-6)) << "tile " << tile;
    EXPECT_EQ(got[0][3].item<float>(), 0.0f);
  }
  EXPECT_NEAR(lm_loss_sum(hidden, weight, labels).sum.item<double>(), want.sum().item<double>(),
              1e-4);
}

}  // namespace
}  // namespace ulysses::model
