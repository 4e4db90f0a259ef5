// Run configs that must load: the documented example, every preset, defaults, --set overrides,
// and the to_yaml round trip.
#include "config/run_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "common/paths.h"
#include "config/model_family.h"
#include "config/presets.h"
#include "config_test_util.h"

namespace ulysses::config {
namespace {

using testing::expect_same_config;
using testing::expect_user_error;

TEST(RunConfig, TinyCpuExampleLoads) {
  const RunConfig c = load_run_config(project_home() + "/experiments/runs/tiny-cpu.yaml", {});
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_EQ(c.model.num_heads, 8);
  EXPECT_EQ(c.model.head_dim, 32);
  EXPECT_EQ(c.mesh.sp, 2);
  EXPECT_EQ(c.mesh.dp, 2);
  EXPECT_EQ(c.sequence.length, 256);
  EXPECT_EQ(c.train.steps, 4);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.output.dir, "runs/tiny-cpu");
  RunConfig on_four_ranks = c;
  validate(on_four_ranks, 4);  // the README runs it with --nproc 4
  expect_user_error([&] { validate(on_four_ranks, 2); },
                    "mesh: dp*sp = 4 does not match the world size 2");
}

TEST(RunConfig, EveryPresetLoadsAndIsConsistent) {
  const std::vector<std::string> presets = available_presets();
  for (const char* required : {"tiny", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-7b",
                               "qwen3-4b", "qwen3-8b", "mistral-7b-v0.3", "mistral-nemo-12b"}) {
    EXPECT_NE(std::find(presets.begin(), presets.end(), required), presets.end()) << required;
  }
  for (const std::string& name : presets) {
    SCOPED_TRACE(name);
    const RunConfig c = parse_run_config_yaml("model:\n  preset: " + name + "\n", {});
    EXPECT_EQ(c.model.preset, name);
    model_family(c.model.family);  // one of the supported families
    // Qwen3 and Mistral-Nemo give head_dim explicitly; every other model has h = hq * hd.
    if (c.model.family != "qwen3" && name != "mistral-nemo-12b") {
      EXPECT_EQ(c.model.num_heads * c.model.head_dim, c.model.hidden_size);
    }
    EXPECT_EQ(c.model.head_dim % 2, 0);
    EXPECT_EQ(c.model.num_heads % c.model.num_kv_heads, 0);
    EXPECT_GT(c.model.vocab_size, c.model.eos_token_id);
  }
}

TEST(RunConfig, TinyPresetHasTheDocumentedShapes) {
  const ModelOptions m = load_model_preset("tiny");
  EXPECT_EQ(m.hidden_size, 256);
  EXPECT_EQ(m.num_layers, 2);
  EXPECT_EQ(m.num_heads, 8);
  EXPECT_EQ(m.num_kv_heads, 2);
  EXPECT_EQ(m.head_dim, 32);
  EXPECT_EQ(m.intermediate_size, 512);
  EXPECT_EQ(m.vocab_size, 1024);
  EXPECT_EQ(m.preset, "");  // the caller records the name
}

TEST(RunConfig, EmptyDocumentGivesTheDefaults) {
  RunConfig expected;            // options.h defaults ...
  expected.model.head_dim = 32;  // ... with head_dim resolved: 256 / 8
  expect_same_config(parse_run_config_yaml("", {}), expected);
  expect_same_config(parse_run_config_yaml("# only a comment\n", {}), expected);
  expect_same_config(parse_run_config_yaml("eval:\nmesh: {}\n", {}), expected);
}

TEST(RunConfig, HeadDimDefaultsToHiddenOverHeads) {
  const RunConfig c =
      parse_run_config_yaml("model: {hidden_size: 512, num_heads: 8, num_kv_heads: 2}\n", {});
  EXPECT_EQ(c.model.head_dim, 64);
}

TEST(RunConfig, InlineModelFieldsWinOverThePreset) {
  const RunConfig c = parse_run_config_yaml("model: {preset: tiny, num_layers: 4, init_seed: 7}\n");
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.model.init_seed, 7u);
  EXPECT_EQ(c.model.hidden_size, 256);  // from the preset
  EXPECT_EQ(c.model.vocab_size, 1024);
}

TEST(RunConfig, SequenceLengthNotDivisibleBySpIsFine) {
  const RunConfig c = parse_run_config_yaml("mesh: {sp: 4}\nsequence: {length: 1001}\n");
  EXPECT_EQ(c.sequence.length, 1001);  // padded to a multiple of sp at run time
}

TEST(RunConfig, KvHeadsFewerThanSpAreReplicatedNotRejected) {
  // tiny: 8 query heads, 2 KV heads; sp 4 and 8 replicate each KV head sp/2 times.
  for (int sp : {1, 2, 4, 8}) {
    const RunConfig c = parse_run_config_yaml("mesh: {sp: " + std::to_string(sp) + "}\n");
    EXPECT_EQ(c.mesh.sp, sp);
  }
}

TEST(Overrides, ScalarsListsAutoAndNestedKeys) {
  const RunConfig c = parse_run_config_yaml(
      "model: {preset: tiny}\nmemory: {tiled_mlp: 4}\noptim: {lr: 0.01}\n",
      {"memory.tiled_mlp=auto", "memory.tiled_loss=8", "optim.betas=[0.9,0.99]", "optim.lr=3e-4",
       "model.hidden_size=512", "model.head_dim=64", "mesh.sp=2", "memory.checkpointing=true",
       "output.dir=runs/x y", "data.source=tokens:/d/t.bin"});
  EXPECT_TRUE(c.memory.tiled_mlp.is_auto());
  EXPECT_EQ(c.memory.tiled_mlp.value, 0);
  EXPECT_EQ(c.memory.tiled_loss.value, 8);
  EXPECT_EQ(c.optim.betas[0], 0.9);
  EXPECT_EQ(c.optim.betas[1], 0.99);
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.model.hidden_size, 512);
  EXPECT_EQ(c.model.head_dim, 64);
  EXPECT_EQ(c.model.num_layers, 2);  // still the preset's
  EXPECT_EQ(c.mesh.sp, 2);
  EXPECT_TRUE(c.memory.checkpointing);
  EXPECT_EQ(c.output.dir, "runs/x y");
  EXPECT_EQ(c.data.source, "tokens:/d/t.bin");
}

TEST(Overrides, LaterWinsEmptyClearsAndPresetCanBeSwitched) {
  const RunConfig c = parse_run_config_yaml(
      "checkpoint: {dir: ckpt}\n",
      {"train.steps=3", "train.steps=5", "checkpoint.dir=", "model.preset=llama-3.2-1b"});
  EXPECT_EQ(c.train.steps, 5);
  EXPECT_EQ(c.checkpoint.dir, "");
  EXPECT_EQ(c.model.preset, "llama-3.2-1b");
  EXPECT_EQ(c.model.hidden_size, 2048);
}

TEST(Overrides, TextThatIsNotAScalarOrListIsTakenLiterally) {
  EXPECT_EQ(parse_run_config_yaml("", {"output.dir=runs/a: b"}).output.dir, "runs/a: b");
  EXPECT_EQ(parse_run_config_yaml("", {"output.dir=[a"}).output.dir, "[a");
  EXPECT_EQ(parse_run_config_yaml("", {"output.dir=x=y"}).output.dir, "x=y");
}

TEST(Overrides, ApplyToAFileOnDisk) {
  testing::TempDir dir;
  const std::string path = dir.write("run.yaml", "mesh: {sp: 2, dp: 2}\n");
  const RunConfig c = load_run_config(path, {"mesh.dp=1"});
  EXPECT_EQ(c.mesh.dp, 1);
  EXPECT_EQ(c.mesh.sp, 2);
}

// Every field set by hand to a value other than its default (and valid together).
RunConfig every_field_changed() {
  RunConfig c;
  ModelOptions& m = c.model;
  m.preset = "tiny";
  m.hidden_size = 384;
  m.num_layers = 3;
  m.num_heads = 12;
  m.num_kv_heads = 4;
  m.head_dim = 32;
  m.intermediate_size = 1000;
  m.vocab_size = 3000;
  m.rope_theta = 123456.5;
  m.rope_scaling_type = "llama3";
  m.rope_scaling_factor = 16.5;
  m.rope_low_freq_factor = 0.5;
  m.rope_high_freq_factor = 3.25;
  m.rope_original_max_position = 4096;
  m.rope_attention_factor = 1.25;  // yarn's keys: read and written whatever the type
  m.rope_beta_fast = 16.5;
  m.rope_beta_slow = 0.75;
  m.rope_mscale = 0.707;
  m.rope_mscale_all_dim = 1.5;
  m.rope_truncate = false;
  m.rms_norm_eps = 3.3e-6;
  m.tie_embeddings = true;
  m.fused_kernels = true;
  m.init_seed = 99;
  m.init_std = 0.0125;
  m.max_position_embeddings = 65536;
  m.bos_token_id = 5;
  m.eos_token_id = 6;
  c.mesh.sp = 4;
  c.mesh.dp = 3;
  c.sequence = {1000, 2, 3};
  c.data.source = "megatron:/data/corpus";  // documents packing and a required mask need one
  c.data.seed = (uint64_t{1} << 63) + 5;  // needs all 64 bits
  c.data.token_dtype = "uint32";
  c.data.pack = true;
  c.data.eod_token = 7;
  c.data.packing = "documents";
  c.data.overlong = "drop";
  c.data.loss_mask = "require";
  c.memory.tiled_mlp.value = 0;  // auto
  c.memory.tiled_loss.value = 5;
  c.memory.checkpointing = true;
  c.memory.offload_activations = true;
  c.memory.offload_optimizer = true;
  c.memory.precision = "bf16";
  c.memory.limit_gib = 1.5;
  c.attention.backend = "flash";
  c.attention.skip_all_but_last = true;
  c.attention.disable_in_eval = true;
  c.optim.lr = 3e-4;
  c.optim.betas = {0.85, 0.999};
  c.optim.eps = 1e-6;
  c.optim.weight_decay = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  c.optim.grad_clip = 0.5;
  c.optim.warmup_steps = 7;
  c.optim.schedule = "cosine";
  c.optim.min_lr = 3e-5;
  c.train = {11, 42, "cuda"};
  c.checkpoint = {"ckpt", 2, true, "latest"};
  c.profile = {2, false};
  c.output.dir = "2024";  // reads as a number unless quoted
  c.eval = {"megatron:/data/held-out", 3, 5, 2};
  c.comm = {60.5, 900.25, "file:/tmp/store", "nccl"};
  return c;
}

TEST(ToYaml, EveryFieldRoundTrips) {
  RunConfig original = every_field_changed();
  validate(original, 12);
  const std::string text = to_yaml(original);
  const RunConfig parsed = parse_run_config_yaml(text, {});
  expect_same_config(parsed, original);
  EXPECT_EQ(to_yaml(parsed), text);
  // Readable, hand-editable output.
  EXPECT_NE(text.find("tiled_mlp: auto"), std::string::npos) << text;
  EXPECT_NE(text.find("betas: [0.85, 0.999]"), std::string::npos) << text;
  EXPECT_NE(text.find("weight_decay: 0.30000000000000004"), std::string::npos) << text;
}

TEST(ToYaml, DefaultsAndTheExampleRoundTrip) {
  for (const RunConfig& original :
       {parse_run_config_yaml("", {}),
        load_run_config(project_home() + "/experiments/runs/tiny-cpu.yaml", {})}) {
    expect_same_config(parse_run_config_yaml(to_yaml(original), {}), original);
  }
}

}  // namespace
}  // namespace ulysses::config
