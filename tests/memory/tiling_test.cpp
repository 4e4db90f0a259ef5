// Sequence tiling: sequence_tiled_compute, TiledMLP and TiledLogitsLoss equal the plain
// computation (outputs, input and parameter gradients), alone and through
// train::compute_gradients on 1 and 2 real Gloo ranks (loss rel 1e-5, every gradient rel 1e-4);
// a TiledMLP tile runs its forward twice per step, also under activation checkpointing.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string_view>

#include "../train/train_test_util.h"
#include "comm/mesh.h"
#include "data/data_loader.h"
#include "memory/activation_checkpoint.h"
#include "model/lm_loss.h"
#include "sp/sequence_tiled_compute.h"
#include "sp/tiled_logits_loss.h"
#include "sp/tiled_mlp.h"
#include "support/multi_rank.h"
#include "zero/gradient_step.h"
#include "train/trainer.h"

namespace ulysses {
namespace {

using testing::relative_error;

constexpr double kOutputRelTol = 1e-5;  // fp32 tile outputs vs the whole-sequence computation
constexpr double kLossRelTol = 1e-5;    // the equivalence tolerance (fp32)
constexpr double kGradRelTol = 1e-4;    // per tensor (relative L2)

at::Tensor randn(at::IntArrayRef sizes, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, gen, at::kFloat);
}

// Takes t.grad() (defined and nonzero) and clears it for the next pass.
at::Tensor take_grad(at::Tensor& t) {
  at::Tensor g = t.grad();
  EXPECT_TRUE(g.defined());
  if (!g.defined()) return at::zeros_like(t);
  EXPECT_GT(g.norm().item<double>(), 0.0);
  t.mutable_grad() = at::Tensor();
  return g.clone();
}

// ---------------------------------------------------------------- sequence_tiles

TEST(SequenceTiles, CutLikeTorchChunk) {
  auto lengths = [](int64_t length, int64_t tiles) {
    std::vector<int64_t> out;
    int64_t next = 0;
    for (const auto& t : sp::sequence_tiles(length, tiles)) {
      EXPECT_EQ(t.start, next);
      next += t.length;
      out.push_back(t.length);
    }
    EXPECT_EQ(next, length);
    return out;
  };
  EXPECT_EQ(lengths(11, 1), (std::vector<int64_t>{11}));
  EXPECT_EQ(lengths(11, 2), (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(lengths(11, 3), (std::vector<int64_t>{4, 4, 3}));
  EXPECT_EQ(lengths(11, 7), (std::vector<int64_t>{2, 2, 2, 2, 2, 1}));
  EXPECT_EQ(lengths(3, 7), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(lengths(12, 4), (std::vector<int64_t>{3, 3, 3, 3}));
}

// ---------------------------------------------------------------- sequence_tiled_compute

// x [bs, T, h], gate [bs, T, h] sharded; bias [h] passthrough; weight [h, h] a "parameter" fn
// closes over. Token-wise: tanh(x W^T) * gate + bias -> [bs, T, h].
struct ComputeFixture {
  static constexpr int64_t kBatch = 2, kLength = 11, kHidden = 6;
  at::Tensor x = randn({kBatch, kLength, kHidden}, 1).requires_grad_(true);
  at::Tensor gate = randn({kBatch, kLength, kHidden}, 2);  // needs no gradient
  at::Tensor bias = randn({kHidden}, 3).requires_grad_(true);
  at::Tensor weight = randn({kHidden, kHidden}, 4).mul_(0.5).requires_grad_(true);

  at::Tensor token_fn(const at::Tensor& xs, const at::Tensor& gs, const at::Tensor& b) const {
    return at::tanh(at::linear(xs, weight)) * gs + b;  // [bs, T_i, h]
  }
  // fn for `reduction`: token-wise, summed over the tile, or averaged over the tile.
  at::Tensor reduced_fn(const at::Tensor& xs, const at::Tensor& gs, const at::Tensor& b,
                        sp::TileReduction reduction) const {
    at::Tensor y = token_fn(xs, gs, b);                           // [bs, T_i, h]
    if (reduction == sp::TileReduction::kSum) return y.sum(1);    // [bs, h]
    if (reduction == sp::TileReduction::kMean) return y.mean(1);  // [bs, h]
    return y;
  }
};

const char* reduction_name(sp::TileReduction r) {
  return r == sp::TileReduction::kNone ? "none" : r == sp::TileReduction::kSum ? "sum" : "mean";
}

class TiledCompute : public ::testing::TestWithParam<std::tuple<int64_t, sp::TileReduction>> {};

TEST_P(TiledCompute, OutputsAndGradientsMatchDirect) {
  const auto [tiles, reduction] = GetParam();
  ComputeFixture f;
  // Direct: fn on the whole sequence, weighted by a fixed random upstream gradient.
  at::Tensor want = f.reduced_fn(f.x, f.gate, f.bias, reduction);
  const at::Tensor upstream = randn(want.sizes(), 5);
  (want * upstream).sum().backward();
  at::Tensor want_x = take_grad(f.x), want_bias = take_grad(f.bias), want_w = take_grad(f.weight);

  int forward_calls = 0, backward_calls = 0, calls_with_grad_in_forward = 0;
  bool in_forward = true;
  sp::TiledFn fn = [&](const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>& pass) {
    (in_forward ? forward_calls : backward_calls) += 1;
    if (in_forward && at::GradMode::is_enabled()) ++calls_with_grad_in_forward;
    return f.reduced_fn(shards[0], shards[1], pass[0], reduction);
  };
  at::Tensor got = sp::sequence_tiled_compute(fn, tiles, {f.x, f.gate}, {f.bias},
                                              /*grad_input=*/true, reduction);
  in_forward = false;
  (got * upstream).sum().backward();

  const int64_t expected_calls = static_cast<int64_t>(sp::sequence_tiles(f.kLength, tiles).size());
  EXPECT_EQ(forward_calls, expected_calls);
  EXPECT_EQ(backward_calls, expected_calls);
  EXPECT_EQ(calls_with_grad_in_forward, 0) << "forward must keep no activations";
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LT(relative_error(got, want), kOutputRelTol);
  EXPECT_LT(relative_error(take_grad(f.x), want_x), kGradRelTol) << "input x";
  EXPECT_LT(relative_error(take_grad(f.bias), want_bias), kGradRelTol) << "passthrough bias";
  EXPECT_LT(relative_error(take_grad(f.weight), want_w), kGradRelTol) << "parameter weight";
  EXPECT_FALSE(f.gate.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(TilesAndReductions, TiledCompute,
                         ::testing::Combine(::testing::Values(1, 2, 3, 7),
                                            ::testing::Values(sp::TileReduction::kNone,
                                                              sp::TileReduction::kSum,
                                                              sp::TileReduction::kMean)),
                         [](const auto& info) {
                           return "tiles" + std::to_string(std::get<0>(info.param)) + "_" +
                                  reduction_name(std::get<1>(info.param));
                         });

TEST(TiledComputeGradInput, OffGivesOnlyParameterGradients) {
  ComputeFixture f;
  (f.token_fn(f.x, f.gate, f.bias).square().sum()).backward();
  at::Tensor want_w = take_grad(f.weight);
  f.x.mutable_grad() = at::Tensor();
  f.bias.mutable_grad() = at::Tensor();
  sp::TiledFn fn = [&](const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>& pass) {
    return f.token_fn(shards[0], shards[1], pass[0]);
  };
  sp::sequence_tiled_compute(fn, 3, {f.x, f.gate}, {f.bias}, /*grad_input=*/false)
      .square()
      .sum()
      .backward();
  EXPECT_FALSE(f.x.grad().defined());
  EXPECT_FALSE(f.bias.grad().defined());
  EXPECT_LT(relative_error(take_grad(f.weight), want_w), kGradRelTol);
}

TEST(TiledComputeGradInput, ParametersGetGradientsWhenNoInputRequiresGrad) {
  ComputeFixture f;
  at::Tensor x = f.x.detach();  // a constant input: only fn's parameter needs a gradient
  f.token_fn(x, f.gate, f.bias.detach()).square().sum().backward();
  at::Tensor want_w = take_grad(f.weight);
  sp::TiledFn fn = [&](const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>&) {
    return f.token_fn(shards[0], shards[1], f.bias.detach());
  };
  at::Tensor got = sp::sequence_tiled_compute(fn, 7, {x, f.gate});
  ASSERT_TRUE(got.requires_grad());
  got.square().sum().backward();
  EXPECT_LT(relative_error(take_grad(f.weight), want_w), kGradRelTol);
}

TEST(TiledComputeGradInput, NoGradModeBuildsNoGraph) {
  ComputeFixture f;
  at::Tensor want = f.token_fn(f.x, f.gate, f.bias).detach();
  torch::NoGradGuard no_grad;
  sp::TiledFn fn = [&](const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>& pass) {
    return f.token_fn(shards[0], shards[1], pass[0]);
  };
  at::Tensor got = sp::sequence_tiled_compute(fn, 2, {f.x, f.gate}, {f.bias});
  EXPECT_FALSE(got.requires_grad());
  EXPECT_LT(relative_error(got, want), kOutputRelTol);
}

// ---------------------------------------------------------------- TiledMLP

config::ModelOptions small_model(bool tied) {
  config::ModelOptions o;
  o.hidden_size = 16;
  o.num_layers = 1;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 4;
  o.intermediate_size = 40;
  o.vocab_size = 37;
  o.tie_embeddings = tied;
  o.init_seed = 11;
  o.init_std = 0.3;
  return o;
}

class TiledMlp : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(TiledMlp, MatchesPlainMlp) {
  const auto [tiles, batch] = GetParam();
  model::LlamaForCausalLM model(small_model(false));
  model::LlamaMLP mlp = model->model->layer(0)->mlp;
  at::Tensor x = randn({batch, 11, 16}, 21).requires_grad_(true);  // [bs, T, h]
  const at::Tensor upstream = randn({batch, 11, 16}, 22);          // [bs, T, h]

  at::Tensor want = mlp->forward(x);
  (want * upstream).sum().backward();
  std::vector<at::Tensor> want_grads{take_grad(x)};
  for (auto& p : mlp->parameters()) want_grads.push_back(take_grad(p));

  at::Tensor got = sp::tiled_mlp(*mlp, x, tiles);
  (got * upstream).sum().backward();
  EXPECT_LT(relative_error(got, want), kOutputRelTol);
  EXPECT_LT(relative_error(take_grad(x), want_grads[0]), kGradRelTol) << "x";
  size_t i = 1;
  for (auto& item : mlp->named_parameters()) {
    EXPECT_LT(relative_error(take_grad(item.value()), want_grads[i++]), kGradRelTol) << item.key();
  }
}

INSTANTIATE_TEST_SUITE_P(TilesAndBatch, TiledMlp,
                         ::testing::Combine(::testing::Values(1, 2, 3, 7), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "tiles" + std::to_string(std::get<0>(info.param)) + "_bs" +
                                  std::to_string(std::get<1>(info.param));
                         });

// bf16 weights: the tiles' weight gradients are summed in fp32 and rounded to bf16 once (by
// autograd, on their way to .grad), so the tiled gradients are bf16 and as close to the untiled
// bf16 ones as bf16 rounding allows.
TEST(TiledMlpBf16, MatchesPlainMlpWithinBf16Rounding) {
  constexpr double kBf16RelTol = 2e-2;  // both paths compute in bf16 with fp32 GEMM accumulation
  model::LlamaForCausalLM model(small_model(false));
  model->to(at::kBFloat16);
  model::LlamaMLP mlp = model->model->layer(0)->mlp;
  at::Tensor x = randn({2, 33, 16}, 23).to(at::kBFloat16).requires_grad_(true);  // [bs, T, h]
  const at::Tensor upstream = randn({2, 33, 16}, 24).to(at::kBFloat16);           // [bs, T, h]
  at::Tensor want = mlp->forward(x);
  want.backward(upstream);
  std::vector<at::Tensor> want_grads{take_grad(x)};
  for (auto& p : mlp->parameters()) want_grads.push_back(take_grad(p));

  at::Tensor got = sp::tiled_mlp(*mlp, x, 5);
  got.backward(upstream);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  EXPECT_LT(relative_error(got, want), kBf16RelTol);
  EXPECT_LT(relative_error(take_grad(x), want_grads[0]), kBf16RelTol) << "x";
  size_t i = 1;
  for (auto& item : mlp->named_parameters()) {
    ASSERT_EQ(item.value().grad().scalar_type(), at::kBFloat16) << item.key();
    EXPECT_LT(relative_error(take_grad(item.value()), want_grads[i++]), kBf16RelTol) << item.key();
  }
}

// Counts the calls of aten::silu, which every SwiGLU MLP forward makes once (a tile's as well as
// the whole sequence's), on every thread while it lives (a RecordFunction callback).
class SiluCounter {
 public:
  SiluCounter() {
    calls_.store(0);
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start).scopes({at::RecordScope::FUNCTION}));
  }
  ~SiluCounter() { at::removeCallback(handle_); }
  SiluCounter(const SiluCounter&) = delete;
  SiluCounter& operator=(const SiluCounter&) = delete;
  int64_t calls() const { return calls_.load(); }

 private:
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (std::string_view(fn.name()) == "aten::silu") ++calls_;
    return nullptr;
  }
  static inline std::atomic<int64_t> calls_{0};
  at::CallbackHandle handle_;
};

struct MlpForwardCase {
  int64_t tiles;  // 1: the plain MLP
  bool checkpointing;
};
void PrintTo(const MlpForwardCase& c, std::ostream* os) {
  *os << "tiles " << c.tiles << (c.checkpointing ? " checkpointing" : "");
}

class MlpForwardCount : public ::testing::TestWithParam<MlpForwardCase> {};

// Each MLP tile runs its forward twice per step, with or without activation checkpointing: once in
// the forward pass and once in backward to rebuild its activations. The checkpointed layer's
// recompute runs only for its graph (model/graph_only_forward.h), so the tiles do not run a third
// time there. The plain MLP runs once in the forward pass and, checkpointed, once more in the
// recompute.
TEST_P(MlpForwardCount, EachTileRunsTwicePerStep) {
  const MlpForwardCase c = GetParam();
  model::LlamaForCausalLM model(small_model(false));  // one layer
  if (c.tiles > 1) model->set_mlp_runner(sp::tiled_mlp_runner(c.tiles));
  if (c.checkpointing) memory::enable_activation_checkpointing(model, /*offload=*/false);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(25);
  const at::Tensor ids = at::randint(37, {2, 12}, gen, at::kLong);         // [bs, T]
  const at::Tensor positions = at::arange(12, at::kLong).repeat({2, 1});  // [bs, T]
  SiluCounter silu;
  at::Tensor hidden = model->forward_hidden(ids, positions, {});  // [bs, T, h]
  const int64_t in_forward = silu.calls();
  hidden.square().sum().backward();
  const int64_t in_backward = silu.calls() - in_forward;
  EXPECT_EQ(in_forward, c.tiles);
  EXPECT_EQ(in_backward, c.tiles > 1 || c.checkpointing ? c.tiles : 0);
  for (auto& p : model->model->layer(0)->parameters()) EXPECT_TRUE(p.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(TilesAndCheckpointing, MlpForwardCount,
                         ::testing::Values(MlpForwardCase{1, false}, MlpForwardCase{1, true},
                                           MlpForwardCase{3, false}, MlpForwardCase{3, true},
                                           MlpForwardCase{4, true}),
                         [](const auto& info) {
                           return "tiles" + std::to_string(info.param.tiles) +
                                  (info.param.checkpointing ? "_checkpointing" : "");
                         });

// ---------------------------------------------------------------- TiledLogitsLoss

// Labels [bs, T] in [0, V) with scattered -100s and positions 4..7 all ignored, so that with 3
// tiles (4,4,3) the second tile and with 7 tiles (2,...,1) two tiles have no valid label.
at::Tensor loss_labels(int64_t batch, int64_t length, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor labels = at::randint(vocab, {batch, length}, gen, at::kLong);  // [bs, T]
  labels.narrow(1, 4, 4).fill_(model::kIgnoreLabel);
  labels.index_put_({0, 1}, model::kIgnoreLabel);
  labels.index_put_({batch - 1, length - 1}, model::kIgnoreLabel);
  return labels;
}

struct LossCase {
  int64_t tiles, batch;
  bool tied;
};
void PrintTo(const LossCase& c, std::ostream* os) {
  *os << "tiles " << c.tiles << " bs " << c.batch << (c.tied ? " tied" : " untied");
}

class TiledLoss : public ::testing::TestWithParam<LossCase> {};

// hidden = tanh(embedding(ids) * scale): with tied weights the head weight is the embedding
// weight, so its gradient is the sum of both uses.
TEST_P(TiledLoss, MatchesPlainLossSum) {
  const LossCase lc = GetParam();
  model::LlamaForCausalLM model(small_model(lc.tied));
  at::Tensor embed = model->model->embed_tokens->weight;  // [V, h]
  at::Tensor head = model->lm_head_weight();              // [V, h]
  at::Tensor scale = randn({16}, 31).requires_grad_(true);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(32);
  const at::Tensor ids = at::randint(37, {lc.batch, 11}, gen, at::kLong);        // [bs, T]
  const at::Tensor labels = loss_labels(lc.batch, 11, 37, 33);                   // [bs, T]
  auto hidden_of = [&] { return at::tanh(at::embedding(embed, ids) * scale); };  // [bs, T, h]
  constexpr double kOuterScale = 0.37;  // backward must scale by the actual incoming gradient

  model::LossSum want = model::lm_loss_sum(hidden_of(), head, labels);
  (want.sum * kOuterScale).backward();
  at::Tensor want_scale = take_grad(scale), want_embed = take_grad(embed);
  at::Tensor want_head = lc.tied ? at::Tensor() : take_grad(head);

  model::LossSum got = sp::tiled_lm_loss_sum(hidden_of(), head, labels, lc.tiles);
  (got.sum * kOuterScale).backward();
  EXPECT_EQ(got.count.item<int64_t>(), want.count.item<int64_t>());
  EXPECT_EQ(got.sum.scalar_type(), want.sum.scalar_type());
  EXPECT_LT(relative_error(got.sum, want.sum), kLossRelTol);
  EXPECT_LT(relative_error(take_grad(scale), want_scale), kGradRelTol) << "hidden path";
  EXPECT_LT(relative_error(take_grad(embed), want_embed), kGradRelTol) << "embedding";
  if (!lc.tied) {
    EXPECT_LT(relative_error(take_grad(head), want_head), kGradRelTol) << "lm_head";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, TiledLoss,
                         ::testing::Values(LossCase{1, 1, false}, LossCase{2, 2, false},
                                           LossCase{3, 1, true}, LossCase{3, 2, false},
                                           LossCase{7, 1, false}, LossCase{7, 2, true}),
                         [](const auto& info) {
                           return "tiles" + std::to_string(info.param.tiles) + "_bs" +
                                  std::to_string(info.param.batch) +
                                  (info.param.tied ? "_tied" : "_untied");
                         });

TEST(TiledLossEdge, AllLabelsIgnoredGivesZeroLossAndZeroGradients) {
  at::Tensor hidden = randn({2, 5, 8}, 41).requires_grad_(true);  // [bs, T, h]
  at::Tensor weight = randn({13, 8}, 42).requires_grad_(true);    // [V, h]
  at::Tensor labels = at::full({2, 5}, model::kIgnoreLabel, at::kLong);
  model::LossSum got = sp::tiled_lm_loss_sum(hidden, weight, labels, 2);
  EXPECT_EQ(got.count.item<int64_t>(), 0);
  EXPECT_EQ(got.sum.item<double>(), 0.0);
  got.sum.backward();
  EXPECT_EQ(hidden.grad().abs().max().item<double>(), 0.0);
  EXPECT_EQ(weight.grad().abs().max().item<double>(), 0.0);
}

TEST(TiledLossEdge, Bf16MatchesPlainWithinBf16Rounding) {
  constexpr double kBf16RelTol = 2e-2;  // both paths compute in fp32 and round grads to bf16
  at::Tensor hidden = randn({2, 9, 8}, 51).to(at::kBFloat16).requires_grad_(true);
  at::Tensor weight = randn({13, 8}, 52).to(at::kBFloat16).requires_grad_(true);
  at::Tensor labels = loss_labels(2, 9, 13, 53);
  model::LossSum want = model::lm_loss_sum(hidden, weight, labels);
  (want.sum * 0.5).backward();
  at::Tensor want_hidden = take_grad(hidden), want_weight = take_grad(weight);
  model::LossSum got = sp::tiled_lm_loss_sum(hidden, weight, labels, 3);
  (got.sum * 0.5).backward();
  EXPECT_EQ(got.sum.scalar_type(), at::kFloat);
  EXPECT_LT(relative_error(got.sum, want.sum), kLossRelTol);
  at::Tensor got_hidden = take_grad(hidden);
  EXPECT_EQ(got_hidden.scalar_type(), at::kBFloat16);
  EXPECT_LT(relative_error(got_hidden, want_hidden), kBf16RelTol);
  EXPECT_LT(relative_error(take_grad(weight), want_weight), kBf16RelTol);
}

// Logits spread over hundreds of nats, so that many labels' softmax probabilities underflow in
// fp32 (below 1e-38): the losses and gradients still equal the fp64 reference (loss rel 1e-5,
// gradients rel 1e-4), since the loss is logsumexp - logit, never -log(probability).
TEST(TiledLossEdge, LossesOfHundredsOfNatsMatchTheFp64Reference) {
  at::Tensor hidden = (randn({2, 9, 8}, 71) * 10.0).requires_grad_(true);  // [bs, T, h]
  at::Tensor weight = (randn({13, 8}, 72) * 4.0).requires_grad_(true);     // [V, h]
  const at::Tensor labels = loss_labels(2, 9, 13, 73);                     // [bs, T]
  const at::Tensor hidden64 = hidden.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor weight64 = weight.detach().to(at::kDouble).requires_grad_(true);
  model::LossSum want = model::lm_loss_sum(hidden64, weight64, labels);  // the fp64 reference
  want.sum.backward();
  const at::Tensor logits = at::linear(hidden64, weight64).detach();  // [bs, T, V]
  const at::Tensor gap = logits.amax(-1) - logits.gather(-1, labels.clamp_min(0).unsqueeze(-1))
                                              .squeeze(-1);  // [bs, T] loss >= gap
  ASSERT_GT(gap.max().item<double>(), 200.0) << "the case must have labels far below the max";
  model::LossSum got = sp::tiled_lm_loss_sum(hidden, weight, labels, 3);
  got.sum.backward();
  EXPECT_TRUE(std::isfinite(got.sum.item<double>()));
  EXPECT_LT(relative_error(got.sum, want.sum), kLossRelTol);
  EXPECT_LT(relative_error(take_grad(hidden), hidden64.grad()), kGradRelTol) << "hidden";
  EXPECT_LT(relative_error(take_grad(weight), weight64.grad()), kGradRelTol) << "weight";
}

// The LM-head weight gradient of a bf16 model is summed over the tiles in fp32: with 64 tiles it
// stays within about one bf16 rounding of the fp64 gradient of the same bf16 inputs (bound 3e-3),
// where a bf16 running sum drifts with the tile count (9.2e-3 here).
TEST(TiledLossEdge, Bf16WeightGradientIsSummedOverTilesInFp32) {
  constexpr double kOneBf16Rounding = 3e-3;
  const int64_t tiles = 64, length = 64 * 16, vocab = 512, h = 64;
  at::Tensor hidden = (randn({1, length, h}, 61) * 0.5).to(at::kBFloat16).requires_grad_(true);
  at::Tensor weight = (randn({vocab, h}, 62) * 0.5).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor labels = loss_labels(1, length, vocab, 63);
  const at::Tensor hidden64 = hidden.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor weight64 = weight.detach().to(at::kDouble).requires_grad_(true);
  model::lm_loss_sum(hidden64, weight64, labels).sum.backward();  // the fp64 reference
  sp::tiled_lm_loss_sum(hidden, weight, labels, tiles).sum.backward();
  ASSERT_EQ(weight.grad().scalar_type(), at::kBFloat16);
  const at::Tensor error = weight.grad().to(at::kDouble) - weight64.grad();
  EXPECT_LT((error.norm() / weight64.grad().norm()).item<double>(), kOneBf16Rounding);
}

// ---------------------------------------------------------------- auto tile counts

TEST(AutoTiles, LossTilesAimAtOneGibOfLogits) {
  EXPECT_EQ(sp::auto_loss_tiles(1, 32768, 128256), 16);       // 15.7 GiB of fp32 logits
  EXPECT_EQ(sp::auto_loss_tiles(1, 4096, 32000), 1);          // 0.49 GiB
  EXPECT_EQ(sp::auto_loss_tiles(2, 4096, 32000), 1);          // 0.98 GiB
  EXPECT_EQ(sp::auto_loss_tiles(3, 4096, 32000), 2);          // 1.46 GiB
  EXPECT_EQ(sp::auto_loss_tiles(1, 3, int64_t{1} << 32), 3);  // clamped to T
  EXPECT_EQ(sp::resolve_loss_tiles(config::TileCount{5}, 1, 32768, 128256), 5);
  EXPECT_EQ(sp::resolve_loss_tiles(config::TileCount{0}, 1, 32768, 128256), 16);
}

TEST(AutoTiles, MlpTilesAreCeilOfSeqOverHidden) {
  EXPECT_EQ(sp::auto_mlp_tiles(1, 4096), 1);
  EXPECT_EQ(sp::auto_mlp_tiles(4096, 4096), 1);
  EXPECT_EQ(sp::auto_mlp_tiles(4097, 4096), 2);
  EXPECT_EQ(sp::auto_mlp_tiles(65536, 4096), 16);
}

TEST(AutoTiles, MlpAutoIsTheMaxOverRanks) {
  testing::run_ranks(2, [](const testing::RankContext& ctx) {
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, 2);
    const int64_t local_seq_len = ctx.rank == 0 ? 100 : 300;  // ceil(/64): 2 and 5
    EXPECT_EQ(sp::resolve_mlp_tiles(config::TileCount{0}, local_seq_len, 64, mesh.world()), 5);
    EXPECT_EQ(sp::resolve_mlp_tiles(config::TileCount{3}, local_seq_len, 64, mesh.world()), 3);
  });
}

// ---------------------------------------------------------------- through the training stack

struct StackCase {
  std::string name;
  int64_t sp;
  int64_t mlp_tiles, loss_tiles;  // 0 = auto
  int64_t micro_batch;
  bool tied;
  int64_t length = 22;
  int64_t grad_accum = 1;
  bool checkpointing = false;  // memory.checkpointing in the tiled run: tiles inside the recompute
  // model.family; other than llama: testing::set_family's shapes, 1-D parameters perturbed
  std::string family = "llama";
};
void PrintTo(const StackCase& c, std::ostream* os) { *os << c.name; }

StackCase with_family(StackCase sc, const std::string& family) {
  sc.name = family + "_" + sc.name;
  sc.family = family;
  return sc;
}

class TiledStack : public ::testing::TestWithParam<StackCase> {};

// compute_gradients with TiledMLP / TiledLogitsLoss (and optionally activation checkpointing)
// equals the plain path on the same mesh.
TEST_P(TiledStack, ComputeGradientsMatchesPlainPath) {
  const StackCase sc = GetParam();
  testing::run_ranks(static_cast<int>(sc.sp), [&](const testing::RankContext& ctx) {
    config::RunConfig plain_c = testing::tiny_run_config(4, 2, 1, sc.sp);
    plain_c.model.tie_embeddings = sc.tied;
    plain_c.sequence.length = sc.length;
    plain_c.sequence.micro_batch = sc.micro_batch;
    plain_c.sequence.grad_accum = sc.grad_accum;
    testing::set_family(plain_c.model, sc.family);
    const bool perturb = sc.family != "llama";
    config::RunConfig tiled_c = plain_c;
    tiled_c.memory.tiled_mlp.value = sc.mlp_tiles;
    tiled_c.memory.tiled_loss.value = sc.loss_tiles;
    tiled_c.memory.checkpointing = sc.checkpointing;
    const at::Device cpu(at::kCPU);

    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, sc.sp);
    data::DataLoader loader(plain_c.data, plain_c.sequence, plain_c.model.vocab_size, 1, 0, sc.sp,
                            mesh.sp_rank());
    std::vector<data::Batch> batches;
    for (int64_t m = 0; m < sc.grad_accum; ++m) batches.push_back(loader.micro_batch(1, m));

    model::LlamaForCausalLM plain = train::build_model(plain_c, mesh, cpu);
    if (perturb) testing::perturb_vector_parameters(*plain);
    train::StepLoss want = train::compute_gradients(plain, batches, mesh);
    model::LlamaForCausalLM tiled = train::build_model(tiled_c, mesh, cpu);
    if (perturb) testing::perturb_vector_parameters(*tiled);
    EXPECT_EQ(static_cast<bool>(tiled->model->layer(0)->mlp_runner), sc.mlp_tiles != 1);
    train::StepLoss got =
        train::compute_gradients(tiled, batches, mesh, {tiled_c.memory.tiled_loss});

    EXPECT_EQ(got.valid_tokens, want.valid_tokens);
    EXPECT_NEAR(got.loss, want.loss, kLossRelTol * std::abs(want.loss)) << sc.name;
    auto params = tiled->named_parameters();
    for (const auto& item : plain->named_parameters()) {
      const at::Tensor& g = params[item.key()].grad();
      ASSERT_TRUE(g.defined()) << item.key();
      EXPECT_GT(item.value().grad().norm().item<double>(), 0) << item.key();
      EXPECT_LT(relative_error(g, item.value().grad()), kGradRelTol)
          << sc.name << " " << item.key() << " rank " << ctx.rank;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, TiledStack,
    ::testing::Values(
        // sp 1, local T 22: tiles 2 -> 11,11; 3 -> 8,8,6; 7 -> 4 x5 + 2
        StackCase{"sp1_mlp2_bs1_untied", 1, 2, 1, 1, false},
        StackCase{"sp1_loss3_bs2_tied", 1, 1, 3, 2, true},
        StackCase{"sp1_mlp7_loss7_bs2_tied", 1, 7, 7, 2, true},
        // sp 2, local T 11: tiles 3 -> 4,4,3; 7 -> 2 x5 + 1
        StackCase{"sp2_mlp3_loss2_bs1_untied_accum2", 2, 3, 2, 1, false, 22, 2},
        StackCase{"sp2_mlp7_loss3_bs2_tied", 2, 7, 3, 2, true},
        StackCase{"sp2_mlp2_loss7_bs2_untied", 2, 2, 7, 2, false},
        StackCase{"sp2_mlp3_loss3_bs1_tied_checkpointing", 2, 3, 3, 1, true, 22, 1, true},
        // auto: local T 49 over h 32 -> 2 MLP tiles; loss auto -> 1 tile (tiny logits)
        StackCase{"sp2_auto_bs1_tied", 2, 0, 0, 1, true, 98},
        // The families' attention terms inside the tiled and recomputed layers
        with_family(StackCase{"sp2_mlp3_loss3_bs1_tied_checkpointing", 2, 3, 3, 1, true, 22, 1,
                              true},
                    "qwen3"),
        with_family(StackCase{"sp2_mlp2_loss7_bs2_untied", 2, 2, 7, 2, false}, "qwen2")),
    [](const ::testing::TestParamInfo<StackCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ulysses
