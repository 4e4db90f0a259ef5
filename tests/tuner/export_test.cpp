// Tests of tuner/export: the DeepSpeed JSON, ArcticTraining recipe and Accelerate config of a run
// config, over meshes 1x1, dp2xsp2, dp1xsp4, dp4xsp1, dp2xsp4 and offload none / activations /
// optimizer / both in fp32 and bf16 (micro_batch 2, grad_accum 4) at ZeRO stage 0, and stages
// 1-3 on dp2xsp2: every field, the ZeRO stage as run, fp32 gradient accumulation for bf16, the
// batch arithmetic, the machines of a multi-node run, exactly the warnings that apply and the
// model family where an export names the model; then every written file is loaded by its real
// consumer (tests/clients/check_exports.py: DeepSpeedConfig, ArcticTraining's TrainerConfig and
// its tiled-MLP class lookup for Qwen2, Qwen3 and Mistral runs, Accelerate's launcher +
// ParallelismConfig), in one Python process ($ULYSSES_PYTHON).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "config/hf_config.h"
#include "config/run_config.h"
#include "tuner/backends/deepspeed/deepspeed_trial.h"
#include "tuner/export/accelerate_config.h"
#include "tuner/export/arctic_recipe.h"
#include "tuner/export/deepspeed_config.h"
#include "tuner/export/export_common.h"
#include "tuner/export/export_files.h"
#include "common/remove_tree.h"

namespace ulysses::exports {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kMicroBatch = 2;
constexpr int64_t kGradAccum = 4;
constexpr int64_t kSeqLength = 4096;
constexpr int64_t kSteps = 10;

// ---------------------------------------------------------------------------------------------
// Helpers

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::path(::testing::TempDir()) / "export-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = fs::canonical(pattern);  // the checker prints resolved paths
  }
  ~TempDir() {
    if (keep_) return;
    std::error_code ec;
    ulysses::remove_tree(path_);
  }
  const fs::path& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  fs::path path_;
  bool keep_ = false;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The part of each warning before its first ": " (the run config keys it names).
std::vector<std::string> warning_keys(const std::vector<std::string>& warnings) {
  std::vector<std::string> keys;
  for (const std::string& warning : warnings) {
    EXPECT_EQ(warning.find('\n'), std::string::npos) << "not one line: " << warning;
    keys.push_back(warning.substr(0, warning.find(": ")));
  }
  return keys;
}

enum class Offload { kNone, kActivations, kOptimizer, kBoth };

const char* offload_name(Offload offload) {
  switch (offload) {
    case Offload::kNone: return "none";
    case Offload::kActivations: return "activations";
    case Offload::kOptimizer: return "optimizer";
    case Offload::kBoth: return "both";
  }
  return "?";
}

// One run config of the matrix, with what every consumer must compute from it.
struct Case {
  int64_t dp = 1;
  int64_t sp = 1;
  Offload offload = Offload::kNone;
  bool bf16 = false;
  bool bf16_states = false;  // with bf16: memory.precision bf16-states (zero.stage 0, no offload)
  int64_t zero_stage = 0;
  std::string tiled_mlp = "1";   // "1", "4" or "auto"
  std::string tiled_loss = "1";
  std::string model_load;        // "" = ArcticTraining model placeholder
  std::string family;            // model.family inline ("" = llama); with model_load, the dir's
  std::string schedule = "constant";
  int64_t warmup_steps = 0;
  double min_lr = 0.0;

  int64_t world() const { return dp * sp; }
  bool offload_activations() const {
    return offload == Offload::kActivations || offload == Offload::kBoth;
  }
  bool offload_optimizer() const {
    return offload == Offload::kOptimizer || offload == Offload::kBoth;
  }
  // DeepSpeed offloads the optimizer only inside ZeRO (stage >= 1).
  bool deepspeed_offloads() const { return offload_optimizer() && zero_stage >= 1; }
  std::string name() const {
    return "dp" + std::to_string(dp) + "_sp" + std::to_string(sp) + "_" + offload_name(offload) +
           (bf16_states ? "_bf16states" : bf16 ? "_bf16" : "_fp32") + (zero_stage ? "_zero" + std::to_string(zero_stage) : "") +
           (schedule == "constant" && warmup_steps == 0
                                              ? ""
                                              : "_" + schedule + std::to_string(warmup_steps)) +
           (family.empty() ? "" : "_" + family);
  }
  std::string family_name() const { return family.empty() ? "llama" : family; }
  std::string yaml() const {
    std::string text;
    if (!model_load.empty()) {
      text += "model: {load: " + model_load + "}\n";
    } else if (!family.empty()) {
      text += "model: {family: " + family + "}\n";
    }
    text += "mesh: {dp: " + std::to_string(dp) + ", sp: " + std::to_string(sp) + "}\n";
    text += "sequence: {length: " + std::to_string(kSeqLength) +
            ", micro_batch: " + std::to_string(kMicroBatch) +
            ", grad_accum: " + std::to_string(kGradAccum) + "}\n";
    text += "memory: {tiled_mlp: " + tiled_mlp + ", tiled_loss: " + tiled_loss +
            ", offload_activations: " + (offload_activations() ? "true" : "false") +
            ", offload_optimizer: " + (offload_optimizer() ? "true" : "false") +
            ", precision: " + (bf16_states ? "bf16-states" : bf16 ? "bf16" : "fp32") + "}\n";
    text += std::string("train: {steps: ") + std::to_string(kSteps) +
            ", device: " + (bf16 ? "cuda" : "cpu") + "}\n";
    text += "optim: {schedule: " + schedule + ", warmup_steps: " + std::to_string(warmup_steps) +
            ", min_lr: " + std::to_string(min_lr) + "}\n";
    text += "zero: {stage: " + std::to_string(zero_stage) + "}\n";
    return text;
  }
  config::RunConfig run() const { return config::parse_run_config_yaml(yaml()); }

  // What check_exports.py asserts the consumers compute (tests/clients/check_exports.py).
  json expect() const {
    return {{"world", world()},
            {"dp", dp},
            {"sp", sp},
            {"micro_batch", kMicroBatch},
            {"grad_accum", kGradAccum},
            {"train_batch_size", kMicroBatch * kGradAccum * dp},
            {"zero_stage", zero_stage},
            {"offload_optimizer", deepspeed_offloads()},
            {"bf16", bf16},
            {"grad_clip", 1.0},
            {"lr", 1.0e-3},
            {"betas", {0.9, 0.95}},
            {"eps", 1.0e-8},
            {"weight_decay", 0.0},
            {"tiled_mlp", tiled_mlp != "1"},
            {"offload_activations", offload_activations()},
            {"checkpointing", offload_activations()},
            {"seq_length", kSeqLength},
            {"train_steps", kSteps},
            {"warmup_steps", warmup_steps},
            {"schedule", schedule},
            {"min_lr", min_lr},
            {"model_load", model_load},
            {"family", family_name()}};
  }
};

// The switches DeepSpeed JSON and Accelerate cannot express, as the warning names them.
std::string alst_key(const Case& c) {
  std::vector<std::string> names;
  if (c.tiled_mlp != "1") names.push_back("memory.tiled_mlp=" + c.tiled_mlp);
  if (c.tiled_loss != "1") names.push_back("memory.tiled_loss=" + c.tiled_loss);
  if (c.offload_activations()) names.push_back("memory.offload_activations=true");
  std::string key;
  for (const std::string& name : names) key += (key.empty() ? "" : ", ") + name;
  return key;
}

bool torch_warning_applies(const Case& c) { return c.sp > 1 && c.sp < c.world(); }

// What DeepSpeed cannot do at stage 0: offload the optimizer, accumulate bf16 gradients in fp32.
std::vector<std::string> zero_keys(const Case& c) {
  std::vector<std::string> keys;
  if (c.zero_stage != 0) return keys;
  if (c.offload_optimizer()) keys.push_back("memory.offload_optimizer=true, zero.stage=0");
  if (c.bf16 && !c.bf16_states) keys.push_back("memory.precision=bf16, zero.stage=0");
  return keys;
}

std::vector<std::string> expected_deepspeed_keys(const Case& c) {
  std::vector<std::string> keys;
  if (torch_warning_applies(c)) keys.push_back("mesh");
  if (!alst_key(c).empty()) keys.push_back(alst_key(c));
  for (const std::string& key : zero_keys(c)) keys.push_back(key);
  if (c.bf16_states) keys.push_back("memory.precision=bf16-states");
  return keys;
}

std::vector<std::string> expected_arctic_keys(const Case& c) {
  std::vector<std::string> keys;
  if (torch_warning_applies(c)) keys.push_back("mesh");
  for (const std::string& key : zero_keys(c)) keys.push_back(key);
  if (c.model_load.empty()) keys.push_back("model.load");
  keys.push_back("data.source");
  if (c.tiled_mlp != "1" && c.tiled_mlp != "auto") {
    keys.push_back("memory.tiled_mlp=" + c.tiled_mlp);
  }
  if (c.tiled_loss != "1" && (c.sp == 1 || c.tiled_loss != "auto")) {
    keys.push_back("memory.tiled_loss=" + c.tiled_loss);
  }
  return keys;
}

// zero.bucket_mb's default (128 MiB) in DeepSpeed's elements: fp32 gradient reductions, weight
// gathers in the weights' dtype; none at stage 0.
json expected_buckets(int64_t stage, bool bf16) {
  const int64_t bytes = 128 * 1024 * 1024;
  if (stage == 0) return json::object();
  json buckets = {{"reduce_bucket_size", bytes / 4}};
  buckets[stage == 3 ? "stage3_prefetch_bucket_size" : "allgather_bucket_size"] =
      bytes / (bf16 ? 2 : 4);
  return buckets;
}

json expected_deepspeed_config(const Case& c) {
  json zero = {{"stage", c.zero_stage}};
  if (c.deepspeed_offloads()) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  zero.update(expected_buckets(c.zero_stage, c.bf16));
  json config = {{"train_micro_batch_size_per_gpu", kMicroBatch},
          {"gradient_accumulation_steps", kGradAccum},
          {"train_batch_size", kMicroBatch * kGradAccum * c.dp},
          {"sequence_parallel_size", c.sp},
          {"data_parallel_size", c.dp},
          {"zero_optimization", zero},
          {"bf16", {{"enabled", c.bf16}}},
          {"seq_parallel_communication_data_type", c.bf16 ? "bf16" : "fp32"},
          {"gradient_clipping", 1.0},
          {"optimizer",
           {{"type", "AdamW"},
            {"params",
             {{"lr", 1.0e-3}, {"betas", {0.9, 0.95}}, {"eps", 1.0e-8}, {"weight_decay", 0.0}}}}}};
  if (c.bf16) {  // ulysses-train accumulates and reduces gradients in fp32
    if (c.zero_stage >= 1) config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    config["communication_data_type"] = "fp32";
  }
  return config;
}

// Writes the HF config.json of the default ModelOptions in `family` into dir; returns dir.
std::string write_model_dir(const fs::path& dir, const std::string& family = "llama") {
  fs::create_directories(dir);
  config::ModelOptions model;
  model.family = family;
  std::ofstream(dir / "config.json") << config::to_hf_config_json(model).dump(2);
  return dir.string();
}

// Meshes dp x sp, each with its own tile switches so that the ALST warning varies with them.
struct MeshSpec {
  int64_t dp, sp;
  const char* tiled_mlp;
  const char* tiled_loss;
};
constexpr MeshSpec kMeshes[] = {
    {1, 1, "1", "1"}, {2, 2, "auto", "1"}, {1, 4, "1", "4"}, {4, 1, "4", "1"}, {2, 4, "1", "auto"}};
constexpr Offload kOffloads[] = {Offload::kNone, Offload::kActivations, Offload::kOptimizer,
                                 Offload::kBoth};

// Every mesh x offload x precision at ZeRO stage 0, and stages 1-3 x offload none / optimizer x
// precision on dp2xsp2; bf16 cases load the model from `model_dir`, fp32 cases leave the
// ArcticTraining model placeholder.
std::vector<Case> matrix(const std::string& model_dir) {
  std::vector<Case> cases;
  for (const MeshSpec& mesh : kMeshes) {
    for (Offload offload : kOffloads) {
      for (bool bf16 : {false, true}) {
        Case c;
        c.dp = mesh.dp;
        c.sp = mesh.sp;
        c.tiled_mlp = mesh.tiled_mlp;
        c.tiled_loss = mesh.tiled_loss;
        c.offload = offload;
        c.bf16 = bf16;
        if (bf16) c.model_load = model_dir;
        cases.push_back(c);
      }
    }
  }
  for (int64_t stage : {1, 2, 3}) {
    for (Offload offload : {Offload::kNone, Offload::kOptimizer}) {
      for (bool bf16 : {false, true}) {
        Case c;
        c.dp = 2;
        c.sp = 2;
        c.zero_stage = stage;
        c.offload = offload;
        c.bf16 = bf16;
        if (bf16) c.model_load = model_dir;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// ---------------------------------------------------------------------------------------------
// Fields, batch arithmetic and warnings of every case (no Python)

// The PyTorch-version warning is settled against the version found where the export runs:
// dropped for 2.3 and newer, kept with the version named for older ones, kept as is when unknown.
TEST(Export, TorchVersionWarningFollowsTheInstalledPyTorch) {
  TempDir dir;
  std::optional<config::RunConfig> run;
  for (const Case& c : matrix(write_model_dir(dir.path() / "model"))) {
    if (ulysses_torch_version_warning(c.run())) {
      run = c.run();
      break;
    }
  }
  ASSERT_TRUE(run.has_value()) << "no case with 1 < sp < world";
  const std::string warning = *ulysses_torch_version_warning(*run);
  const std::vector<std::string> warnings = {"other: first", warning, "other: last"};
  for (const char* version : {"2.3.0", "2.13.0+cpu", "2.11.0+cu128", "3.0.0a0"}) {
    EXPECT_EQ(settle_torch_version_warning(warnings, *run, std::string(version)),
              (std::vector<std::string>{"other: first", "other: last"}))
        << version;
  }
  EXPECT_EQ(settle_torch_version_warning(warnings, *run, std::string("2.1.2+cu121"))[1],
            warning + " (found PyTorch 2.1.2+cu121)");
  EXPECT_EQ(settle_torch_version_warning(warnings, *run, std::nullopt), warnings);
  EXPECT_EQ(settle_torch_version_warning(warnings, *run, std::string("unknown")), warnings);
}

TEST(Export, DeepSpeedConfigOfEveryCase) {
  TempDir dir;
  for (const Case& c : matrix(write_model_dir(dir.path() / "model"))) {
    SCOPED_TRACE(c.name());
    const DeepSpeedExport exported = deepspeed_config(c.run());
    EXPECT_EQ(exported.config, expected_deepspeed_config(c)) << exported.config.dump(2);
    EXPECT_EQ(exported.config["train_batch_size"].get<int64_t>(),
              exported.config["train_micro_batch_size_per_gpu"].get<int64_t>() *
                  exported.config["gradient_accumulation_steps"].get<int64_t>() * c.world() /
                  c.sp);
    EXPECT_EQ(warning_keys(exported.warnings), expected_deepspeed_keys(c));
    for (const std::string& warning : exported.warnings) {
      if (warning.rfind("mesh: ", 0) == 0) {
        EXPECT_NE(warning.find("PyTorch >= 2.3"), std::string::npos) << warning;
        EXPECT_NE(warning.find("weighted all-reduce"), std::string::npos) << warning;
      } else if (warning.find(", zero.stage=0: ") != std::string::npos) {
        EXPECT_NE(warning.find("zero_optimization.stage 1"), std::string::npos) << warning;
      } else {
        EXPECT_NE(warning.find("arctic_training.yaml"), std::string::npos) << warning;
      }
    }
  }
}

TEST(Export, ArcticRecipeOfEveryCase) {
  TempDir dir;
  for (const Case& c : matrix(write_model_dir(dir.path() / "model"))) {
    SCOPED_TRACE(c.name());
    const ArcticRecipeExport exported = arctic_recipe(c.run());
    const YAML::Node recipe = YAML::Load(exported.yaml);
    EXPECT_EQ(recipe["type"].as<std::string>(), "causal");
    EXPECT_EQ(recipe["micro_batch_size"].as<int64_t>(), kMicroBatch);
    EXPECT_EQ(recipe["gradient_accumulation_steps"].as<int64_t>(), kGradAccum);
    EXPECT_EQ(recipe["sequence_parallel_size"].as<int64_t>(), c.sp);
    EXPECT_EQ(recipe["tiled_mlp_compute"].as<bool>(), c.tiled_mlp != "1");
    EXPECT_EQ(recipe["activation_checkpoint_cpu_offload"].as<bool>(), c.offload_activations());
    EXPECT_EQ(recipe["train_iters"].as<int64_t>(), kSteps);
    const YAML::Node model = recipe["model"];
    EXPECT_EQ(model["name_or_path"].as<std::string>(),
              c.model_load.empty() ? kArcticModelPlaceholder : c.model_load);
    EXPECT_EQ(model["dtype"].as<std::string>(), c.bf16 ? "bf16" : "fp32");
    EXPECT_EQ(model["attn_implementation"].as<std::string>(), "sdpa");
    EXPECT_EQ(model["disable_activation_checkpoint"].as<bool>(), !c.offload_activations());
    EXPECT_EQ(recipe["data"]["max_length"].as<int64_t>(), kSeqLength);
    EXPECT_EQ(recipe["data"]["sources"][0].as<std::string>(), kArcticDataPlaceholder);
    EXPECT_EQ(recipe["optimizer"]["type"].as<std::string>(),
              c.deepspeed_offloads() ? "cpu_adam" : "fused_adam");
    EXPECT_EQ(recipe["optimizer"]["learning_rate"].as<double>(), 1.0e-3);
    EXPECT_EQ(recipe["optimizer"]["betas"][1].as<double>(), 0.95);
    EXPECT_EQ(recipe["scheduler"]["name"].as<std::string>(), "constant");
    const YAML::Node zero = recipe["deepspeed"]["zero_optimization"];
    EXPECT_EQ(zero["stage"].as<int>(), c.zero_stage);
    EXPECT_EQ(static_cast<bool>(zero["offload_optimizer"]), c.deepspeed_offloads());
    EXPECT_EQ(static_cast<bool>(recipe["deepspeed"]["data_types"]), c.bf16 && c.zero_stage >= 1);
    EXPECT_EQ(static_cast<bool>(recipe["deepspeed"]["communication_data_type"]), c.bf16);
    EXPECT_EQ(recipe["deepspeed"]["gradient_clipping"].as<double>(), 1.0);
    EXPECT_FALSE(recipe["deepspeed"]["train_batch_size"]) << "ArcticTraining computes it";
    EXPECT_EQ(warning_keys(exported.warnings), expected_arctic_keys(c));
  }
}

TEST(Export, AccelerateConfigOfEveryCase) {
  TempDir dir;
  for (const Case& c : matrix(write_model_dir(dir.path() / "model"))) {
    SCOPED_TRACE(c.name());
    const AccelerateExport exported = accelerate_config(c.run(), "ds_config.json");
    const YAML::Node file = YAML::Load(exported.yaml);
    std::vector<std::string> keys;
    for (const auto& item : file) keys.push_back(item.first.as<std::string>());
    EXPECT_EQ(keys, (std::vector<std::string>{"compute_environment", "debug", "distributed_type",
                                              "deepspeed_config", "machine_rank", "num_machines",
                                              "num_processes", "use_cpu", "parallelism_config"}));
    EXPECT_EQ(file["compute_environment"].as<std::string>(), "LOCAL_MACHINE");
    EXPECT_EQ(file["distributed_type"].as<std::string>(), "DEEPSPEED");
    EXPECT_EQ(file["deepspeed_config"].size(), 1u);
    EXPECT_EQ(file["deepspeed_config"]["deepspeed_config_file"].as<std::string>(),
              "ds_config.json");
    EXPECT_EQ(file["num_processes"].as<int64_t>(), c.world());
    const YAML::Node parallelism = file["parallelism_config"];
    EXPECT_EQ(parallelism["parallelism_config_dp_replicate_size"].as<int64_t>(), 1);
    EXPECT_EQ(parallelism["parallelism_config_dp_shard_size"].as<int64_t>(), c.dp);
    EXPECT_EQ(parallelism["parallelism_config_sp_size"].as<int64_t>(), c.sp);
    EXPECT_EQ(parallelism["parallelism_config_sp_backend"].as<std::string>(), "deepspeed");
    EXPECT_TRUE(parallelism["parallelism_config_sp_seq_length_is_variable"].as<bool>());
    EXPECT_EQ(parallelism["parallelism_config_sp_attn_implementation"].as<std::string>(), "sdpa");
    EXPECT_EQ(warning_keys(exported.warnings), expected_deepspeed_keys(c));
  }
}

// ---------------------------------------------------------------------------------------------
// Schedules, single switches, file writing

TEST(Export, DeepSpeedSchedulers) {
  Case c;
  config::RunConfig run = c.run();
  EXPECT_FALSE(deepspeed_config(run).config.contains("scheduler")) << "constant, no warmup";

  run.optim.warmup_steps = 5;
  DeepSpeedExport exported = deepspeed_config(run);
  EXPECT_EQ(exported.config["scheduler"],
            json::parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
              "warmup_max_lr": 0.001, "warmup_num_steps": 5, "warmup_type": "linear"}})"));
  EXPECT_TRUE(exported.warnings.empty());

  run.optim.schedule = "linear";
  run.optim.warmup_steps = 2;
  run.optim.min_lr = 1.0e-5;
  exported = deepspeed_config(run);
  EXPECT_EQ(exported.config["scheduler"],
            json::parse(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
              "warmup_min_lr": 1e-05, "warmup_max_lr": 0.001, "warmup_num_steps": 2,
              "warmup_type": "linear"}})"));
  EXPECT_EQ(warning_keys(exported.warnings), std::vector<std::string>{"optim.min_lr"});

  run.optim.schedule = "cosine";
  run.optim.warmup_steps = 0;
  run.optim.min_lr = 1.0e-4;
  exported = deepspeed_config(run);
  EXPECT_EQ(exported.config["scheduler"]["type"], "WarmupCosineLR");
  EXPECT_DOUBLE_EQ(exported.config["scheduler"]["params"]["cos_min_ratio"].get<double>(), 0.1);
  EXPECT_EQ(exported.config["scheduler"]["params"]["warmup_num_steps"], 1);
  EXPECT_EQ(warning_keys(exported.warnings), std::vector<std::string>{"optim.warmup_steps"});
}

// Every export of `run` throws one line starting with `refusal`; the files a recommendation
// writes (write_exports) are none of the three, with one warning starting with `warning`.
void expect_every_export_refused(const config::RunConfig& run, const std::string& refusal,
                                 const std::string& warning, const std::string& dir_name) {
  const std::vector<std::function<void()>> exports = {
      [&] { deepspeed_config(run); }, [&] { arctic_recipe(run); },
      [&] { accelerate_config(run, "ds_config.json", 1); }};
  for (const auto& run_export : exports) {
    try {
      run_export();
      ADD_FAILURE() << "exported: " << refusal;
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(refusal, 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  const std::string dir = (std::filesystem::temp_directory_path() /
                           (dir_name + "-" + std::to_string(getpid())))
                              .string();
  const ExportFiles files = write_exports(run, dir, 1);
  EXPECT_TRUE(files.deepspeed_path.empty() && files.arctic_path.empty() &&
              files.accelerate_path.empty());
  ASSERT_EQ(files.warnings.size(), 1u);
  EXPECT_EQ(files.warnings[0].rfind(warning, 0), 0u) << files.warnings[0];
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

// A run whose sp splits the heads unevenly (mesh.uneven_heads) cannot run under DeepSpeed's
// Ulysses: every export refuses it with one line naming the key, as it refuses a ring, and the
// files a recommendation writes are none of the three; an even split at the same key exports.
TEST(Export, UnevenHeadsAreRefusedWithOneLine) {
  config::RunConfig run = Case().run();
  run.model.num_heads = 8, run.model.num_kv_heads = 2;
  run.mesh.sp = 3;
  run.mesh.uneven_heads = true;
  expect_every_export_refused(run,
                              "mesh.uneven_heads: sp 3 splits 8 query heads / 2 KV heads "
                              "unevenly, which runs only in ulysses-train; ",
                              "mesh.uneven_heads: sp 3 ", "ulysses-uneven-exports");
  run.mesh.sp = 2;
  EXPECT_EQ(unsupported_mesh(run, "DeepSpeed"), std::nullopt);
  EXPECT_NO_THROW(deepspeed_config(run));
}

// Ring attention (mesh.sp_ring) is a model split DeepSpeed's Ulysses cannot run: every export
// refuses it with one line naming the key; sp_ring 1 exports as before.
TEST(Export, RingAttentionIsRefusedWithOneLine) {
  config::RunConfig run = Case().run();
  run.model.num_heads = 4, run.model.num_kv_heads = 2;
  run.mesh.sp = 8;
  run.mesh.dp = 1;
  run.mesh.sp_ring.value = 4;
  expect_every_export_refused(run,
                              "mesh.sp_ring: 4 (ring attention over sp 8 = 2 all-to-all x 4 ring) "
                              "runs only in ulysses-train; ",
                              "mesh.sp_ring: 4 ", "ulysses-ring-exports");
  run.mesh.sp = 4, run.mesh.sp_ring.value = 1;
  EXPECT_NO_THROW(deepspeed_config(run));
}

TEST(Export, ArcticWarmupRatioGivesExactlyTheWarmupSteps) {
  Case c;
  config::RunConfig run = c.run();
  run.optim.schedule = "cosine";
  for (int64_t steps : {10, 22, 43, 1000}) {
    run.train.steps = steps;
    for (int64_t warmup = 0; warmup <= steps + 1; ++warmup) {
      run.optim.warmup_steps = warmup;
      const YAML::Node recipe = YAML::Load(arctic_recipe(run).yaml);
      const double ratio = recipe["scheduler"]["warmup_ratio"].as<double>();
      ASSERT_LE(ratio, 1.0);
      // ArcticTraining's HFSchedulerFactory: int(warmup_ratio * training_horizon).
      EXPECT_EQ(static_cast<int64_t>(ratio * static_cast<double>(steps)), std::min(warmup, steps))
          << "steps " << steps << " warmup " << warmup << " ratio " << ratio;
    }
  }
  run.train.steps = 10;
  run.optim.warmup_steps = 3;
  run.optim.min_lr = 1.0e-5;
  YAML::Node recipe = YAML::Load(arctic_recipe(run).yaml);
  EXPECT_EQ(recipe["scheduler"]["name"].as<std::string>(), "cosine_with_min_lr");
  EXPECT_EQ(recipe["scheduler"]["scheduler_specific_kwargs"]["min_lr"].as<double>(), 1.0e-5);
  run.optim.schedule = "constant";
  EXPECT_EQ(YAML::Load(arctic_recipe(run).yaml)["scheduler"]["name"].as<std::string>(),
            "constant_with_warmup");
  run.optim.schedule = "linear";
  const ArcticRecipeExport linear = arctic_recipe(run);
  EXPECT_EQ(YAML::Load(linear.yaml)["scheduler"]["name"].as<std::string>(), "linear");
  EXPECT_EQ(warning_keys(linear.warnings),
            (std::vector<std::string>{"model.load", "data.source", "optim.min_lr"}));
}

TEST(Export, ArcticWarnsAboutWhatItCannotExpress) {
  Case c;
  c.tiled_loss = "auto";  // sp == 1: ArcticTraining does not tile the loss
  config::RunConfig run = c.run();
  run.optim.eps = 1.0e-6;
  run.optim.weight_decay = 0.1;
  run.optim.warmup_steps = 20;  // > train.steps
  run.memory.checkpointing = true;
  const ArcticRecipeExport exported = arctic_recipe(run);
  EXPECT_EQ(warning_keys(exported.warnings),
            (std::vector<std::string>{"model.load", "data.source", "memory.tiled_loss=auto",
                                      "optim.eps", "optim.weight_decay", "optim.warmup_steps"}));
  const YAML::Node recipe = YAML::Load(exported.yaml);
  EXPECT_FALSE(recipe["model"]["disable_activation_checkpoint"].as<bool>());
  EXPECT_FALSE(recipe["activation_checkpoint_cpu_offload"].as<bool>());
  EXPECT_EQ(recipe["optimizer"]["weight_decay"].as<double>(), 0.1);

  // Checkpointing alone is an ALST switch for DeepSpeed JSON and Accelerate too.
  EXPECT_EQ(warning_keys(deepspeed_config(run).warnings),
            (std::vector<std::string>{"memory.tiled_loss=auto, memory.checkpointing=true"}));
  EXPECT_EQ(warning_keys(accelerate_config(run).warnings),
            (std::vector<std::string>{"memory.tiled_loss=auto, memory.checkpointing=true"}));
}

// zero.bucket_mb is the bytes of one collective in ulysses-train; DeepSpeed's bucket keys count
// elements: gradients are reduced in fp32, weights gathered in their dtype.
TEST(Export, ZeroBucketsAreTheTrialsInDeepSpeedsElements) {
  Case c;
  c.zero_stage = 2;
  config::RunConfig run = c.run();
  run.zero.bucket_mb = 25;
  json zero = deepspeed_config(run).config["zero_optimization"];
  EXPECT_EQ(zero["reduce_bucket_size"], 25 * 1024 * 1024 / 4);
  EXPECT_EQ(zero["allgather_bucket_size"], 25 * 1024 * 1024 / 4);
  run.zero.stage = 3;
  zero = deepspeed_config(run).config["zero_optimization"];
  EXPECT_EQ(zero["stage3_prefetch_bucket_size"], 25 * 1024 * 1024 / 4);
  EXPECT_FALSE(zero.contains("allgather_bucket_size"));
  run.zero.stage = 0;
  EXPECT_EQ(deepspeed_config(run).config["zero_optimization"], json({{"stage", 0}}));
}

// The export keeps the ZeRO stage the trial ran and, for bf16, its fp32 gradient accumulation
// (DeepSpeed 0.19 data_types.grad_accum_dtype); what DeepSpeed cannot do at stage 0 is a warning,
// not a silent change of stage.
TEST(Export, KeepsTheZeroStageAndFp32GradientAccumulation) {
  Case c;
  c.bf16 = true;
  c.offload = Offload::kOptimizer;
  DeepSpeedExport exported = deepspeed_config(c.run());
  EXPECT_EQ(exported.config["zero_optimization"], json({{"stage", 0}}));
  EXPECT_FALSE(exported.config.contains("data_types"));  // DeepSpeed refuses it at stage 0
  EXPECT_EQ(exported.config["communication_data_type"], "fp32");
  ASSERT_EQ(warning_keys(exported.warnings),
            (std::vector<std::string>{"memory.offload_optimizer=true, zero.stage=0",
                                      "memory.precision=bf16, zero.stage=0"}));
  EXPECT_NE(exported.warnings[0].find("in a world of 1 stage 1 shards nothing"),
            std::string::npos);

  c.zero_stage = 1;
  exported = deepspeed_config(c.run());
  EXPECT_EQ(exported.config["zero_optimization"],
            json::parse(R"({"stage": 1,
                            "offload_optimizer": {"device": "cpu", "pin_memory": true},
                            "reduce_bucket_size": 33554432,
                            "allgather_bucket_size": 67108864})"));
  EXPECT_EQ(exported.config["data_types"], json::parse(R"({"grad_accum_dtype": "fp32"})"));
  EXPECT_TRUE(exported.warnings.empty());

  for (int64_t stage : {2, 3}) {
    c.zero_stage = stage;
    c.offload = Offload::kNone;
    exported = deepspeed_config(c.run());
    json zero = {{"stage", stage}};
    zero.update(expected_buckets(stage, /*bf16=*/true));
    EXPECT_EQ(exported.config["zero_optimization"], zero);
    EXPECT_EQ(exported.config["data_types"]["grad_accum_dtype"], "fp32");
    EXPECT_TRUE(exported.warnings.empty());
  }
  c.bf16 = false;  // fp32 accumulates in fp32 anyway
  exported = deepspeed_config(c.run());
  EXPECT_FALSE(exported.config.contains("data_types"));
  EXPECT_FALSE(exported.config.contains("communication_data_type"));
}

// A run over several nodes: Accelerate's num_machines is the node count; num_processes stays the
// world; setting each machine's rank and the main address is the user's, and said.
// bf16-states (transformers' numerics: bf16 gradients and AdamW moments, no masters) exports
// as DeepSpeed's bf16 with its gradients all-reduced in bf16, and says what DeepSpeed keeps
// beyond it; the deepspeed backend refuses to run it as a trial.
TEST(Export, Bf16StatesExportsBf16AndSaysDeepSpeedKeepsMasters) {
  Case c;
  c.bf16 = c.bf16_states = true;
  c.dp = 2;
  const DeepSpeedExport exported = deepspeed_config(c.run());
  EXPECT_EQ(exported.config["bf16"], json({{"enabled", true}}));
  EXPECT_EQ(exported.config["zero_optimization"], json({{"stage", 0}}));
  EXPECT_FALSE(exported.config.contains("data_types"));
  EXPECT_EQ(exported.config["communication_data_type"], "bf16");
  EXPECT_EQ(exported.config["seq_parallel_communication_data_type"], "bf16");
  ASSERT_EQ(warning_keys(exported.warnings),
            std::vector<std::string>{"memory.precision=bf16-states"});
  EXPECT_NE(exported.warnings[0].find("fp32 master weights and fp32 AdamW moments"),
            std::string::npos)
      << exported.warnings[0];
  const std::optional<std::string> refusal = backends::deepspeed_refusal(c.run());
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->rfind("memory.precision: bf16-states: ", 0), 0u) << *refusal;
}

TEST(Export, AccelerateNamesTheMachinesOfAMultiNodeRun) {
  Case c;
  c.dp = 4;
  c.sp = 4;
  const AccelerateExport single = accelerate_config(c.run());
  EXPECT_EQ(YAML::Load(single.yaml)["num_machines"].as<int64_t>(), 1);
  const AccelerateExport exported = accelerate_config(c.run(), "ds_config.json", 2);
  const YAML::Node file = YAML::Load(exported.yaml);
  EXPECT_EQ(file["num_machines"].as<int64_t>(), 2);
  EXPECT_EQ(file["num_processes"].as<int64_t>(), 16);
  EXPECT_EQ(file["machine_rank"].as<int64_t>(), 0);
  EXPECT_EQ(warning_keys(exported.warnings), (std::vector<std::string>{"mesh", "nodes=2"}));
  TempDir dir;
  const ExportFiles files = write_exports(c.run(), dir.path().string(), 2);
  EXPECT_EQ(YAML::LoadFile(files.accelerate_path)["num_machines"].as<int64_t>(), 2);
}

// Text from the run config goes into comments on one line: a line break there (YAML also ends a
// line at a lone CR) would start a key of its own.
TEST(Export, CommentsHoldNoLineBreaks) {
  Case c;
  config::RunConfig run = c.run();
  run.data.source = "synthetic\rmicro_batch_size: 99\nsequence_parallel_size: 7";
  const std::string recipe = arctic_recipe(run).yaml;
  EXPECT_EQ(recipe.find('\r'), std::string::npos) << recipe;
  EXPECT_EQ(recipe.find("\nsequence_parallel_size: 7"), std::string::npos) << recipe;
  EXPECT_EQ(YAML::Load(recipe)["micro_batch_size"].as<int64_t>(), kMicroBatch);
}

// Where an export speaks of the model it names its family: the recipe's and the Accelerate
// config's header comments, the recipe's model.name_or_path comment and its placeholder warning.
// A run loading a checkpoint takes the family from its config.json.
TEST(Export, ExportsNameTheModelFamily) {
  auto contains = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  TempDir dir;
  Case qwen3;
  qwen3.family = "qwen3";
  qwen3.dp = 2, qwen3.sp = 2;
  const std::string family = "qwen3 (transformers Qwen3ForCausalLM, config.json model_type qwen3)";
  ArcticRecipeExport recipe = arctic_recipe(qwen3.run());
  EXPECT_TRUE(contains(recipe.yaml, "# Model family: " + family + ".\n")) << recipe.yaml;
  EXPECT_TRUE(contains(recipe.yaml, std::string(kArcticModelPlaceholder) +
                                        "  # replace: an HF hub name or a local model dir "
                                        "(config.json, tokenizer) of family " + family))
      << recipe.yaml;
  const auto placeholder = std::find_if(
      recipe.warnings.begin(), recipe.warnings.end(),
      [](const std::string& w) { return w.rfind("model.load: ", 0) == 0; });
  ASSERT_NE(placeholder, recipe.warnings.end());
  EXPECT_TRUE(contains(*placeholder, "an HF model of family " + family + ": ")) << *placeholder;
  const AccelerateExport accelerate = accelerate_config(qwen3.run());
  EXPECT_TRUE(contains(accelerate.yaml, "# Model family: " + family + "; train.py loads"))
      << accelerate.yaml;

  Case mistral;
  mistral.model_load = write_model_dir(dir.path() / "mistral", "mistral");
  ASSERT_EQ(mistral.run().model.family, "mistral");
  recipe = arctic_recipe(mistral.run());
  EXPECT_TRUE(contains(recipe.yaml, "# Model family: mistral (transformers MistralForCausalLM, "
                                    "config.json model_type mistral)."))
      << recipe.yaml;
  EXPECT_TRUE(contains(recipe.yaml, mistral.model_load + "  # model.load, of family mistral;"))
      << recipe.yaml;
  EXPECT_TRUE(contains(accelerate_config(mistral.run()).yaml,
                       "# Model family: mistral (transformers MistralForCausalLM"));
  EXPECT_TRUE(contains(arctic_recipe(Case{}.run()).yaml,
                       "# Model family: llama (transformers LlamaForCausalLM"));
}

TEST(Export, WriteExportsWritesThreeFilesAndMergesWarnings) {
  TempDir dir;
  Case c;
  c.dp = 2;
  c.sp = 2;
  const fs::path out = dir.path() / "nested" / "out";
  ExportFiles files = write_exports(c.run(), out.string());
  EXPECT_EQ(files.deepspeed_path, (out / "ds_config.json").string());
  EXPECT_EQ(json::parse(read_text(files.deepspeed_path)), expected_deepspeed_config(c));
  EXPECT_EQ(YAML::LoadFile(files.arctic_path)["sequence_parallel_size"].as<int64_t>(), 2);
  EXPECT_EQ(YAML::LoadFile(files.accelerate_path)["num_processes"].as<int64_t>(), 4);
  // The PyTorch warning of all three exports appears once.
  EXPECT_EQ(warning_keys(files.warnings),
            (std::vector<std::string>{"mesh", "model.load", "data.source"}));
  files = write_exports(c.run(), out.string());  // replaces, leaves no temporary behind
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(out)) ++entries;
  EXPECT_EQ(entries, 3);

  std::ofstream(dir.path() / "a-file") << "x";
  try {
    write_exports(c.run(), (dir.path() / "a-file").string());
    ADD_FAILURE() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind((dir.path() / "a-file").string() + ": cannot write", 0),
              0u)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The real consumers

// Runs `command` through the shell; returns its exit status and stdout.
int run_command(const std::string& command, std::string& output) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void write_case(const Case& c, const fs::path& dir) {
  write_exports(c.run(), dir.string());
  std::ofstream(dir / "expect.json") << c.expect().dump(2);
}

TEST(Export, EveryFileLoadsInItsRealConsumer) {
  const char* python = getenv("ULYSSES_PYTHON");
  ASSERT_TRUE(python != nullptr && *python != '\0')
      << "ULYSSES_PYTHON is not set: it must name the project venv's Python (cmake sets it for"
         " every ctest test; when running the binary directly, export"
         " ULYSSES_PYTHON=/path/to/.venv/bin/python)";
  ASSERT_EQ(access(python, X_OK), 0)
      << "ULYSSES_PYTHON=" << python << " is not an executable interpreter";
  const std::string checker = std::string(ULYSSES_SOURCE_DIR) + "/tests/clients/check_exports.py";
  ASSERT_TRUE(fs::exists(checker)) << checker;

  TempDir dir;
  const std::string model_dir = write_model_dir(dir.path() / "model");
  std::vector<fs::path> good;
  // Every case of the matrix, all in one Python process (importing DeepSpeed and ArcticTraining
  // costs most of its time; each case adds a fraction of a second).
  for (const Case& c : matrix(model_dir)) {
    good.push_back(dir.path() / c.name());
    write_case(c, good.back());
  }
  // Schedules through DeepSpeed's and ArcticTraining's own scheduler classes.
  for (auto [schedule, warmup, min_lr] : {std::tuple{"cosine", 3, 1.0e-5},
                                          std::tuple{"linear", 2, 0.0},
                                          std::tuple{"constant", 5, 0.0}}) {
    Case c;
    c.dp = 2;
    c.sp = 2;
    c.schedule = schedule;
    c.warmup_steps = warmup;
    c.min_lr = min_lr;
    good.push_back(dir.path() / c.name());
    write_case(c, good.back());
  }
  // Each family, its checkpoint's config.json read by transformers as ArcticTraining reads it,
  // and the MLP class its tiled_mlp_compute patches found: Qwen3 with the placeholder (a stand-in
  // Qwen3 dir), Mistral and Qwen2 loading a checkpoint dir of their family.
  for (const char* family : {"qwen3", "mistral", "qwen2"}) {
    Case c;
    c.family = family;
    c.dp = 2, c.sp = 2;
    c.tiled_mlp = "auto";
    c.offload = Offload::kActivations;
    if (c.family != "qwen3") {
      c.bf16 = true, c.zero_stage = 1;
      c.model_load = write_model_dir(dir.path() / ("model-" + c.family), family);
    }
    good.push_back(dir.path() / c.name());
    write_case(c, good.back());
  }
  // bf16-states: DeepSpeed's bf16 with bf16 communication.
  {
    Case c;
    c.dp = 2, c.sp = 2;
    c.bf16 = c.bf16_states = true;
    c.model_load = model_dir;
    good.push_back(dir.path() / c.name());
    write_case(c, good.back());
  }
  // Broken files the consumers must reject (the checker is not vacuous): DeepSpeed's batch
  // assertion (train_batch_size over the whole world instead of dp), Accelerate's refusal of
  // mixed_precision beside deepspeed_config_file, ArcticTraining's unknown-key check.
  Case base;
  base.dp = 2;
  base.sp = 2;
  const fs::path bad_batch = dir.path() / "bad_train_batch_size";
  write_case(base, bad_batch);
  json ds = json::parse(read_text(bad_batch / "ds_config.json"));
  ds["train_batch_size"] = kMicroBatch * kGradAccum * base.world();
  std::ofstream(bad_batch / "ds_config.json") << ds.dump(2);
  const fs::path bad_precision = dir.path() / "bad_mixed_precision";
  write_case(base, bad_precision);
  std::ofstream(bad_precision / "accelerate_config.yaml", std::ios::app)
      << "mixed_precision: bf16\n";
  const fs::path bad_key = dir.path() / "bad_recipe_key";
  write_case(base, bad_key);
  std::ofstream(bad_key / "arctic_training.yaml", std::ios::app) << "tiled_mlp: true\n";

  std::string command = std::string(python) + " " + checker;
  for (const fs::path& path : good) command += " " + path.string();
  for (const fs::path& path : {bad_batch, bad_precision, bad_key}) command += " " + path.string();
  const fs::path log = dir.path() / "checker-stderr.log";
  command += " 2>" + log.string();
  std::string output;
  const int status = run_command(command, output);
  std::cout << "check_exports.py (the bad_* cases must be rejected, everything else accepted):\n"
            << output;

  EXPECT_EQ(status, 1) << "the checker must fail on the broken files (exit 1), not crash";
  for (const fs::path& path : good) {
    for (const char* file : {"ds_config.json", "arctic_training.yaml", "accelerate_config.yaml"}) {
      EXPECT_NE(output.find("OK   " + (path / file).string() + ": "), std::string::npos)
          << "not accepted: " << (path / file).string();
    }
  }
  for (const fs::path& path : {bad_batch / "ds_config.json",
                               bad_precision / "accelerate_config.yaml",
                               bad_key / "arctic_training.yaml"}) {
    EXPECT_NE(output.find("FAIL " + path.string() + ": "), std::string::npos)
        << "not rejected: " << path.string();
  }
  EXPECT_NE(output.find("SKIPPED "), std::string::npos) << "the checker must say what it skipped";
  if (HasFailure()) {
    dir.keep();
    std::cout << "kept " << dir.path() << "; checker stderr (tail):\n";
    const std::string errors = read_text(log);
    std::cout << errors.substr(errors.size() > 8000 ? errors.size() - 8000 : 0) << "\n";
  }
}

}  // namespace
}  // namespace ulysses::exports
