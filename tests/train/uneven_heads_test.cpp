// mesh.uneven_heads: an sp that does not divide the query heads (hq 7 at sp 2, 3, 4; hq 6 with
// hkv 2 at sp 4; hq 8 with hkv 2 at sp 3, where a rank's query heads straddle a KV group), or
// whose KV heads neither divide nor are a multiple of it (hq 6 with hkv 3 at sp 2, also with a
// ring of 2 behind the all-to-all), trains exactly as one process does: every parameter gradient
// of a step (fp32: relative 1e-5 on the loss, 1e-4 on each gradient, as equivalence_test.cpp), and
// whole 3-step runs (loss and grad_norm every step, the final weights), on real Gloo ranks.
// A rank whose query heads straddle KV groups attends in one call per GQA segment, each given
// only its own KV heads: no call (local or ring) receives a KV head twice or more KV heads than
// the rank holds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "data/data_loader.h"
#include "model/safetensors.h"
#include "run_outputs.h"
#include "sp/head_split.h"
#include "sp/ulysses_attention.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "train_test_util.h"
#include "zero/gradient_step.h"

namespace ulysses {
namespace {

constexpr double kLossRelTol = 1e-5;  // the equivalence tolerance (fp32)
constexpr double kGradRelTol = 1e-4;  // per parameter tensor (relative L2)

struct UnevenCase {
  std::string name;
  int64_t dp, sp, hq, hkv;
  bool tiled_and_checkpointed = false;  // memory.tiled_mlp 2 + memory.checkpointing
  bool packed = false;                  // data.pack: documents masked from each other
  int64_t ring = 1;                     // mesh.sp_ring: sp = sp / ring all-to-all x ring
};

void PrintTo(const UnevenCase& uc, std::ostream* os) { *os << uc.name; }  // gtest's case label

config::RunConfig case_config(const UnevenCase& uc) {
  config::RunConfig c = testing::tiny_run_config(uc.hq, uc.hkv, uc.dp, uc.sp);
  c.mesh.uneven_heads = true;
  if (uc.tiled_and_checkpointed) {
    c.memory.tiled_mlp.value = 2;
    c.memory.checkpointing = true;
  }
  c.data.pack = uc.packed;
  c.mesh.sp_ring.value = uc.ring;
  return c;
}

std::vector<data::Batch> rank_batches(const config::RunConfig& c, int64_t dp, int64_t dp_rank,
                                      int64_t sp, int64_t sp_rank, int64_t ring = 1) {
  data::DataLoader loader(c.data, c.sequence, c.model.vocab_size, dp, dp_rank, sp, sp_rank,
                          "data.source", ring);
  return {loader.micro_batch(1, 0)};
}

// The query heads of `heads` that each of its KV heads serves, in KV head order.
std::vector<int64_t> queries_per_kv_head(const sp::RankHeads& heads, int64_t hq, int64_t hkv) {
  std::vector<int64_t> counts(heads.kv_count, 0);
  for (int64_t h = heads.q_begin; h < heads.q_begin + heads.q_count; ++h) {
    ++counts[h / (hq / hkv) - heads.kv_begin];
  }
  return counts;
}

// Checks the attention calls of this rank's latest forward: together they cover the rank's query
// heads and its KV heads once each (a KV head repeated per query head, in one call or passed to
// several, fails), each is GQA by grouping, and the rank makes one call per run of KV heads that
// serve equally many of its query heads. Returns the most KV heads one call received.
int64_t expect_calls_take_native_kv_heads(const sp::UlyssesAttention& core, const UnevenCase& uc,
                                          int64_t a2a_rank) {
  const int64_t a2a = uc.sp / uc.ring;
  EXPECT_FALSE(sp::heads_split_evenly(uc.hq, uc.hkv, a2a)) << uc.name << ": not an uneven split";
  const sp::RankHeads mine = sp::uneven_rank_heads(uc.hq, uc.hkv, a2a, a2a_rank);
  const std::vector<int64_t> counts = queries_per_kv_head(mine, uc.hq, uc.hkv);
  int64_t runs = 1;
  for (size_t j = 1; j < counts.size(); ++j) runs += counts[j] != counts[j - 1] ? 1 : 0;
  const std::vector<sp::UlyssesAttention::CoreCall>& calls = core.last_core_calls();
  EXPECT_EQ(static_cast<int64_t>(calls.size()), runs) << uc.name << " a2a rank " << a2a_rank;
  int64_t q_heads = 0, kv_heads = 0, widest = 0;
  for (const sp::UlyssesAttention::CoreCall& call : calls) {
    EXPECT_TRUE(call.kv_heads > 0 && call.q_heads % call.kv_heads == 0)
        << uc.name << ": a call with " << call.q_heads << " query and " << call.kv_heads
        << " KV heads";
    q_heads += call.q_heads;
    kv_heads += call.kv_heads;
    widest = std::max(widest, call.kv_heads);
  }
  EXPECT_EQ(q_heads, mine.q_count) << uc.name << " a2a rank " << a2a_rank;
  EXPECT_EQ(kv_heads, mine.kv_count) << uc.name << " a2a rank " << a2a_rank
                                     << ": KV heads received beyond the rank's own";
  EXPECT_LE(widest, mine.kv_count) << uc.name;
  return widest;
}

const std::vector<UnevenCase>& cases() {
  static const std::vector<UnevenCase> all = {
      {"hq6_hkv2_1x4", 1, 4, 6, 2},  // 2, 2, 1, 1 query heads; KV head 0 on ranks 0-1, 1 on 1-3
      {"hq7_hkv1_1x2", 1, 2, 7, 1},
      {"hq7_hkv1_1x3", 1, 3, 7, 1},
      {"hq7_hkv1_1x4", 1, 4, 7, 1},
      {"hq7_hkv1_2x2", 2, 2, 7, 1},
      {"hq7_hkv1_1x3_tiled_ckpt", 1, 3, 7, 1, true},
  };
  return all;
}

class UnevenHeads : public ::testing::TestWithParam<UnevenCase> {};

TEST_P(UnevenHeads, OneStepLossAndEveryGradientMatchSingleProcess) {
  const UnevenCase uc = GetParam();
  testing::run_ranks(static_cast<int>(uc.dp * uc.sp), [&](const testing::RankContext& ctx) {
    config::RunConfig c = case_config(uc);
    const at::Device cpu(at::kCPU);
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, uc.dp,
                                                  uc.sp, 60.0, cpu, uc.ring);
    model::LlamaForCausalLM model = train::build_model(c, mesh, cpu);
    train::StepLoss got = train::compute_gradients(
        model, rank_batches(c, uc.dp, mesh.dp_rank(), uc.sp, mesh.sp_rank(), uc.ring), mesh);
    const auto core = std::dynamic_pointer_cast<sp::UlyssesAttention>(model->attention_core());
    ASSERT_NE(core, nullptr) << model->attention_core()->name();
    const int64_t widest = expect_calls_take_native_kv_heads(*core, uc, mesh.sp_a2a().rank());

    // Reference: this process alone, the whole global batch in one micro-batch, no SP.
    config::RunConfig ref_c = case_config({uc.name, 1, 1, uc.hq, uc.hkv, false, uc.packed});
    ref_c.sequence.micro_batch = uc.dp;
    auto ref_mesh = comm::DeviceMesh::create_for_test(
        0, 1, ctx.temp_dir + "/ref-store-" + std::to_string(ctx.rank), 1, 1);
    model::LlamaForCausalLM ref_model = train::build_model(ref_c, ref_mesh, cpu);
    train::StepLoss want =
        train::compute_gradients(ref_model, rank_batches(ref_c, 1, 0, 1, 0), ref_mesh);

    EXPECT_EQ(got.valid_tokens, want.valid_tokens);
    EXPECT_NEAR(got.loss, want.loss, kLossRelTol * std::abs(want.loss)) << uc.name;
    auto params = model->named_parameters();
    double worst = 0.0;
    for (const auto& item : ref_model->named_parameters()) {
      const at::Tensor& g = params[item.key()].grad();
      ASSERT_TRUE(g.defined()) << item.key();
      const double err = testing::relative_error(g, item.value().grad());
      EXPECT_LT(err, kGradRelTol) << uc.name << " " << item.key() << " rank " << ctx.rank;
      worst = std::max(worst, err);
    }
    // All-zero gradients would match trivially.
    EXPECT_GT(ref_model->named_parameters()["model.layers.0.self_attn.k_proj.weight"]
                  .grad()
                  .norm()
                  .item<double>(),
              0);
    std::printf("%s rank %d: loss rel err %.3g, worst gradient rel err %.3g, %zu attention "
                "call(s), at most %lld KV heads in one\n",
                uc.name.c_str(), ctx.rank, std::abs(got.loss - want.loss) / want.loss, worst,
                core->last_core_calls().size(), static_cast<long long>(widest));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, UnevenHeads,
    ::testing::Values(cases()[0], cases()[1], cases()[2], cases()[3], cases()[4], cases()[5],
                      // Rank 1 holds query heads 3-5 of KV groups {0-3}, {4-7}: its heads do not
                      // form equal groups, so it attends in two calls (3 | 4-5) with one KV head
                      // each.
                      UnevenCase{"hq8_hkv2_1x3", 1, 3, 8, 2},
                      // sp divides the query heads but not the KV heads (3 over 2 ranks): ranks
                      // hold query heads 0-2 and 3-5 with KV heads 0-1 and 1-2, two calls each.
                      UnevenCase{"hq6_hkv3_1x2", 1, 2, 6, 3},
                      // The same all-to-all with a ring of 2 behind it: each of the two calls per
                      // rank runs ring attention over its own KV head(s) only.
                      UnevenCase{"hq6_hkv3_1x4_ring2", 1, 4, 6, 3, false, false, 2},
                      UnevenCase{"hq7_hkv1_1x3_packed", 1, 3, 7, 1, false, true}),
    [](const ::testing::TestParamInfo<UnevenCase>& info) { return info.param.name; });

// The GQA segments of Llama-3-8B's heads (32 query over 8 KV) at sp 6: 6, 6, 5, 5, 5, 5 query
// heads per rank, groups of 4.
TEST(UnevenHeadSegments, StraddledGroupsSplitIntoNativeGqaRuns) {
  using Runs = std::vector<std::vector<int64_t>>;  // {q_offset, q_count, kv_offset, kv_count}
  const auto runs_of = [](const sp::RankHeads& heads, int64_t hq, int64_t hkv) {
    Runs got;
    for (const sp::HeadSegment& s : sp::gqa_segments(heads, hq, hkv)) {
      got.push_back({s.q_offset, s.q_count, s.kv_offset, s.kv_count});
    }
    return got;
  };
  const auto segments = [&](int64_t rank) {
    return runs_of(sp::uneven_rank_heads(32, 8, 6, rank), 32, 8);
  };
  EXPECT_EQ(segments(0), (Runs{{0, 4, 0, 1}, {4, 2, 1, 1}}));  // q 0-5: kv 0 (whole), kv 1 (2)
  EXPECT_EQ(segments(1), (Runs{{0, 2, 0, 1}, {2, 4, 1, 1}}));  // q 6-11: kv 1 (2), kv 2 (whole)
  EXPECT_EQ(segments(2), (Runs{{0, 4, 0, 1}, {4, 1, 1, 1}}));  // q 12-16: kv 3, kv 4 (1)
  EXPECT_EQ(segments(3), (Runs{{0, 3, 0, 1}, {3, 2, 1, 1}}));  // q 17-21: kv 4 (3), kv 5 (2)
  // Whole groups in one run between partial ones: q 2-13 of groups of 4 at hq 16, hkv 4.
  EXPECT_EQ(runs_of(sp::RankHeads{2, 12, 0, 4}, 16, 4),
            (Runs{{0, 2, 0, 1}, {2, 8, 1, 2}, {10, 2, 3, 1}}));
  // Equal partial groups form one run (MHA here): q 2-3 of groups of 3 use KV heads 0 and 1.
  EXPECT_EQ(runs_of(sp::uneven_rank_heads(6, 2, 4, 1), 6, 2), (Runs{{0, 2, 0, 2}}));
}

// 3 steps of AdamW with clipping from the same init: loss and grad_norm per step and the final
// weights of every uneven mesh equal the single-process run. Step 1 starts from identical weights;
// later steps from weights that differ by the fp32 rounding of earlier updates.
TEST(UnevenHeadsRun, ThreeStepsEqualSingleProcess) {
  const std::string dir = testing::shared_dir("uneven-heads-test", "run");
  constexpr int64_t kSteps = 3;
  // Each model's single-process run first, then its uneven meshes.
  std::vector<UnevenCase> runs;
  for (const int64_t hq : {int64_t{7}, int64_t{6}}) {
    UnevenCase single;
    single.name = "hq" + std::to_string(hq) + "_1x1";
    single.dp = 1, single.sp = 1, single.hq = hq, single.hkv = hq == 7 ? 1 : 2;
    runs.push_back(single);
    for (const UnevenCase& uc : cases()) {
      if (uc.hq == hq) runs.push_back(uc);
    }
  }
  const auto out_dir = [&](const UnevenCase& uc) { return dir + "/" + uc.name; };
  for (const UnevenCase& uc : runs) {
    config::RunConfig c = case_config(uc);
    c.model.init_std = 0.05;
    c.sequence.micro_batch = 2 / uc.dp;  // the same global batch of 2 samples on every mesh
    c.optim.lr = 1e-2;
    c.optim.grad_clip = 1.0;
    c.train.steps = kSteps;
    c.profile.warmup_steps = 0;
    c.output.dir = out_dir(uc);
    c.checkpoint.dir = out_dir(uc) + "/ckpt";
    testing::run_ranks(static_cast<int>(uc.dp * uc.sp), [&](const testing::RankContext& ctx) {
      auto mesh =
          comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, uc.dp, uc.sp);
      EXPECT_EQ(train::run_training(c, mesh, at::Device(at::kCPU)), 0);
    });
  }
  if (testing::in_rank_child()) return;

  const std::string last = "/ckpt/step-" + std::to_string(kSteps) + "/model.safetensors";
  std::string base_name;
  std::vector<testing::StepRecord> base_steps;
  std::map<std::string, at::Tensor> base_weights;
  for (const UnevenCase& uc : runs) {
    const std::vector<testing::StepRecord> steps =
        testing::read_steps(out_dir(uc) + "/metrics.jsonl");
    ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << uc.name;
    auto weights = model::load_safetensors(out_dir(uc) + last);
    if (uc.sp == 1) {
      base_name = uc.name, base_steps = steps, base_weights = std::move(weights);
      EXPECT_GT(base_steps[0].grad_norm, 1.0) << "clipping should be active on step 1";
      continue;
    }
    const testing::StepsDiff worst =
        testing::expect_steps_match(steps, base_steps, kLossRelTol, kGradRelTol, uc.name);
    double worst_weight = 0;
    ASSERT_EQ(weights.size(), base_weights.size()) << uc.name;
    for (const auto& [name, w] : base_weights) {
      const double err = testing::relative_error(weights.at(name), w);
      EXPECT_LT(err, kGradRelTol) << uc.name << " vs " << base_name << ": " << name;
      worst_weight = std::max(worst_weight, err);
    }
    std::printf("%s vs %s over %lld steps: loss rel err %.2g, grad_norm %.2g, final weights %.2g\n",
                uc.name.c_str(), base_name.c_str(), static_cast<long long>(kSteps), worst.loss,
                worst.grad_norm, worst_weight);
  }
  ulysses::remove_tree(dir);
}

}  // namespace
}  // namespace ulysses
