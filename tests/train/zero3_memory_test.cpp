// What ZeRO-3's sharded build is for: under a per-rank memory cap that stage 0's peak exceeds, a
// model trains at zero.stage 3 over 4 real Gloo ranks (dp 2 x sp 2) with the cap enforced as
// ulysses-train enforces it (memory.limit_gib: RLIMIT_AS above the rank's start-up baseline), with
// the losses of stage 0 run without a cap (fp32: relative 1e-5 over 4 steps), and its peak per
// rank (summary.json) below stage 0's.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mesh.h"
#include "memory/memory_limit.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "run_outputs.h"
#include "train_test_util.h"

namespace ulysses {
namespace {

constexpr double kLossRelTol = 1e-5;
constexpr int64_t kSteps = 4;
constexpr int kWorld = 4;
// The cap of the stage-3 run: 82 MiB of address space above the baseline. A stage-3 rank of the
// model below reaches about 59 MiB (its shards of weights, gradients and moments, 17 MiB at world
// 4, the gathered units and one malloc arena); stage 0 holds 16 bytes per parameter (67 MiB) and
// its resident peak exceeds the cap.
constexpr double kLimitGib = 0.08;

// 4.4M parameters whose states dominate: 18 layers of h 128 and intermediate 512, a vocabulary of
// 512 and 16 tokens per rank, on dp 2 x sp 2.
config::RunConfig states_config(const std::string& dir, int64_t stage) {
  config::RunConfig c = testing::tiny_run_config(8, 2, 2, 2);
  c.model.hidden_size = 128;
  c.model.head_dim = 16;
  c.model.num_layers = 18;
  c.model.intermediate_size = 512;
  c.model.vocab_size = 512;
  c.model.init_std = 0.05;
  c.sequence.length = 32;
  c.optim.lr = 1e-3;
  c.train.steps = kSteps;
  c.profile.warmup_steps = 0;
  c.zero.stage = stage;
  c.zero.bucket_mb = 1;
  c.output.dir = dir + "/stage" + std::to_string(stage);
  return c;
}

// Runs `c` on its ranks, each applying memory.limit_gib as ulysses-train does (after the process
// groups, before the model).
void train_on_ranks(const config::RunConfig& c) {
  testing::run_ranks(kWorld, [&](const testing::RankContext& ctx) {
    const at::Device cpu(at::kCPU);
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, c.mesh.dp,
                                                  c.mesh.sp);
    memory::apply_memory_limit(c.memory.limit_gib, cpu);
    EXPECT_EQ(train::run_training(c, mesh, cpu), 0);
  }, 600.0);
}

TEST(Zero3Memory, CappedRunOnFourRanksHasStage0LossesBelowItsPeak) {
  const std::string dir = testing::shared_dir("zero3-memory-test", "capped");
  const config::RunConfig stage0 = states_config(dir, 0);
  config::RunConfig stage3 = states_config(dir, 3);
  stage3.memory.limit_gib = kLimitGib;
  train_on_ranks(stage0);
  train_on_ranks(stage3);
  if (testing::in_rank_child()) return;
  const auto base = testing::read_steps(stage0.output.dir + "/metrics.jsonl");
  const auto capped = testing::read_steps(stage3.output.dir + "/metrics.jsonl");
  ASSERT_EQ(base.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(capped.size(), base.size());
  for (size_t s = 0; s < base.size(); ++s) {
    EXPECT_NEAR(capped[s].loss, base[s].loss, kLossRelTol * base[s].loss) << "step " << s + 1;
  }
  // Peaks per rank (the largest rank's resident-set high-water mark) above the start-up baseline.
  auto peak_above_baseline = [](const config::RunConfig& c) {
    const auto summary = nlohmann::json::parse(std::ifstream(c.output.dir + "/summary.json"));
    return summary.at("max_rank_peak_mem_bytes").get<double>() -
           summary.at("memory_baseline_bytes").get<double>();
  };
  const double peak0 = peak_above_baseline(stage0), peak3 = peak_above_baseline(stage3);
  const double cap_bytes = kLimitGib * (1 << 30);
  std::printf("peak per rank above the baseline: stage 0 %.1f MiB, stage 3 %.1f MiB (cap %.1f "
              "MiB): %.2fx\n", peak0 / (1 << 20), peak3 / (1 << 20), cap_bytes / (1 << 20),
              peak0 / peak3);
  EXPECT_GT(peak0, cap_bytes);  // stage 0 could not run under the cap
  EXPECT_LT(peak3, peak0);
}

}  // namespace
}  // namespace ulysses
