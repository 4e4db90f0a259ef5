// ZeRO stage 3 beyond equivalence (zero_test.cpp holds that): after a step every parameter holds
// no weights between uses (storage of 0 bytes) and the rank's weight + gradient + optimizer bytes
// are 1/world of stage 0's, and every layer gather but the first is prefetched; a stage-3 run's
// phases contain zero_gather and zero_reduce; bf16 runs; evaluation goes unit by unit. Resume and
// checkpoint conversion with stage 3 are in zero_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mesh.h"
#include "data/data_loader.h"
#include "memory/activation_checkpoint.h"
#include "support/multi_rank.h"
#include "zero/gradient_step.h"
#include "train/evaluator.h"
#include "train/trainer.h"
#include "zero/zero_optimizer.h"
#include "zero/zero_partition.h"
#include "run_outputs.h"
#include "train_test_util.h"

namespace ulysses {
namespace {

constexpr double kLossRelTol = 1e-5;
constexpr double kWeightRelTol = 1e-4;

config::RunConfig stage3_config(const std::string& dir, const std::string& name, int64_t dp,
                                int64_t sp, int64_t stage) {
  config::RunConfig c = testing::tiny_run_config(8, 2, dp, sp);
  c.model.init_std = 0.05;
  c.sequence.length = 32;
  c.sequence.micro_batch = 2 / dp;
  c.sequence.grad_accum = 2;
  c.optim.lr = 1e-2;
  c.optim.grad_clip = 0.5;
  c.train.steps = 4;
  c.profile.warmup_steps = 0;
  c.zero.stage = stage;
  c.zero.bucket_mb = 0.01;
  c.output.dir = dir + "/" + name + "/out";
  c.checkpoint.dir = dir + "/" + name + "/ckpt";
  return c;
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

// Two stage-3 steps on 4 ranks by hand: every gather but the embedding's was prefetched,
// afterwards every parameter's storage is empty, and this
// rank's weight shards + gradient shards + AdamW state are 1/world of what stage 0 holds
// (weights + fp32 gradient buffer + two moments; fp32 weights are their own masters in both).
TEST(Zero3, ParametersHoldNothingBetweenUsesAndStatesAreOneWorldth) {
  constexpr int kWorld = 4;
  testing::run_ranks(kWorld, [&](const testing::RankContext& ctx) {
    config::RunConfig c = testing::tiny_run_config(8, 2, 1, kWorld);
    c.sequence.length = 32;
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, kWorld);
    model::LlamaForCausalLM model = train::build_model(c, mesh, at::Device(at::kCPU), nullptr);
    int64_t stage0_bytes = 0;
    for (const auto& p : model->parameters()) stage0_bytes += 4 * bytes_of(p);
    auto partition = std::make_shared<train::ZeroPartition>(model, mesh.world(), 3, 4096);
    memory::enable_layer_hooks(model, false, true, partition);
    train::ZeroOptimizer zero(*partition, c.optim, train::OptimizerPlacement::kDevice);
    partition->release_all();
    data::DataLoader loader(c.data, c.sequence, c.model.vocab_size, 1, 0, kWorld, ctx.rank);
    train::GradientOptions options;
    options.partition = partition.get();
    options.reduce = false;
    for (int64_t step = 1; step <= 2; ++step) {
      std::vector<data::Batch> batches = {loader.micro_batch(step, 0)};
      train::compute_gradients(model, batches, mesh, options);
      zero.clip(1.0);
      zero.step(1e-3);
      for (size_t i = 0; i < partition->params().size(); ++i) {
        const at::Tensor& p = partition->params()[i];
        EXPECT_EQ(p.numel(), 0) << partition->names()[i];
        EXPECT_EQ(p.storage().nbytes(), 0u) << partition->names()[i];
      }
    }
    // Every layer gather (forward and recompute) and the head's was prefetched: 2L + 1 per
    // micro-batch; the embedding, first of a micro-batch, is gathered when asked.
    const int64_t layers = model->model->num_layers();
    EXPECT_EQ(partition->prefetch_hits(), 2 * (2 * layers + 1));
    // Each layer's and the embedding's reduce-scatters found the unit before still in flight
    // (started, not yet waited for): L + 1 per micro-batch; the head's, first, found none.
    EXPECT_EQ(partition->overlapped_reductions(), 2 * (layers + 1));
    int64_t stage3_bytes = partition->weight_bytes() + partition->grad_bytes();
    for (const auto& [name, t] : zero.state_tensors()) {
      if (name.find(".master") == std::string::npos && name.find(".step") == std::string::npos) {
        stage3_bytes += bytes_of(t);  // moments; masters alias the fp32 weight shards
      }
    }
    const double ratio = static_cast<double>(stage3_bytes) / static_cast<double>(stage0_bytes);
    std::printf("rank %d: stage 3 holds %lld bytes of weights, gradients and AdamW state, stage 0 "
                "%lld: ratio %.4f (1/world = %.4f)\n", ctx.rank, static_cast<long long>(stage3_bytes),
                static_cast<long long>(stage0_bytes), ratio, 1.0 / kWorld);
    EXPECT_LT(ratio, 1.0 / kWorld * 1.02);  // padding to a multiple of the world only
    EXPECT_GT(ratio, 1.0 / kWorld * 0.98);
  });
}

// Evaluation of a sharded (stage-3) model on sp 2, with SP and without it (the first rank of the
// group evaluates whole sequences, the other walks the same gathers): the loss equals the whole
// model's evaluated by the same ranks (the same arithmetic: rel 1e-12), and no more than two units
// of weights are ever gathered at once, where gathering the whole model (as evaluation did before)
// holds every unit.
TEST(Zero3, EvaluationGathersUnitByUnitAndEqualsTheWholeModel) {
  constexpr int kWorld = 2;
  testing::run_ranks(kWorld, [&](const testing::RankContext& ctx) {
    const at::Device cpu(at::kCPU);
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, kWorld);
    for (int variant = 0; variant < 3; ++variant) {  // with SP, without, with SP and tied
      const bool bypass_sp = variant == 1;
      config::RunConfig c = testing::tiny_run_config(8, 2, 1, kWorld);
      c.model.tie_embeddings = variant == 2;
      c.model.num_layers = 4;
      c.model.init_std = 0.05;
      c.sequence.length = 32;
      c.eval.source = c.data.source;
      c.eval.steps = 2;
      c.attention.disable_in_eval = bypass_sp;
      model::LlamaForCausalLM whole = train::build_model(c, mesh, cpu);
      const train::EvalResult expected = train::evaluate(whole, c, mesh, cpu);

      model::LlamaForCausalLM sharded = train::build_model(c, mesh, cpu, nullptr, true);
      auto partition = std::make_shared<train::ZeroPartition>(
          sharded, mesh.world(), 4096, at::TensorOptions(at::kFloat),
          train::shard_source(c.model, sharded));
      memory::enable_layer_hooks(sharded, false, true, partition);
      const train::EvalResult got = train::evaluate(sharded, c, mesh, cpu, partition.get());
      partition->release_all();
      const std::string what = variant == 0 ? "with SP" : variant == 1 ? "without SP" : "tied";
      EXPECT_NEAR(got.loss, expected.loss, 1e-12 * expected.loss) << what;
      EXPECT_EQ(got.tokens, expected.tokens) << what;
      EXPECT_TRUE(partition->all_released()) << what;

      int64_t all_bytes = 0, largest_unit = 0, layer_bytes = 0;
      for (const auto& item : whole->named_parameters()) {
        const int64_t bytes = bytes_of(item.value());
        all_bytes += bytes;
        if (item.key().rfind("model.layers.0.", 0) == 0) layer_bytes += bytes;
        if (item.key().find("layers") == std::string::npos) {
          largest_unit = std::max(largest_unit, bytes);
        }
      }
      largest_unit = std::max(largest_unit, layer_bytes);
      const int64_t peak = partition->peak_whole_bytes();
      std::printf("%s: at most %lld bytes of weights gathered (the whole model %lld)\n",
                  what.c_str(), static_cast<long long>(peak), static_cast<long long>(all_bytes));
      EXPECT_GT(peak, 0) << what;
      EXPECT_LE(peak, 2 * largest_unit + 4096) << what;  // two units (+ the norm beside the head)
      EXPECT_LT(peak, all_bytes) << what;
    }
  });
}

// The phases of a stage-3 run (metrics.jsonl per step, summary.json medians) contain the gathers
// and the reduce-scatters.
TEST(Zero3, RunPhasesContainZeroGatherAndZeroReduce) {
  const std::string dir = testing::shared_dir("zero3-test", "phases");
  config::RunConfig c = stage3_config(dir, "phases", 1, 2, 3);
  c.train.steps = 2;
  c.checkpoint.dir.clear();
  testing::train_on_ranks(c);
  if (testing::in_rank_child()) return;
  std::ifstream in(c.output.dir + "/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("phases")) continue;
    ++steps;
    EXPECT_GT(j["phases"].value("zero_gather", 0.0), 0.0) << line;
    EXPECT_GT(j["phases"].value("zero_reduce", 0.0), 0.0) << line;
  }
  EXPECT_EQ(steps, 2);
  const auto summary = nlohmann::json::parse(std::ifstream(c.output.dir + "/summary.json"));
  ASSERT_TRUE(summary.contains("phases_ms_median")) << summary.dump();
  EXPECT_TRUE(summary["phases_ms_median"].contains("zero_gather")) << summary.dump();
  EXPECT_TRUE(summary["phases_ms_median"].contains("zero_reduce")) << summary.dump();
  // The run says what it did: stage 3, and layers recomputed although memory.checkpointing is off.
  ASSERT_FALSE(c.memory.checkpointing);
  EXPECT_EQ(summary["memory"]["zero_stage"], 3) << summary.dump();
  EXPECT_EQ(summary["memory"]["checkpointing"], true) << summary.dump();
}

// bf16 weights with tied embeddings, tiled MLP and loss, checkpointing with offload and optimizer
// offload: stages 1 (its updated shards gathered in bf16) and 3 follow stage 0 (bf16 rounding of
// the weights: loss within 2e-3 relative).
TEST(Zero3, Bf16TiedEmbeddingsWithEveryMemoryFeatureFollowsStage0) {
  const std::string dir = testing::shared_dir("zero3-test", "bf16");
  std::vector<config::RunConfig> configs;
  for (int64_t stage : {0, 1, 3}) {
    configs.push_back(stage3_config(dir, "bf16-stage" + std::to_string(stage), 1, 2, stage));
    config::RunConfig& c = configs.back();
    c.model.tie_embeddings = true;
    c.memory.precision = "bf16";
    c.memory.tiled_mlp.value = 2;
    c.memory.tiled_loss.value = 2;
    c.memory.checkpointing = true;
    c.memory.offload_activations = true;
    c.memory.offload_optimizer = true;
    c.train.steps = 3;
    testing::train_on_ranks(c);
  }
  if (testing::in_rank_child()) return;
  const auto base = testing::read_steps(configs[0].output.dir + "/metrics.jsonl");
  ASSERT_EQ(base.size(), 3u);
  for (size_t k = 1; k < configs.size(); ++k) {
    const auto steps = testing::read_steps(configs[k].output.dir + "/metrics.jsonl");
    ASSERT_EQ(steps.size(), 3u);
    for (size_t s = 0; s < base.size(); ++s) {
      EXPECT_NEAR(steps[s].loss, base[s].loss, 2e-3 * base[s].loss)
          << configs[k].output.dir << " step " << s + 1;
    }
  }
}

}  // namespace
}  // namespace ulysses
