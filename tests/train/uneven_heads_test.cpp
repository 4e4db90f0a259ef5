// mesh.uneven_heads: an sp that does not divide the query heads (hq 7 at sp 2, 3, 4; hq 6 with
// hkv 2 at sp 4; hq 8 with hkv 2 at sp 3, where a rank's query heads straddle a KV group), or
// whose KV heads neither divide nor are a multiple of it (hq 6 with hkv 3 at sp 2), trains
// exactly as one process does: every parameter gradient of a step (fp32: relative 1e-5 on the
// loss, 1e-4 on each gradient, as equivalence_test.cpp), and whole 3-step runs (loss and
// grad_norm every step, the final weights), on real Gloo ranks.
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
  return c;
}

std::vector<data::Batch> rank_batches(const config::RunConfig& c, int64_t dp, int64_t dp_rank,
                                      int64_t sp, int64_t sp_rank) {
  data::DataLoader loader(c.data, c.sequence, c.model.vocab_size, dp, dp_rank, sp, sp_rank);
  return {loader.micro_batch(1, 0)};
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
    auto mesh =
        comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, uc.dp, uc.sp);
    model::LlamaForCausalLM model = train::build_model(c, mesh, cpu);
    train::StepLoss got = train::compute_gradients(
        model, rank_batches(c, uc.dp, mesh.dp_rank(), uc.sp, mesh.sp_rank()), mesh);

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
    if (ctx.rank == 0) {
      std::printf("%s: loss rel err %.3g, worst gradient rel err %.3g\n", uc.name.c_str(),
                  std::abs(got.loss - want.loss) / want.loss, worst);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, UnevenHeads,
    ::testing::Values(cases()[0], cases()[1], cases()[2], cases()[3], cases()[4], cases()[5],
                      // Rank 1 holds query heads 3-5 of KV groups {0-3}, {4-7}: its heads do not
                      // form equal groups, so each gets its own KV head locally.
                      UnevenCase{"hq8_hkv2_1x3", 1, 3, 8, 2},
                      // sp divides the query heads but not the KV heads (3 over 2 ranks): ranks
                      // hold query heads 0-2 and 3-5 with KV heads 0-1 and 1-2.
                      UnevenCase{"hq6_hkv3_1x2", 1, 2, 6, 3},
                      UnevenCase{"hq7_hkv1_1x3_packed", 1, 3, 7, 1, false, true}),
    [](const ::testing::TestParamInfo<UnevenCase>& info) { return info.param.name; });

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
