// LlamaForCausalLM: HF parameter names, deterministic init, causality, attention-core plumbing,
// and forward_hidden + lm_loss_sum gradients against finite differences in double precision.
#include "model/llama.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/lm_loss.h"
#include "model_test_util.h"

namespace ulysses::model {
namespace {

using testing::tiny_options;

std::vector<std::string> names_of(LlamaForCausalLM& model) {
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  return names;
}

std::vector<std::string> expected_hf_names(int64_t layers, bool tied) {
  std::vector<std::string> names = {"model.embed_tokens.weight"};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* suffix :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      names.push_back(p + suffix);
    }
  }
  names.push_back("model.norm.weight");
  if (!tied) names.push_back("lm_head.weight");
  return names;
}

TEST(Llama, ParameterNamesAreHfNamesUntied) {
  LlamaForCausalLM model(tiny_options(/*tied=*/false));
  EXPECT_EQ(names_of(model), expected_hf_names(2, false));
  EXPECT_EQ(model->lm_head_weight().data_ptr(), model->lm_head->weight.data_ptr());
  auto params = model->named_parameters();
  EXPECT_EQ(params["model.layers.1.self_attn.k_proj.weight"].sizes(),
            (std::vector<int64_t>{2 * 4, 16}));  // [hkv*hd, h]
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.weight"].sizes(),
            (std::vector<int64_t>{16, 24}));                                    // [h, ffn]
  EXPECT_EQ(params["lm_head.weight"].sizes(), (std::vector<int64_t>{37, 16}));  // [V, h]
}

TEST(Llama, ParameterNamesAreHfNamesTied) {
  LlamaForCausalLM model(tiny_options(/*tied=*/true));
  EXPECT_EQ(names_of(model), expected_hf_names(2, true));
  EXPECT_EQ(model->lm_head_weight().data_ptr(), model->model->embed_tokens->weight.data_ptr());
}

TEST(Llama, HeadDimZeroMeansHiddenOverHeads) {
  config::ModelOptions o = tiny_options();
  o.head_dim = 0;
  LlamaForCausalLM model(o);
  EXPECT_EQ(model->options().head_dim, 4);
}

TEST(Llama, InitIsDeterministicPerSeed) {
  LlamaForCausalLM a(tiny_options(false, 99)), b(tiny_options(false, 99)),
      c(tiny_options(false, 100));
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  for (const auto& item : pa) {
    const at::Tensor& p = item.value();
    EXPECT_TRUE(at::equal(p, pb[item.key()])) << item.key();
    if (p.dim() == 2) {
      EXPECT_FALSE(at::equal(p, pc[item.key()])) << item.key();
    } else {
      EXPECT_TRUE(at::equal(p, torch::ones_like(p))) << item.key();
    }
  }
  // N(0, init_std): the embedding has 37*16 = 592 draws.
  at::Tensor emb = pa["model.embed_tokens.weight"];
  EXPECT_NEAR(emb.std().item<double>(), 0.2, 0.02);
  EXPECT_NEAR(emb.mean().item<double>(), 0.0, 0.03);
}

TEST(Llama, InitLeavesGlobalGeneratorAlone) {
  torch::manual_seed(42);
  at::Tensor expected = torch::rand({4});
  torch::manual_seed(42);
  LlamaForCausalLM model(tiny_options());
  EXPECT_TRUE(at::equal(torch::rand({4}), expected));
}

at::Tensor positions(int64_t bs, int64_t tokens) {
  return at::arange(tokens, at::kLong).unsqueeze(0).repeat({bs, 1});  // [bs, T]
}

TEST(Llama, ForwardIsCausalAndRespectsDocuments) {
  LlamaForCausalLM model(tiny_options());
  at::Tensor ids = torch::randint(0, 37, {2, 8}, at::kLong);
  AttentionContext ctx;
  at::Tensor base = model->forward_hidden(ids, positions(2, 8), ctx);
  ASSERT_EQ(base.sizes(), (std::vector<int64_t>{2, 8, 16}));
  at::Tensor changed_ids = ids.clone();
  changed_ids[0][5] = (ids[0][5].item<int64_t>() + 1) % 37;
  at::Tensor changed = model->forward_hidden(changed_ids, positions(2, 8), ctx);
  EXPECT_TRUE(at::equal(changed.narrow(1, 0, 5), base.narrow(1, 0, 5)));  // earlier positions
  EXPECT_FALSE(at::allclose(changed[0][6], base[0][6]));                  // later position
  // With documents {0..3}, {4..7}: a change in document 0 leaves document 1 unchanged.
  ctx.doc_ids = torch::tensor({{0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}}, at::kLong);
  at::Tensor docs_base = model->forward_hidden(ids, positions(2, 8), ctx);
  changed_ids = ids.clone();
  changed_ids[1][1] = (ids[1][1].item<int64_t>() + 1) % 37;
  at::Tensor docs_changed = model->forward_hidden(changed_ids, positions(2, 8), ctx);
  EXPECT_TRUE(at::equal(docs_changed[1].narrow(0, 4, 4), docs_base[1].narrow(0, 4, 4)));
  EXPECT_FALSE(at::allclose(docs_changed[1][2], docs_base[1][2]));
}

// Records what every layer passes to the core, then computes local attention.
class RecordingCore : public AttentionCore {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionContext& ctx) override {
    layers.push_back(ctx.layer_index);
    run_core.push_back(ctx.run_core);
    return inner.forward(q, k, v, ctx);
  }
  std::string name() const override { return "recording"; }
  std::vector<int64_t> layers;
  std::vector<bool> run_core;
  LocalAttentionCore inner;
};

TEST(Llama, AttentionCoreIsUsedByEveryLayerAndSkipModeSpareOnlyTheLast) {
  config::ModelOptions o = tiny_options();
  o.num_layers = 3;
  LlamaForCausalLM model(o);
  at::Tensor ids = torch::randint(0, 37, {1, 6}, at::kLong);
  at::Tensor expected = model->forward_hidden(ids, positions(1, 6), {});
  EXPECT_EQ(model->attention_core()->name(), "local(math)");
  auto core = std::make_shared<RecordingCore>();
  model->set_attention_core(core);
  EXPECT_EQ(model->attention_core(), core);
  EXPECT_TRUE(at::equal(model->forward_hidden(ids, positions(1, 6), {}), expected));
  EXPECT_EQ(core->layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(core->run_core, (std::vector<bool>{true, true, true}));
  core->layers.clear();
  core->run_core.clear();
  model->set_skip_all_but_last(true);
  at::Tensor skipped = model->forward_hidden(ids, positions(1, 6), {});
  EXPECT_EQ(skipped.sizes(), expected.sizes());
  EXPECT_EQ(core->run_core, (std::vector<bool>{false, false, true}));
}

TEST(Llama, LayerRunnerWrapsEveryLayer) {
  LlamaForCausalLM model(tiny_options());
  at::Tensor ids = torch::randint(0, 37, {2, 5}, at::kLong);
  at::Tensor expected = model->forward_hidden(ids, positions(2, 5), {});
  int calls = 0;
  model->set_layer_runner([&](LlamaDecoderLayerImpl& layer, const at::Tensor& x,
                              const at::Tensor& cos, const at::Tensor& sin,
                              const AttentionContext& ctx) {
    ++calls;
    return layer.forward(x, cos, sin, ctx);
  });
  EXPECT_TRUE(at::equal(model->forward_hidden(ids, positions(2, 5), {}), expected));
  EXPECT_EQ(calls, 2);
}

TEST(LmLoss, SumAndCountMatchExplicitCrossEntropy) {
  torch::manual_seed(8);
  at::Tensor hidden = torch::randn({2, 4, 6});  // [bs, T, h]
  at::Tensor weight = torch::randn({10, 6});    // [V, h]
  at::Tensor labels = torch::tensor({{3, -100, 9, 0}, {-100, -100, 5, 1}}, at::kLong);
  LossSum loss = lm_loss_sum(hidden, weight, labels);
  EXPECT_EQ(loss.count.item<int64_t>(), 5);
  EXPECT_EQ(loss.sum.scalar_type(), at::kFloat);
  double expected = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 4; ++t) {
      const int64_t label = labels[b][t].item<int64_t>();
      if (label == kIgnoreLabel) continue;
      at::Tensor logits = at::mv(weight.to(at::kDouble), hidden[b][t].to(at::kDouble));  // [V]
      expected += logits.exp().sum().log().item<double>() - logits[label].item<double>();
    }
  EXPECT_NEAR(loss.sum.item<double>(), expected, 1e-5 * std::abs(expected));
  LossSum none = lm_loss_sum(hidden, weight, torch::full({2, 4}, kIgnoreLabel, at::kLong));
  EXPECT_EQ(none.count.item<int64_t>(), 0);
  EXPECT_EQ(none.sum.item<double>(), 0.0);
}

// loss = sum CE / count of forward_hidden + lm_loss_sum; autograd vs central differences.
void check_gradients_by_finite_differences(bool tied) {
  config::ModelOptions o = tiny_options(tied, 5);
  LlamaForCausalLM model(o);
  model->to(at::kDouble);
  torch::manual_seed(12);
  at::Tensor ids = torch::randint(0, 37, {2, 6}, at::kLong);
  at::Tensor pos = torch::tensor({{0, 1, 2, 0, 1, 2}, {10, 11, 12, 13, 14, 15}}, at::kLong);
  AttentionContext ctx;
  ctx.doc_ids = torch::tensor({{0, 0, 0, 1, 1, 1}, {0, 0, 0, 0, 0, 0}}, at::kLong);
  at::Tensor labels = torch::randint(0, 37, {2, 6}, at::kLong);
  labels[0][2] = kIgnoreLabel;
  labels[1][5] = kIgnoreLabel;
  auto loss_of = [&]() {
    LossSum l = lm_loss_sum(model->forward_hidden(ids, pos, ctx), model->lm_head_weight(), labels);
    EXPECT_EQ(l.sum.scalar_type(), at::kDouble);
    return l.sum / static_cast<double>(l.count.item<int64_t>());
  };
  model->zero_grad();
  loss_of().backward();

  auto params = model->named_parameters();
  std::vector<std::string> checked = {"model.embed_tokens.weight",
                                      "model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.self_attn.k_proj.weight",
                                      "model.layers.1.self_attn.v_proj.weight",
                                      "model.layers.1.self_attn.o_proj.weight",
                                      "model.layers.0.mlp.gate_proj.weight",
                                      "model.layers.1.mlp.up_proj.weight",
                                      "model.layers.1.mlp.down_proj.weight",
                                      "model.layers.0.input_layernorm.weight",
                                      "model.layers.1.post_attention_layernorm.weight",
                                      "model.norm.weight"};
  if (!tied) checked.push_back("lm_head.weight");
  const double eps = 1e-6;
  for (const std::string& name : checked) {
    at::Tensor param = params[name];
    ASSERT_TRUE(param.grad().defined()) << name;
    at::Tensor flat = param.detach().view({-1});
    at::Tensor grad = param.grad().view({-1});
    // Embedding rows of tokens in the batch carry gradient; pick entries of row ids[0][0] there.
    std::vector<int64_t> entries = {0, flat.numel() / 2 + 1, flat.numel() - 1};
    if (name == "model.embed_tokens.weight") {
      const int64_t row = ids[0][0].item<int64_t>() * o.hidden_size;
      entries = {row, row + 7, ids[1][3].item<int64_t>() * o.hidden_size + 3};
    }
    for (int64_t idx : entries) {
      torch::NoGradGuard no_grad;
      const double saved = flat[idx].item<double>();
      flat[idx] = saved + eps;
      const double plus = loss_of().item<double>();
      flat[idx] = saved - eps;
      const double minus = loss_of().item<double>();
      flat[idx] = saved;
      const double fd = (plus - minus) / (2 * eps);
      const double ag = grad[idx].item<double>();
      EXPECT_NEAR(ag, fd, 1e-8 + 1e-5 * std::abs(fd)) << name << "[" << idx << "]";
      EXPECT_NE(ag, 0.0) << name << "[" << idx << "] has no gradient to check";
    }
  }
}

TEST(Llama, GradientsMatchFiniteDifferencesUntied) { check_gradients_by_finite_differences(false); }
TEST(Llama, GradientsMatchFiniteDifferencesTied) { check_gradients_by_finite_differences(true); }

}  // namespace
}  // namespace ulysses::model
