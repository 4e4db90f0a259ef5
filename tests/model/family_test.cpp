// The decoder families in the model (config/model_family.h): named_parameters() yields
// transformers' names in transformers' order for llama, mistral, qwen2 and qwen3; init gives
// Qwen2's biases 0 and every norm weight (Qwen3's q/k norms included) 1, at construction and
// through materialize_weights; Qwen3 normalizes each q and k head; bf16 runs the qk-norm path.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model/lm_loss.h"
#include "model/materialize.h"
#include "model_test_util.h"

namespace ulysses::model {
namespace {

using testing::tiny_options;

// tiny_options (h 16, hq 4, hkv 2, hd 4) as `family`; qwen3 with hd 8, so that hq * hd = 32 != h.
config::ModelOptions family_options(const std::string& family, bool tied = false) {
  config::ModelOptions o = tiny_options(tied);
  o.family = family;
  if (family == "qwen3") o.head_dim = 8;
  return o;
}

std::vector<std::string> names_of(LlamaForCausalLM& model) {
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  return names;
}

// transformers' named_parameters() of <Family>ForCausalLM: Qwen2Attention's Linear(bias=True)
// gives weight then bias per projection; Qwen3Attention registers q_norm and k_norm after o_proj;
// the decoder layer holds self_attn, mlp, input_layernorm, post_attention_layernorm.
std::vector<std::string> transformers_names(const std::string& family, int64_t layers,
                                            bool tied) {
  std::vector<std::string> attention;
  for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
    attention.push_back(std::string(proj) + ".weight");
    if (family == "qwen2") attention.push_back(std::string(proj) + ".bias");
  }
  attention.push_back("o_proj.weight");
  if (family == "qwen3") {
    attention.push_back("q_norm.weight");
    attention.push_back("k_norm.weight");
  }
  std::vector<std::string> names = {"model.embed_tokens.weight"};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const std::string& a : attention) names.push_back(p + "self_attn." + a);
    for (const char* suffix : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                               "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      names.push_back(p + suffix);
    }
  }
  names.push_back("model.norm.weight");
  if (!tied) names.push_back("lm_head.weight");
  return names;
}

const std::vector<std::string> kFamilies = {"llama", "mistral", "qwen2", "qwen3"};

TEST(Family, ParameterNamesAreTransformersNamesInTransformersOrder) {
  for (const std::string& family : kFamilies) {
    for (bool tied : {false, true}) {
      LlamaForCausalLM model(family_options(family, tied));
      EXPECT_EQ(names_of(model), transformers_names(family, 2, tied)) << family << " tied " << tied;
    }
  }
  LlamaForCausalLM qwen2(family_options("qwen2"));
  auto p2 = qwen2->named_parameters();
  EXPECT_EQ(p2["model.layers.0.self_attn.q_proj.bias"].sizes(), (std::vector<int64_t>{16}));
  EXPECT_EQ(p2["model.layers.0.self_attn.k_proj.bias"].sizes(), (std::vector<int64_t>{8}));
  EXPECT_EQ(p2["model.layers.1.self_attn.v_proj.bias"].sizes(), (std::vector<int64_t>{8}));
  EXPECT_FALSE(qwen2->model->layer(0)->self_attn->o_proj->bias.defined());

  LlamaForCausalLM qwen3(family_options("qwen3"));  // hq * hd = 4 * 8 = 32, h = 16
  auto p3 = qwen3->named_parameters();
  EXPECT_EQ(p3["model.layers.0.self_attn.q_proj.weight"].sizes(), (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(p3["model.layers.0.self_attn.k_proj.weight"].sizes(), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(p3["model.layers.0.self_attn.o_proj.weight"].sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(p3["model.layers.0.self_attn.q_norm.weight"].sizes(), (std::vector<int64_t>{8}));
  EXPECT_EQ(p3["model.layers.1.self_attn.k_norm.weight"].sizes(), (std::vector<int64_t>{8}));
  EXPECT_FALSE(qwen3->model->layer(0)->self_attn->q_proj->bias.defined());
}

// Every bias is 0 and every norm weight 1 after init, at construction and when the weights are
// materialized later (the trainer's path, fp32 and bf16); the matrices are drawn.
TEST(Family, InitGivesBiasesZeroAndNormsOne) {
  for (const std::string& family : kFamilies) {
    const config::ModelOptions o = family_options(family);
    LlamaForCausalLM at_construction(o);
    LlamaForCausalLM deferred(o, WeightInit::kDeferred);
    materialize_weights(deferred, at::Device(at::kCPU), at::kFloat, "");
    LlamaForCausalLM deferred_bf16(o, WeightInit::kDeferred);
    materialize_weights(deferred_bf16, at::Device(at::kCPU), at::kBFloat16, "");
    auto later = deferred->named_parameters();
    auto later_bf16 = deferred_bf16->named_parameters();
    int64_t biases = 0, norms = 0;
    for (const auto& item : at_construction->named_parameters()) {
      const std::string what = family + " " + item.key();
      const at::Tensor& p = item.value();
      EXPECT_TRUE(at::equal(later[item.key()], p)) << what;
      EXPECT_EQ(later_bf16[item.key()].scalar_type(), at::kBFloat16) << what;
      EXPECT_TRUE(at::equal(later_bf16[item.key()], p.to(at::kBFloat16))) << what;
      if (item.key().ends_with(".bias")) {
        EXPECT_TRUE(at::equal(p, at::zeros_like(p))) << what;
        ++biases;
      } else if (p.dim() == 1) {
        EXPECT_TRUE(at::equal(p, at::ones_like(p))) << what;
        ++norms;
      } else {
        EXPECT_GT(p.std().item<double>(), 0.1) << what;  // N(0, 0.2)
      }
    }
    const int64_t layers = o.num_layers;
    EXPECT_EQ(biases, family == "qwen2" ? 3 * layers : 0) << family;
    EXPECT_EQ(norms, 2 * layers + 1 + (family == "qwen3" ? 2 * layers : 0)) << family;
  }
}

at::Tensor positions(int64_t bs, int64_t tokens) {
  return at::arange(tokens, at::kLong).unsqueeze(0).repeat({bs, 1});  // [bs, T]
}

// The norm over hd of each q and k head, before RoPE, makes the layer blind to the scale of each
// head's projection rows: scaling one query head's rows of q_proj and one key head's rows of
// k_proj by 3 changes the output of a Qwen3 model only through the eps in the norm (eps 1e-12 here,
// so relative < 1e-9 in fp64), and that of a Llama model by far more.
TEST(FamilyQkNorm, Qwen3IsInvariantToTheScaleOfEachHeadsProjection) {
  for (const std::string family : {"qwen3", "llama"}) {
    config::ModelOptions o = family_options(family);
    o.rms_norm_eps = 1e-12;
    const int64_t hd = o.head_dim;
    LlamaForCausalLM model(o);
    model->to(at::kDouble);
    torch::manual_seed(3);
    const at::Tensor ids = torch::randint(0, 37, {2, 7}, at::kLong);  // [bs, T]
    torch::NoGradGuard no_grad;
    const at::Tensor before = model->forward_hidden(ids, positions(2, 7), {});
    auto& attn = model->model->layer(0)->self_attn;
    attn->q_proj->weight.narrow(0, hd, hd).mul_(3.0);  // query head 1: rows [hd, 2 hd)
    attn->k_proj->weight.narrow(0, 0, hd).mul_(3.0);   // key head 0: rows [0, hd)
    const at::Tensor after = model->forward_hidden(ids, positions(2, 7), {});
    const double change = ((after - before).norm() / before.norm()).item<double>();
    if (family == "qwen3") {
      EXPECT_LT(change, 1e-9) << family;
    } else {
      EXPECT_GT(change, 1e-3) << family;
    }
  }
}

// bf16 weights and activations through q_norm/k_norm: the loss and the gradients of the q/k norms
// stay close to the fp32 model's. bf16 keeps 8 significant bits (rounding 2^-9 relative); through
// two layers and backward that grows to about 1e-2 on a gradient (tests/memory/bf16_sp_test.cpp
// derives it: 1.9e-2 expected relative L2 per gradient tensor). Bounds: loss 1e-2 relative,
// gradients 5e-2 relative L2 (measured: loss 1e-4, gradients 1.5e-2 to 2.7e-2), where a dropped
// norm or a norm over the wrong dimension is off by O(1).
TEST(FamilyQkNorm, Bf16ForwardAndBackwardFollowFp32) {
  constexpr double kBf16LossRelTol = 1e-2;
  constexpr double kBf16GradRelTol = 5e-2;
  config::ModelOptions o = family_options("qwen3");
  o.init_std = 0.05;  // a trained-like scale
  LlamaForCausalLM fp32(o);
  LlamaForCausalLM bf16(o, WeightInit::kDeferred);  // as the trainer makes a bf16 model
  materialize_weights(bf16, at::Device(at::kCPU), at::kBFloat16, "");
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(4);  // norms off 1, the same in both models (rounded to bf16 in one)
    for (auto& item : fp32->named_parameters()) {
      if (item.value().dim() == 1) item.value().add_(torch::randn(item.value().sizes()) * 0.3);
    }
    auto b = bf16->named_parameters();
    for (auto& item : fp32->named_parameters()) b[item.key()].copy_(item.value());
  }
  torch::manual_seed(5);
  const at::Tensor ids = torch::randint(0, 37, {2, 12}, at::kLong);     // [bs, T]
  const at::Tensor labels = torch::randint(0, 37, {2, 12}, at::kLong);  // [bs, T]
  auto loss_of = [&](LlamaForCausalLM& model) {
    LossSum l = lm_loss_sum(model->forward_hidden(ids, positions(2, 12), {}),
                            model->lm_head_weight(), labels);
    at::Tensor loss = l.sum / l.count.to(l.sum.scalar_type());
    loss.backward();
    return loss.item<double>();
  };
  const double want = loss_of(fp32);
  const double got = loss_of(bf16);
  ASSERT_TRUE(std::isfinite(got));
  EXPECT_NEAR(got, want, kBf16LossRelTol * want);
  std::printf("bf16 loss %.6f, fp32 %.6f: relative error %.3g\n", got, want,
              std::abs(got - want) / want);
  auto b = bf16->named_parameters();
  for (const char* name :
       {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
        "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
        "model.layers.1.self_attn.q_proj.weight"}) {
    const at::Tensor& g = b[name].grad();
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_EQ(g.scalar_type(), at::kBFloat16) << name;
    const at::Tensor want_g = fp32->named_parameters()[name].grad().to(at::kDouble);
    ASSERT_GT(want_g.norm().item<double>(), 0) << name;
    const double err =
        ((g.to(at::kDouble) - want_g).norm() / want_g.norm()).item<double>();
    EXPECT_LT(err, kBf16GradRelTol) << name;
    std::printf("bf16 %s: relative L2 error %.3g\n", name, err);
  }
}

}  // namespace
}  // namespace ulysses::model
