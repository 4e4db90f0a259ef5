// Whole training runs on real Gloo ranks: loss falls on a learnable token file, sp = 1, 2, 4 give
// the same per-step losses, resume reproduces steps bit-for-bit, checkpoints follow HF Llama, and
// Qwen2/Qwen3 checkpoints follow transformers' layout for their family and train their biases and
// q/k norms; evaluation of a saved checkpoint (with and without SP) reproduces the trained model's loss; resume
// refuses what it cannot continue, continues the data by samples seen and appends to metrics;
// non-finite gradients skip the update; every rank writes its share of a checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "comm/mesh.h"
#include "common/error.h"
#include "model/safetensors.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "run_outputs.h"
#include "train_test_util.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses {
namespace {

constexpr double kLossAgreeRelTol = 1e-4;  // issue: per-step losses of sp = 1, 2, 4 agree

// Tokens where the next token is a fixed function of the current one, so a model can learn it.
void write_learnable_tokens(const std::string& path, int64_t count, int64_t vocab) {
  std::vector<uint16_t> tokens(count);
  uint32_t state = 12345;
  for (int64_t i = 0; i < count; ++i) {
    if (i % 97 == 0) {  // fresh random start now and then
      state = state * 1103515245u + 12345u;
      tokens[i] = static_cast<uint16_t>((state >> 16) % vocab);
    } else {
      tokens[i] = static_cast<uint16_t>((tokens[i - 1] * 7 + 3) % vocab);
    }
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<double> step_losses(const std::string& metrics_path) {
  std::vector<double> losses;
  for (const auto& j : read_lines(metrics_path))
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
  return losses;
}

std::vector<double> eval_losses(const std::string& metrics_path) {
  std::vector<double> losses;
  for (const auto& j : read_lines(metrics_path))
    if (j.contains("eval")) losses.push_back(j["eval"]["loss"].get<double>());
  return losses;
}

config::RunConfig learnable_config(const std::string& dir, int64_t dp, int64_t sp, int64_t steps) {
  config::RunConfig c = testing::tiny_run_config(4, 2, dp, sp);
  c.model.init_std = 0.05;
  c.sequence.length = 32;
  c.sequence.micro_batch = 2 / dp;
  c.data.source = "tokens:" + dir + "/tokens.bin";
  c.data.token_dtype = "uint16";
  c.optim.lr = 1e-2;
  c.optim.warmup_steps = 2;
  c.optim.schedule = "cosine";
  c.train.steps = steps;
  c.profile.warmup_steps = 0;
  return c;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The message of the exception run_training throws on this rank ("" when it returns).
std::string training_error(const config::RunConfig& c, const testing::RankContext& ctx) {
  auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, c.mesh.dp,
                                                c.mesh.sp);
  try {
    EXPECT_EQ(train::run_training(c, mesh, at::Device(at::kCPU)), 0);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(TrainingRun, LossFallsAndSequenceParallelDegreesAgree) {
  const std::string dir = testing::shared_dir("train-test", "agree");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  std::vector<std::vector<double>> losses_by_sp;
  for (int64_t sp : {1, 2, 4}) {
    config::RunConfig c = learnable_config(dir, 1, sp, 20);
    c.output.dir = dir + "/sp" + std::to_string(sp);
    testing::train_on_ranks(c);
    if (testing::in_rank_child()) continue;
    losses_by_sp.push_back(step_losses(c.output.dir + "/metrics.jsonl"));
  }
  if (testing::in_rank_child()) return;
  ASSERT_EQ(losses_by_sp[0].size(), 20u);
  const auto& base = losses_by_sp[0];
  EXPECT_LT(base.back(), 0.6 * base.front()) << "loss did not fall: " << base.front() << " -> " << base.back();
  for (size_t i = 1; i < losses_by_sp.size(); ++i) {
    ASSERT_EQ(losses_by_sp[i].size(), base.size());
    for (size_t s = 0; s < base.size(); ++s) {
      EXPECT_NEAR(losses_by_sp[i][s], base[s], kLossAgreeRelTol * base[s])
          << "sp index " << i << " step " << s + 1;
    }
  }
}

TEST(TrainingRun, ResumeReproducesStepsBitForBit) {
  const std::string dir = testing::shared_dir("train-test", "resume");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig full = learnable_config(dir, 1, 2, 6);
  full.output.dir = dir + "/full";
  full.checkpoint.dir = dir + "/ckpt";
  full.checkpoint.every = 3;
  testing::train_on_ranks(full);

  config::RunConfig resumed = full;
  resumed.output.dir = dir + "/resumed";
  resumed.checkpoint.dir = dir + "/ckpt-resumed";
  resumed.checkpoint.resume = dir + "/ckpt/step-3";
  testing::train_on_ranks(resumed);
  if (testing::in_rank_child()) return;

  const auto a = step_losses(full.output.dir + "/metrics.jsonl");
  const auto b = step_losses(resumed.output.dir + "/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "step " << 4 + i;  // bit-for-bit
  // Final weights identical too.
  auto wa = model::load_safetensors(full.checkpoint.dir + "/step-6/model.safetensors");
  auto wb = model::load_safetensors(resumed.checkpoint.dir + "/step-6/model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, t] : wa) EXPECT_TRUE(t.equal(wb.at(name))) << name;
}

TEST(TrainingRun, CheckpointFollowsHuggingFaceLlama) {
  const std::string dir = testing::shared_dir("train-test", "hf");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig c = learnable_config(dir, 2, 1, 1);
  c.output.dir = dir + "/out";
  c.checkpoint.dir = dir + "/ckpt";
  c.checkpoint.save_initial = true;
  testing::train_on_ranks(c);
  if (testing::in_rank_child()) return;

  for (const char* sub : {"initial", "step-1"}) {
    const fs::path ckpt = fs::path(c.checkpoint.dir) / sub;
    auto tensors = model::load_safetensors((ckpt / "model.safetensors").string());
    std::set<std::string> names;
    for (const auto& [name, t] : tensors) names.insert(name);
    std::set<std::string> want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
    for (int layer = 0; layer < 2; ++layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                            "input_layernorm", "post_attention_layernorm"})
        want.insert(p + n + ".weight");
    }
    EXPECT_EQ(names, want) << sub;
    EXPECT_EQ(tensors.at("model.layers.0.self_attn.k_proj.weight").sizes(),
              (std::vector<int64_t>{2 * 8, 4 * 8}));  // [hkv*hd, h]
    std::ifstream in(ckpt / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    EXPECT_EQ(cfg["model_type"], "llama");
    EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(cfg["hidden_size"], 32);
    EXPECT_EQ(cfg["num_hidden_layers"], 2);
    EXPECT_EQ(cfg["num_attention_heads"], 4);
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["head_dim"], 8);
    EXPECT_EQ(cfg["vocab_size"], 61);
    EXPECT_EQ(cfg["tie_word_embeddings"], false);
  }
  // No temporary directory left behind.
  for (const auto& e : fs::directory_iterator(c.checkpoint.dir))
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
}

// A Qwen2 or Qwen3 run's checkpoints hold the family's tensors by transformers' names (biases on
// q/k/v; q_norm/k_norm of shape [hd]) and a config.json of its class; the initial biases are 0 and
// the norms 1, and one step of AdamW moves every one of them (they are trained, sharded over sp 2).
TEST(TrainingRun, FamilyCheckpointsFollowTransformers) {
  for (const std::string family : {"qwen2", "qwen3"}) {
    const std::string dir = testing::shared_dir("train-test", "hf-" + family);
    if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
    config::RunConfig c = learnable_config(dir, 1, 2, 1);
    testing::set_family(c.model, family);
    c.output.dir = dir + "/out";
    c.checkpoint.dir = dir + "/ckpt";
    c.checkpoint.save_initial = true;
    testing::train_on_ranks(c);
    if (testing::in_rank_child()) continue;

    const auto initial = model::load_safetensors(c.checkpoint.dir + "/initial/model.safetensors");
    const auto trained = model::load_safetensors(c.checkpoint.dir + "/step-1/model.safetensors");
    std::set<std::string> extras;  // the family's tensors beyond Llama's
    for (const auto& [name, t] : initial) {
      if (name.find("_proj.bias") != std::string::npos || name.find("_norm.") != std::string::npos) {
        extras.insert(name);
        const bool bias = name.ends_with(".bias");
        EXPECT_TRUE(at::equal(t, bias ? at::zeros_like(t) : at::ones_like(t))) << family << " " << name;
        EXPECT_FALSE(at::equal(trained.at(name), t)) << family << " " << name << " was not trained";
      }
    }
    std::set<std::string> want;
    for (int layer = 0; layer < 2; ++layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
      for (const char* n : family == "qwen2"
                               ? std::vector<const char*>{"q_proj.bias", "k_proj.bias", "v_proj.bias"}
                               : std::vector<const char*>{"q_norm.weight", "k_norm.weight"}) {
        want.insert(p + n);
      }
    }
    EXPECT_EQ(extras, want) << family;
    EXPECT_EQ(initial.size(), 9 * 2 + 3 + want.size()) << family;  // Llama's 21 tensors + extras
    if (family == "qwen2") {
      EXPECT_EQ(initial.at("model.layers.0.self_attn.k_proj.bias").sizes(),
                (std::vector<int64_t>{2 * 8}));  // [hkv*hd]
    } else {
      EXPECT_EQ(initial.at("model.layers.0.self_attn.q_norm.weight").sizes(),
                (std::vector<int64_t>{16}));  // [hd]
      EXPECT_EQ(initial.at("model.layers.0.self_attn.q_proj.weight").sizes(),
                (std::vector<int64_t>{4 * 16, 32}));  // [hq*hd, h], hq*hd != h
    }
    const auto cfg = nlohmann::json::parse(std::ifstream(c.checkpoint.dir + "/step-1/config.json"));
    EXPECT_EQ(cfg["model_type"], family);
    EXPECT_EQ(cfg["architectures"][0], family == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM");
    EXPECT_EQ(cfg["head_dim"], c.model.head_dim);
  }
}

TEST(TrainingRun, SavedCheckpointEvaluatesToTheSameLossWithAndWithoutSP) {
  const std::string dir = testing::shared_dir("train-test", "eval");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig c = learnable_config(dir, 1, 2, 3);
  c.output.dir = dir + "/train";
  c.checkpoint.dir = dir + "/ckpt";
  c.eval.source = c.data.source;
  c.eval.steps = 2;
  testing::train_on_ranks(c);

  // Evaluate the saved weights only, once with SP and once bypassing it.
  config::RunConfig with_sp = c;
  with_sp.train.steps = 0;
  with_sp.checkpoint = {};
  with_sp.model.load = dir + "/ckpt/step-3";
  with_sp.output.dir = dir + "/eval-sp";
  testing::train_on_ranks(with_sp);
  config::RunConfig without_sp = with_sp;
  without_sp.attention.disable_in_eval = true;
  without_sp.output.dir = dir + "/eval-nosp";
  testing::train_on_ranks(without_sp);
  if (testing::in_rank_child()) return;

  const auto trained = eval_losses(c.output.dir + "/metrics.jsonl");
  const auto loaded = eval_losses(with_sp.output.dir + "/metrics.jsonl");
  const auto bypass = eval_losses(without_sp.output.dir + "/metrics.jsonl");
  ASSERT_EQ(trained.size(), 1u);
  ASSERT_EQ(loaded.size(), 1u);
  ASSERT_EQ(bypass.size(), 1u);
  EXPECT_EQ(loaded[0], trained[0]);  // same weights, same ranks, same math: identical
  EXPECT_NEAR(bypass[0], trained[0], 1e-5 * trained[0]);
}

TEST(TrainingRun, ResumeOnAnotherMeshContinuesTheDataAndAppendsToMetrics) {
  const std::string dir = testing::shared_dir("train-test", "resume-mesh");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig full = learnable_config(dir, 1, 2, 4);  // dp 1 x sp 2, G = 2
  full.output.dir = dir + "/out";
  full.checkpoint.dir = dir + "/ckpt";
  full.checkpoint.every = 2;
  testing::train_on_ranks(full);
  std::vector<double> full_losses;
  if (!testing::in_rank_child()) full_losses = step_losses(full.output.dir + "/metrics.jsonl");

  config::RunConfig resumed = full;  // same output.dir; dp 2 x sp 1, G = 4
  resumed.mesh.dp = 2;
  resumed.mesh.sp = 1;
  resumed.sequence.micro_batch = 2;
  resumed.checkpoint.resume = "step-2";  // looked up in checkpoint.dir
  testing::train_on_ranks(resumed);
  if (testing::in_rank_child()) return;

  const auto lines = read_lines(full.output.dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u) << "steps before the resume kept, steps after it trained again";
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["step"], int64_t(i + 1));
  EXPECT_EQ(lines[0]["loss"].get<double>(), full_losses[0]);
  EXPECT_EQ(lines[1]["loss"].get<double>(), full_losses[1]);
  // Steps 1-2 consumed samples [0, 4); the resumed steps take 4 samples each from there.
  EXPECT_EQ(lines[1]["first_sample"], 2);
  EXPECT_EQ(lines[2]["first_sample"], 4);
  EXPECT_EQ(lines[3]["first_sample"], 8);
  const auto summary = nlohmann::json::parse(read_text(full.output.dir + "/summary.json"));
  EXPECT_EQ(summary["steps"], 4);
  EXPECT_EQ(summary["first_loss"].get<double>(), full_losses[0]);
  EXPECT_EQ(summary["final_loss"].get<double>(), lines[3]["loss"].get<double>());
  EXPECT_EQ(summary["resolved"]["global_batch"], 4);
}

TEST(TrainingRun, ResumeRefusesACheckpointWithoutOptimizerState) {
  const std::string dir = testing::shared_dir("train-test", "resume-no-optim");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig first = learnable_config(dir, 1, 1, 2);
  first.output.dir = dir + "/out";
  first.checkpoint.dir = dir + "/ckpt";
  testing::train_on_ranks(first);
  if (!testing::in_rank_child()) {  // a weights-only checkpoint past step 0
    fs::remove(dir + "/ckpt/step-2/optimizer.safetensors");
    auto state = nlohmann::json::parse(read_text(dir + "/ckpt/step-2/trainer_state.json"));
    state.erase("optimizer_files");
    std::ofstream(dir + "/ckpt/step-2/trainer_state.json") << state.dump();
  }
  config::RunConfig resumed = first;
  resumed.train.steps = 4;
  resumed.checkpoint.resume = "latest";
  testing::run_ranks(1, [&](const testing::RankContext& ctx) {
    const std::string error = training_error(resumed, ctx);
    EXPECT_NE(error.find("optimizer.safetensors: missing"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  });
}

TEST(TrainingRun, ResumingAFinishedRunKeepsItsOutputs) {
  const std::string dir = testing::shared_dir("train-test", "resume-finished");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig c = learnable_config(dir, 1, 1, 2);
  c.output.dir = dir + "/out";
  c.checkpoint.dir = dir + "/ckpt";
  testing::train_on_ranks(c);
  std::string summary, metrics;
  if (!testing::in_rank_child()) {
    summary = read_text(c.output.dir + "/summary.json");
    metrics = read_text(c.output.dir + "/metrics.jsonl");
  }
  config::RunConfig again = c;
  again.checkpoint.resume = "latest";
  testing::train_on_ranks(again);
  if (testing::in_rank_child()) return;
  EXPECT_EQ(read_text(c.output.dir + "/summary.json"), summary);
  EXPECT_EQ(read_text(c.output.dir + "/metrics.jsonl"), metrics);
  EXPECT_NE(nlohmann::json::parse(summary)["final_loss"].get<double>(), 0.0);
}

TEST(TrainingRun, NonFiniteGradientsSkipTheUpdateAndStopTheRun) {
  const std::string dir = testing::shared_dir("train-test", "nonfinite");
  if (!testing::in_rank_child()) write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
  config::RunConfig c = learnable_config(dir, 1, 2, 1);
  c.output.dir = dir + "/first";
  c.checkpoint.dir = dir + "/ckpt";
  testing::train_on_ranks(c);
  if (!testing::in_rank_child()) {  // weights with a NaN in every token's embedding
    const std::string file = dir + "/ckpt/step-1/model.safetensors";
    auto tensors = model::load_safetensors(file);
    tensors.at("model.embed_tokens.weight").select(1, 0).fill_(NAN);
    model::save_safetensors(file, {tensors.begin(), tensors.end()}, {});
  }
  config::RunConfig bad = c;
  bad.model.load = dir + "/ckpt/step-1";
  bad.train.steps = 10;
  bad.optim.max_consecutive_skips = 3;
  bad.output.dir = dir + "/bad";
  bad.checkpoint.dir = dir + "/ckpt-bad";
  bad.checkpoint.every = 1;
  testing::run_ranks(2, [&](const testing::RankContext& ctx) {
    const std::string error = training_error(bad, ctx);
    EXPECT_NE(error.find("diverged"), std::string::npos) << error;
    EXPECT_NE(error.find("optim.max_consecutive_skips"), std::string::npos) << error;
  });
  if (testing::in_rank_child()) return;
  const auto lines = read_lines(bad.output.dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& line : lines) EXPECT_EQ(line.value("skipped", false), true) << line.dump();
  // The skipped updates left the weights as loaded.
  auto loaded = model::load_safetensors(dir + "/ckpt/step-1/model.safetensors");
  auto after = model::load_safetensors(bad.checkpoint.dir + "/step-2/model.safetensors");
  EXPECT_TRUE(after.at("model.norm.weight").equal(loaded.at("model.norm.weight")));
  EXPECT_TRUE(after.at("lm_head.weight").equal(loaded.at("lm_head.weight")));
}

TEST(TrainingRun, EveryRankWritesItsShareAndStaleTemporariesGo) {
  const std::string dir = testing::shared_dir("train-test", "shares");
  if (!testing::in_rank_child()) {
    write_learnable_tokens(dir + "/tokens.bin", 20000, 61);
    fs::create_directories(dir + "/ckpt/.step-9.tmp");  // left by a killed save
    std::ofstream(dir + "/ckpt/.step-9.tmp/model.safetensors") << "half";
    fs::create_directories(dir + "/ckpt/.step-4.tmp-4242");  // the older per-pid name
  }
  config::RunConfig c = learnable_config(dir, 1, 2, 2);
  c.output.dir = dir + "/out";
  c.checkpoint.dir = dir + "/ckpt";
  testing::train_on_ranks(c);
  if (testing::in_rank_child()) return;

  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(c.checkpoint.dir)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"step-2"});
  std::set<std::string> params;
  size_t entries = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const auto shard = model::load_safetensors(c.checkpoint.dir + "/step-2/optimizer-" +
                                               std::to_string(rank) + "-of-2.safetensors");
    EXPECT_FALSE(shard.empty()) << "rank " << rank << " wrote no optimizer state";
    entries += shard.size();
    for (const auto& [name, t] : shard) params.insert(name.substr(0, name.rfind('.')));
  }
  const auto weights = model::load_safetensors(c.checkpoint.dir + "/step-2/model.safetensors");
  EXPECT_EQ(params.size(), weights.size());
  EXPECT_EQ(entries, 3 * weights.size());  // exp_avg, exp_avg_sq, step per parameter
}

}  // namespace
}  // namespace ulysses
