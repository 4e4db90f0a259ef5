// The training-FLOPs formula (profile/flops.h) against a count by hand and against the
// parameters of the real model, and the peak from $ULYSSES_PEAK_TFLOPS.
#include "profile/flops.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/error.h"
#include "model/llama.h"

namespace ulysses {
namespace {

config::ModelOptions tiny() {
  config::ModelOptions m;  // the tiny preset: h 256, L 2, hq 8, hkv 2, hd 32, ffn 512, V 1024
  m.hidden_size = 256;
  m.num_layers = 2;
  m.num_heads = 8;
  m.num_kv_heads = 2;
  m.head_dim = 32;
  m.intermediate_size = 512;
  m.vocab_size = 1024;
  return m;
}

TEST(Flops, TinyModelMatchesAHandCount) {
  // Per layer: q 256*256 = 65536, k+v 2*256*64 = 32768, o 256*256 = 65536,
  // gate+up+down 3*256*512 = 393216 -> 557056; 2 layers 1114112; LM head 1024*256 = 262144.
  const double n_matmul = 1376256.0;
  // Attention at sl = 128: 6 * L * sl * hq * hd = 6 * 2 * 128 * 8 * 32 = 393216 per token.
  const profile::TrainingFlops f = profile::training_flops(tiny(), 128);
  EXPECT_DOUBLE_EQ(f.matmul_params, n_matmul);
  EXPECT_DOUBLE_EQ(f.matmul_per_token, 6.0 * n_matmul);  // 8257536
  EXPECT_DOUBLE_EQ(f.attention_per_token, 393216.0);
  EXPECT_DOUBLE_EQ(f.per_token(), 8650752.0);
}

TEST(Flops, HeadDimIndependentOfHiddenSize) {
  config::ModelOptions m = tiny();
  m.head_dim = 64;  // hq * hd = 512 != h
  const profile::TrainingFlops f = profile::training_flops(m, 1);
  // q 256*512, k+v 2*256*128, o 512*256, MLP 393216 -> 720896 per layer; x2 + 262144.
  EXPECT_DOUBLE_EQ(f.matmul_params, 2.0 * 720896.0 + 262144.0);
  EXPECT_DOUBLE_EQ(f.attention_per_token, 6.0 * 2 * 1 * 8 * 64);
  m.head_dim = 0;  // resolved as h / hq = 32
  EXPECT_DOUBLE_EQ(profile::training_flops(m, 128).per_token(), 8650752.0);
}

// N_matmul equals the elements of every projection and LM-head weight of the real model, in every
// family: Qwen2's q/k/v biases and Qwen3's q/k norm weights are parameters but not matmul weights.
TEST(Flops, MatmulParamsEqualTheModelsProjectionWeights) {
  for (const char* family : {"llama", "qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(family);
    config::ModelOptions m = tiny();
    m.family = family;
    model::LlamaForCausalLM model(m, model::WeightInit::kDeferred);
    double counted = 0.0, others = 0.0;
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      const bool matmul =
          name.find("_proj.weight") != std::string::npos || name == "lm_head.weight";
      (matmul ? counted : others) += static_cast<double>(item.value().numel());
    }
    EXPECT_DOUBLE_EQ(profile::training_flops(m, 64).matmul_params, counted);
    // Embedding 1024 x 256 and RMSNorms 5 x 256, plus per layer Qwen2's biases (8 + 2 x 2) x 32
    // or Qwen3's q/k norms 2 x 32.
    const std::string name(family);
    const double per_layer = name == "qwen2" ? 384 : name == "qwen3" ? 64 : 0;
    EXPECT_DOUBLE_EQ(others, 1024.0 * 256 + 5 * 256 + 2 * per_layer);
  }
}

TEST(Flops, CausalAttentionForward) {
  // QK^T and PV over the causal half: 2 * (2 * sl^2/2 * heads * hd).
  EXPECT_DOUBLE_EQ(profile::causal_attention_forward_flops(1024, 4, 64),
                   2.0 * 1024 * 1024 * 4 * 64);
}

TEST(Flops, PeakFromEnvironment) {
  unsetenv(profile::kPeakTflopsVariable);
  EXPECT_EQ(profile::peak_flops_per_rank_from_env(), 0.0);
  setenv(profile::kPeakTflopsVariable, "989.4", 1);
  EXPECT_DOUBLE_EQ(profile::peak_flops_per_rank_from_env(), 989.4e12);
  for (const char* bad : {"fast", "-1", "0", "12x"}) {
    setenv(profile::kPeakTflopsVariable, bad, 1);
    try {
      profile::peak_flops_per_rank_from_env();
      ADD_FAILURE() << "accepted " << bad;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("ULYSSES_PEAK_TFLOPS: ", 0), 0u) << e.what();
    }
  }
  unsetenv(profile::kPeakTflopsVariable);
}

}  // namespace
}  // namespace ulysses
