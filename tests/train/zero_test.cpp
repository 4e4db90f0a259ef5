// ZeRO stages 1, 2 and 3 (zero.stage) on real Gloo ranks: per-step losses, grad norms and the final
// weights equal stage 0 on the same mesh (fp32: loss rel 1e-5, weights rel 1e-4), with clipping
// active, gradient accumulation 2, tiled MLP + activation checkpointing and optimizer offload, and
// for the Qwen2 (q/k/v biases: 1-D parameters sharded and gathered) and Qwen3 (q/k norms inside
// attention) families; each rank's optimizer file holds only its shard; resume is bit-exact; bad
// input is one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "comm/mesh.h"
#include "common/error.h"
#include "config/run_config.h"
#include "model/safetensors.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "run_outputs.h"
#include "train_test_util.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses {
namespace {

constexpr double kLossRelTol = 1e-5;
constexpr double kWeightRelTol = 1e-4;
constexpr int64_t kSteps = 4;
// 10 KiB: stage 1 cuts its flat buffers in several buckets, and stages 2 and 3 cut the embedding,
// the LM head, q/o_proj and the MLP weights in two parts (zero_partition.h: more than
// 10 KiB / 4 bytes / world elements per rank; k/v_proj and the norms are one part). In 40 KiB
// every parameter of this model is one part at world 4.
constexpr double kBucketMb = 0.01;

// A tiny model whose step-1 gradient norm is far above grad_clip (clipping active every step).
config::RunConfig zero_config(const std::string& dir, int64_t dp, int64_t sp, int64_t stage,
                              const std::string& tag) {
  config::RunConfig c = testing::tiny_run_config(8, 2, dp, sp);
  c.model.init_std = 0.05;
  c.sequence.length = 32;
  c.sequence.micro_batch = 2 / dp;  // global batch of 2 x grad_accum samples on every mesh
  c.sequence.grad_accum = 2;
  c.optim.lr = 1e-2;
  c.optim.weight_decay = 0.1;
  c.optim.grad_clip = 0.5;
  c.train.steps = kSteps;
  c.profile.warmup_steps = 0;
  c.zero.stage = stage;
  c.zero.bucket_mb = kBucketMb;
  const std::string name = tag + "-dp" + std::to_string(dp) + "sp" + std::to_string(sp) +
                           "-stage" + std::to_string(stage);
  c.output.dir = dir + "/" + name + "/out";
  c.checkpoint.dir = dir + "/" + name + "/ckpt";
  return c;
}

std::map<std::string, at::Tensor> final_weights(const config::RunConfig& c) {
  return model::load_safetensors(c.checkpoint.dir + "/step-" + std::to_string(kSteps) +
                                 "/model.safetensors");
}

// Checks the runs of configs[1...] against configs[0]'s (trained): losses, gradient norms and
// final weights.
void expect_runs_equal(const std::string& tag, const std::vector<config::RunConfig>& configs) {
  const auto base = testing::read_steps(configs[0].output.dir + "/metrics.jsonl");
  ASSERT_EQ(base.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(base[0].grad_norm, 2 * configs[0].optim.grad_clip) << "clipping must be active";
  const auto base_weights = final_weights(configs[0]);
  for (size_t k = 1; k < configs.size(); ++k) {
    const config::RunConfig& c = configs[k];
    const std::string what = tag + " dp " + std::to_string(c.mesh.dp) + " sp " +
                             std::to_string(c.mesh.sp) + " stage " + std::to_string(c.zero.stage);
    const auto steps = testing::read_steps(configs[k].output.dir + "/metrics.jsonl");
    ASSERT_EQ(steps.size(), base.size()) << what;
    for (size_t s = 0; s < base.size(); ++s) {
      EXPECT_NEAR(steps[s].loss, base[s].loss, kLossRelTol * base[s].loss) << what << " step " << s + 1;
      EXPECT_NEAR(steps[s].grad_norm, base[s].grad_norm, kLossRelTol * base[s].grad_norm)
          << what << " step " << s + 1;
    }
    const auto weights = final_weights(configs[k]);
    ASSERT_EQ(weights.size(), base_weights.size()) << what;
    double worst = 0.0;
    for (const auto& [name, w] : base_weights) {
      ASSERT_TRUE(weights.count(name)) << what << " " << name;
      const double err = testing::relative_error(weights.at(name), w);
      worst = std::max(worst, err);
      EXPECT_LT(err, kWeightRelTol) << what << " " << name;
    }
    std::printf("%s: worst weight rel err %.3g\n", what.c_str(), worst);
  }
}

// Trains stage 0, 1, 2 and 3 with `adjust` applied, and checks 1, 2 and 3 against 0.
void expect_stages_equal(const std::string& tag, int64_t dp, int64_t sp,
                         const std::function<void(config::RunConfig&)>& adjust = {}) {
  const std::string dir = testing::shared_dir("zero-test", tag + "-dp" + std::to_string(dp) + "sp" + std::to_string(sp));
  std::vector<config::RunConfig> configs;
  for (int64_t stage : {0, 1, 2, 3}) {
    configs.push_back(zero_config(dir, dp, sp, stage, tag));
    if (adjust) adjust(configs.back());
    testing::train_on_ranks(configs.back());
  }
  if (testing::in_rank_child()) return;
  expect_runs_equal(tag, configs);
}

TEST(Zero, Stages1To3EqualStage0OnSp2) { expect_stages_equal("plain", 1, 2); }
TEST(Zero, Stages1To3EqualStage0OnDp2) { expect_stages_equal("plain", 2, 1); }
TEST(Zero, Stages1To3EqualStage0OnDp2Sp2) { expect_stages_equal("plain", 2, 2); }
TEST(Zero, Stages1To3EqualStage0OnSp4) { expect_stages_equal("plain", 1, 4); }

TEST(Zero, Stages1To3EqualStage0WithTiledMlpAndCheckpointing) {
  expect_stages_equal("tiled", 2, 2, [](config::RunConfig& c) {
    c.memory.tiled_mlp.value = 2;
    c.memory.tiled_loss.value = 2;
    c.memory.checkpointing = true;
  });
}

TEST(Zero, Stages1To3EqualStage0WithOptimizerOffload) {
  expect_stages_equal("offload", 1, 4,
                      [](config::RunConfig& c) { c.memory.offload_optimizer = true; });
}

// The offloaded optimizer (host update, clipping folded in, the host norm) at stages 0 and 3
// against the on-device optimizer at stage 0, on dp 2 with tied embeddings (the embedding's two
// gradient contributions summed before the update) and clipping active on every step; the
// tolerances of expect_runs_equal (the two differ in rounding only: the host pass's exact sqrt,
// the fp64 norm). Stages 1 and 2 with offload equal stage 0 with offload in the test above.
TEST(Zero, OffloadedOptimizerEqualsTheDeviceOptimizerOnDp2WithTiedEmbeddings) {
  const std::string dir = testing::shared_dir("zero-test", "offload-vs-device");
  std::vector<config::RunConfig> configs = {zero_config(dir, 2, 1, 0, "device")};
  for (int64_t stage : {0, 3}) {
    configs.push_back(zero_config(dir, 2, 1, stage, "host"));
    configs.back().memory.offload_optimizer = true;
  }
  for (config::RunConfig& c : configs) {
    c.model.tie_embeddings = true;
    testing::train_on_ranks(c);
  }
  if (testing::in_rank_child()) return;
  expect_runs_equal("offload vs device", configs);
}

// Stage 0 with the optimizer offloaded (gradients on the host, reduced two 10 KiB buckets at a
// time) on dp 2 and on an SP-only mesh (sp 2, whose ranks sum their partial gradients too) equals
// the single process with the same global batch: the tolerances of expect_runs_equal (loss and
// grad norm rel 1e-5, final weights rel 1e-4). GradientBuffers' test asserts the two-bucket bound.
TEST(Zero, Stage0OffloadOnTwoRanksEqualsTheSingleProcess) {
  const std::string dir = testing::shared_dir("zero-test", "stage0-offload-vs-single");
  std::vector<config::RunConfig> configs = {zero_config(dir, 1, 1, 0, "single"),
                                            zero_config(dir, 2, 1, 0, "offload"),
                                            zero_config(dir, 1, 2, 0, "offload")};
  for (config::RunConfig& c : configs) {
    c.memory.offload_optimizer = true;
    testing::train_on_ranks(c);
  }
  if (testing::in_rank_child()) return;
  expect_runs_equal("stage 0 offload vs single process", configs);
}

// expect_stages_equal for `family` (zero_config's model with testing::set_family's shapes), every
// run starting from the same weights with the biases and norms moved off their init
// (testing::write_perturbed_weights).
void expect_family_stages_equal(const std::string& family, int64_t dp, int64_t sp,
                                const std::function<void(config::RunConfig&)>& adjust = {}) {
  const std::string weights = testing::shared_dir("zero-test", family + "-weights");
  config::ModelOptions model = zero_config(weights, dp, sp, 0, family).model;  // shapes only
  testing::set_family(model, family);
  if (!testing::in_rank_child()) testing::write_perturbed_weights(model, weights);
  expect_stages_equal(family, dp, sp, [&](config::RunConfig& c) {
    testing::set_family(c.model, family);
    c.model.load = weights;
    if (adjust) adjust(c);
  });
}

// On two ranks each, to keep the suite's time: the four-rank meshes above exercise the sharding
// over a world of 4 already; what these add is the families' parameters in every stage.
TEST(Zero, Stages1To3EqualStage0ForQwen2OnDp2) { expect_family_stages_equal("qwen2", 2, 1); }

// Qwen3 (hq * hd = 2 h) with every memory feature: the q/k norms are gathered per layer,
// recomputed with the layer (their inputs offloaded) and updated on the host.
TEST(Zero, Stages1To3EqualStage0ForQwen3OnSp2WithEveryMemoryFeature) {
  expect_family_stages_equal("qwen3", 1, 2, [](config::RunConfig& c) {
    c.memory.tiled_mlp.value = 2;
    c.memory.tiled_loss.value = 2;
    c.memory.checkpointing = true;
    c.memory.offload_activations = true;
    c.memory.offload_optimizer = true;
  });
}

// Each rank's optimizer file holds its shard only: ~1/world of the moments, not all of them. Stage
// 1 shards the flat buffer ("zero.flat0"), stages 2 and 3 every parameter ("zero.param<i>",
// ceil(numel / world) elements each).
TEST(Zero, EachRankWritesOnlyItsShard) {
  const std::string dir = testing::shared_dir("zero-test", "shards");
  const config::RunConfig stage1 = zero_config(dir, 2, 2, 1, "shards");
  const config::RunConfig stage2 = zero_config(dir, 2, 2, 2, "shards");
  testing::train_on_ranks(stage1);
  testing::train_on_ranks(stage2);
  if (testing::in_rank_child()) return;
  int64_t parameters = 0, padded = 0, count = 0;
  for (const auto& [name, w] : final_weights(stage1)) {
    parameters += w.numel();
    // Stage 2's shards: ceil(n / 4) elements in the fewest parts of equal size that fit the
    // bucket per rank, rounded up to whole parts.
    const int64_t one_part = (w.numel() + 3) / 4;
    const int64_t fits = static_cast<int64_t>(kBucketMb * 1048576) / 4 / 4;
    const int64_t parts = (one_part + fits - 1) / fits;
    padded += parts * ((one_part + parts - 1) / parts);
    ++count;
  }
  for (const auto* c : {&stage1, &stage2}) {
    const std::string step_dir = c->checkpoint.dir + "/step-" + std::to_string(kSteps);
    const auto trainer = nlohmann::json::parse(std::ifstream(step_dir + "/trainer_state.json"));
    EXPECT_EQ(trainer["zero_stage"], c->zero.stage);
    EXPECT_EQ(trainer["zero_layout"], c->zero.stage == 1 ? "flat" : "param");
    for (int r = 0; r < 4; ++r) {
      const auto shard = model::load_safetensors(step_dir + "/optimizer-" + std::to_string(r) +
                                                 "-of-4.safetensors");
      if (c->zero.stage == 1) {
        ASSERT_TRUE(shard.count("zero.flat0.exp_avg")) << r;
        EXPECT_EQ(shard.at("zero.flat0.exp_avg").numel(), (parameters + 3) / 4) << r;
        EXPECT_EQ(shard.at("zero.flat0.master").numel(), (parameters + 3) / 4) << r;
        continue;
      }
      int64_t moments = 0, masters = 0;
      for (int64_t i = 0; i < count; ++i) {
        const std::string key = "zero.param" + std::to_string(i);
        ASSERT_TRUE(shard.count(key + ".exp_avg")) << r << " " << key;
        moments += shard.at(key + ".exp_avg").numel();
        masters += shard.at(key + ".master").numel();
      }
      EXPECT_EQ(moments, padded) << r;
      EXPECT_EQ(masters, padded) << r;
    }
  }
}

// Checkpoints convert between stages and world sizes (and so between the flat and the parameter
// layout): 2 (world 4) -> 1 (world 2), 3 -> 0, 0 -> 3, 3 (world 4) -> 2 (world 2)
// and 1 -> 3 (3 -> 2 also between the parameter layout's part sizes, which depend on the world);
// and from a checkpoint written before parameters were cut in parts (one part each, and no
// zero_part_numel in trainer_state.json), into parts and into the same layout (each rank reads
// its own file). Each ends where the uninterrupted run of the
// checkpoint's writer ends (rel 1e-4; a run that restarted AdamW from zero moments, or read a
// shard in the wrong layout, is off by far more); resuming a stage 2 or 3 run on the same mesh
// and buckets gives its step-4 weights and loss bit for bit (a stage-3 checkpoint holds the whole
// weights, gathered on save).
TEST(Zero, CheckpointsConvertBetweenStagesAndWorlds) {
  const std::string dir = testing::shared_dir("zero-test", "convert");
  struct Case {
    int64_t from_stage, from_dp, to_stage, to_dp;
    double from_bucket_mb = kBucketMb, to_bucket_mb = kBucketMb;
    bool before_parts = false;  // the checkpoint as written before parts: no zero_part_numel
    bool exact = false;         // the same stage, world and buckets: bit-exact
  };
  std::set<std::string> writers;  // the output dirs of the uninterrupted runs made so far
  for (const Case& k : {Case{2, 2, 1, 1}, Case{3, 2, 0, 2},
                        Case{0, 2, 3, 2}, Case{3, 2, 2, 1}, Case{1, 2, 3, 2},
                        Case{3, 2, 3, 2, 4 * kBucketMb, kBucketMb, true},
                        Case{3, 2, 3, 2, 4 * kBucketMb, 4 * kBucketMb, true},
                        Case{2, 2, 2, 2, kBucketMb, kBucketMb, false, true},
                        Case{3, 2, 3, 2, kBucketMb, kBucketMb, false, true}}) {
    const std::string from = std::to_string(static_cast<int>(k.from_bucket_mb * 1e3)) +
                             (k.before_parts ? "old" : "");
    const std::string tag = std::to_string(k.from_stage) + "to" + std::to_string(k.to_stage) +
                            "dp" + std::to_string(k.to_dp) + "bucket" + from + "to" +
                            std::to_string(static_cast<int>(k.to_bucket_mb * 1e3));
    // One uninterrupted run per writer (stage, world, buckets, layout): the cases that resume
    // from the same writer share its run and checkpoint (parent and rank children skip alike).
    config::RunConfig full = zero_config(dir, k.from_dp, 2, k.from_stage, "full-bucket" + from);
    full.zero.bucket_mb = k.from_bucket_mb;
    full.checkpoint.every = 2;
    const bool first_of_writer = writers.insert(full.output.dir).second;
    if (first_of_writer) testing::train_on_ranks(full);
    if (k.before_parts && first_of_writer && !testing::in_rank_child()) {
      const std::string path = full.checkpoint.dir + "/step-2/trainer_state.json";
      nlohmann::json trainer = nlohmann::json::parse(std::ifstream(path));
      ASSERT_TRUE(trainer.contains("zero_part_numel")) << tag;
      trainer.erase("zero_part_numel");
      std::ofstream(path) << trainer.dump(2) << "\n";
    }
    config::RunConfig resumed = zero_config(dir, k.to_dp, 2, k.to_stage, "resumed" + tag);
    resumed.zero.bucket_mb = k.to_bucket_mb;
    resumed.sequence.micro_batch = full.sequence.micro_batch * k.from_dp / k.to_dp;  // same batch
    resumed.checkpoint.resume = full.checkpoint.dir + "/step-2";
    testing::train_on_ranks(resumed);
    if (testing::in_rank_child()) continue;
    const auto a = final_weights(full);
    const auto b = final_weights(resumed);
    ASSERT_EQ(a.size(), b.size()) << tag;
    for (const auto& [name, w] : a) {
      ASSERT_GT(w.numel(), 0) << tag << " " << name;
      if (k.exact) {
        EXPECT_TRUE(at::equal(w, b.at(name))) << tag << " " << name;
      } else {
        EXPECT_LT(testing::relative_error(b.at(name), w), kWeightRelTol) << tag << " " << name;
      }
    }
    const auto la = testing::read_steps(full.output.dir + "/metrics.jsonl");
    const auto lb = testing::read_steps(resumed.output.dir + "/metrics.jsonl");
    ASSERT_EQ(lb.size(), 2u) << tag;
    if (k.exact) {
      EXPECT_EQ(lb[1].loss, la[3].loss) << tag;
    } else {
      EXPECT_NEAR(lb[1].loss, la[3].loss, kLossRelTol * la[3].loss) << tag;
    }
  }
}

std::string validation_error(config::RunConfig c) {
  try {
    config::validate(c, static_cast<int>(c.mesh.dp * c.mesh.sp));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(ZeroConfig, BadInputIsOneLine) {
  config::RunConfig c = testing::tiny_run_config(8, 2, 2, 2);
  c.data.source = "synthetic";
  EXPECT_EQ(validation_error(c), "");
  c.zero.stage = 2;
  EXPECT_EQ(validation_error(c), "");
  c.zero.stage = 4;
  EXPECT_EQ(validation_error(c), "zero.stage: must be 0, 1, 2 or 3, got 4");
  c.zero.stage = -1;
  EXPECT_EQ(validation_error(c), "zero.stage: must be 0, 1, 2 or 3, got -1");
  c.zero.stage = 3;
  EXPECT_EQ(validation_error(c), "");
  config::RunConfig single = testing::tiny_run_config(8, 2, 1, 1);
  single.zero.stage = 3;
  EXPECT_EQ(validation_error(single), "") << "stage 3 in a world of 1 is a no-op";
  c.zero.stage = 1;
  c.zero.bucket_mb = 0;
  EXPECT_EQ(validation_error(c), "zero.bucket_mb: must be > 0, got 0.0");
}

}  // namespace
}  // namespace ulysses
