// Bad run configs: one test per class of error, each asserting the exact one-line message that
// names the key path (or the file).
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "config/mesh_factors.h"
#include "config/run_config.h"
#include "config_test_util.h"

namespace ulysses::config {
namespace {

using testing::expect_user_error;
using testing::expect_user_error_prefix;

struct Case {
  std::string yaml;
  std::vector<std::string> overrides;
  std::string message;
};

void expect_errors(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml + " --set " + (c.overrides.empty() ? "" : c.overrides[0]));
    expect_user_error([&] { parse_run_config_yaml(c.yaml, c.overrides); }, c.message);
  }
}

TEST(ConfigErrors, UnknownKeyAtAnyLevel) {
  expect_errors({
      {"memory: {tiled_mpl: 4}\n",
       {},
       "memory.tiled_mpl: unknown key (did you mean memory.tiled_mlp?)"},
      {"memroy: {tiled_mlp: 4}\n", {}, "memroy: unknown key (did you mean memory?)"},
      {"train: {wibble: 1}\n", {}, "train.wibble: unknown key"},
      {"model: {preset: tiny, hiden_size: 64}\n",
       {},
       "model.hiden_size: unknown key (did you mean model.hidden_size?)"},
      {"",
       {"memory.tiled_mpl=4"},
       "memory.tiled_mpl: unknown key (did you mean memory.tiled_mlp?)"},
      {"", {"optim.betas.0=0.9"}, "--set optim.betas.0=0.9: expected key.path=value"},
      {"", {"memory.tiled_mlp"}, "--set memory.tiled_mlp: expected key.path=value"},
      {"", {"steps=4"}, "--set steps=4: expected key.path=value"},
      {"", {"trian.steps=4"}, "trian: unknown key (did you mean train?)"},
      {"optim: {warmup: 10}\n", {}, "optim.warmup: unknown key (did you mean optim.warmup_steps?)"},
      {"", {"profile.warmup=1"}, "profile.warmup: unknown key (did you mean profile.warmup_steps?)"},
      {"", {"memory.tiled_mlp_size=2"},
       "memory.tiled_mlp_size: unknown key (did you mean memory.tiled_mlp?)"},
  });
}

TEST(ConfigErrors, DuplicateKey) {
  expect_errors({{"mesh:\n  sp: 2\n  sp: 4\n", {}, "mesh.sp: duplicate key"}});
}

TEST(ConfigErrors, WrongType) {
  expect_errors({
      {"sequence: {length: abc}\n", {}, "sequence.length: expected an integer, got 'abc'"},
      {"sequence: {length: 4096.5}\n", {}, "sequence.length: expected an integer, got '4096.5'"},
      {"sequence:\n  length:\n", {}, "sequence.length: expected an integer, got nothing"},
      {"", {"sequence.length=abc"}, "sequence.length: expected an integer, got 'abc'"},
      {"optim: {lr: fast}\n", {}, "optim.lr: expected a number, got 'fast'"},
      {"optim: {lr: .inf}\n", {}, "optim.lr: expected a number, got '.inf'"},
      {"optim: {betas: 0.9}\n", {}, "optim.betas: expected a list of 2 numbers, got '0.9'"},
      {"optim: {betas: [0.9, x]}\n", {}, "optim.betas[1]: expected a number, got 'x'"},
      {"memory: {checkpointing: maybe}\n",
       {},
       "memory.checkpointing: expected true or false, got 'maybe'"},
      {"memory: {tiled_mlp: 0}\n",
       {},
       "memory.tiled_mlp: expected an integer >= 1 or 'auto', got '0'"},
      {"memory: {tiled_loss: many}\n",
       {},
       "memory.tiled_loss: expected an integer >= 1 or 'auto', got 'many'"},
      {"train: {seed: -1}\n", {}, "train.seed: expected a non-negative integer, got '-1'"},
      {"output: {dir: [a, b]}\n", {}, "output.dir: expected a string, got a list"},
      {"mesh: 2\n", {}, "mesh: expected a mapping of keys, got '2'"},
      {"- a\n- b\n", {}, "document: expected a mapping of keys, got a list"},
  });
}

TEST(ConfigErrors, OutOfRangeOrNotAllowed) {
  expect_errors({
      {"sequence: {length: 0}\n", {}, "sequence.length: must be >= 1, got 0"},
      {"sequence: {micro_batch: 0}\n", {}, "sequence.micro_batch: must be >= 1, got 0"},
      {"model: {num_heads: 0}\n", {}, "model.num_heads: must be >= 1, got 0"},
      {"optim: {lr: 0}\n", {}, "optim.lr: must be > 0, got 0.0"},
      {"optim: {lr: -1.0e-3}\n", {}, "optim.lr: must be > 0, got -0.001"},
      {"optim: {betas: [0.9, 1.0]}\n", {}, "optim.betas: each must be in [0, 1), got [0.9, 1.0]"},
      {"optim: {betas: [-0.1, 0.9]}\n", {}, "optim.betas: each must be in [0, 1), got [-0.1, 0.9]"},
      {"optim: {schedule: step}\n",
       {},
       "optim.schedule: must be one of constant|linear|cosine, got 'step'"},
      {"optim: {min_lr: 1}\n", {}, "optim.min_lr: must be in [0, lr 0.001], got 1.0"},
      {"mesh: {sp: 0}\n", {}, "mesh.sp: must be >= 1, got 0"},
      {"mesh: {dp: 0}\n", {}, "mesh.dp: must be >= 1, got 0"},
      {"train: {steps: -1}\n", {}, "train.steps: must be >= 0, got -1"},
      {"optim: {host_threads: -2}\n", {}, "optim.host_threads: must be >= 0, got -2"},
      {"train: {device: tpu}\n", {}, "train.device: must be one of cpu|cuda, got 'tpu'"},
      {"memory: {precision: fp16}\n", {}, "memory.precision: must be one of fp32|bf16|bf16-states, got 'fp16'"},
      {"memory: {limit_gib: -1}\n", {}, "memory.limit_gib: must be >= 0, got -1.0"},
      {"attention: {backend: sdpa}\n",
       {},
       "attention.backend: must be one of auto|math|flash|efficient|cudnn, got 'sdpa'"},
      {"attention: {backend: flash}\n",
       {},
       "attention.backend: flash needs train.device cuda (use auto or math)"},
      {"data: {source: random}\n",
       {},
       "data.source: must be synthetic, tokens:PATH or megatron:PREFIX, got 'random'"},
      {"data: {source: 'tokens:'}\n",
       {},
       "data.source: tokens: needs a path after the colon, got 'tokens:'"},
      {"data: {token_dtype: int8}\n",
       {},
       "data.token_dtype: must be one of uint16|uint32, got 'int8'"},
      {"model: {preset: llama-3.2-1b}\ndata: {source: 'tokens:t.bin'}\n",
       {},
       "data.token_dtype: uint16 cannot hold the ids of vocab_size 128256; use uint32"},
      {"data: {packing: conversations}\n",
       {},
       "data.packing: must be one of windows|documents, got 'conversations'"},
      {"data: {overlong: keep}\n", {}, "data.overlong: must be one of truncate|drop, got 'keep'"},
      {"data: {loss_mask: always}\n",
       {},
       "data.loss_mask: must be one of auto|require|ignore, got 'always'"},
      {"data: {packing: documents}\n",
       {},
       "data.packing: documents packs whole documents, which only a megatron:PREFIX source marks "
       "(in its index); data.source is synthetic, which has no document boundaries"},
      {"data: {source: 'megatron:chats/train', packing: documents}\n"
       "eval: {source: 'tokens:e.bin'}\n",
       {},
       "data.packing: documents packs whole documents, which only a megatron:PREFIX source marks "
       "(in its index); eval.source is tokens:e.bin, which has no document boundaries"},
      {"data: {loss_mask: require}\n",
       {},
       "data.loss_mask: require reads PREFIX_loss_mask beside a megatron:PREFIX source; "
       "data.source is synthetic"},
      {"checkpoint: {every: -1}\n", {}, "checkpoint.every: must be >= 0, got -1"},
      {"checkpoint: {save_initial: true}\n", {}, "checkpoint.save_initial: needs checkpoint.dir"},
      {"eval: {source: bogus}\n",
       {},
       "eval.source: must be synthetic, tokens:PATH or megatron:PREFIX, got 'bogus'"},
      {"comm: {store: etcd}\n", {}, "comm.store: must be tcp or file:PATH, got 'etcd'"},
      {"comm: {backend: nccl}\n", {}, "comm.backend: nccl needs train.device cuda"},
      {"output: {dir: ''}\n", {}, "output.dir: must not be empty"},
      {"model: {rope_scaling_type: longrope}\n",
       {},
       "model.rope_scaling_type: must be linear, dynamic, yarn, llama3 or empty (no scaling), got "
       "'longrope'"},
      {"model: {rope_scaling_type: yarn, rope_beta_slow: 0}\n",
       {},
       "model.rope_beta_slow: must be > 0, got 0.0"},
      {"model: {rope_scaling_type: yarn, rope_attention_factor: -1}\n",
       {},
       "model.rope_attention_factor: must be >= 0, got -1.0"},
      {"model: {rope_scaling_type: linear, rope_scaling_factor: 0}\n",
       {},
       "model.rope_scaling_factor: must be > 0, got 0.0"},
      {"model: {rope_scaling_type: dynamic, max_position_embeddings: 4095}\n",
       {},
       "model.rope_scaling_type: dynamic (NTK) scaling is supported only for sequences no longer "
       "than max_position_embeddings 4095 (got 4096 tokens): beyond it transformers rescales by "
       "the longest position seen at forward time, which SP shards and packed batches do not "
       "know"},
      {"model: {eos_token_id: 1024}\n",
       {},
       "model.eos_token_id: must be in [0, vocab_size 1024), got 1024"},
  });
}

TEST(ConfigErrors, Bf16NeedsCuda) {
  expect_errors({{"memory: {precision: bf16}\n",
                  {},
                  "memory.precision: bf16 needs train.device cuda (bf16 is a CUDA feature here)"}});
  const RunConfig c = parse_run_config_yaml("memory: {precision: bf16}\ntrain: {device: cuda}\n");
  EXPECT_EQ(c.memory.precision, "bf16");
}

// The fused RMSNorm/SwiGLU kernels are CUDA kernels: off by default, refused on CPU.
TEST(ConfigErrors, FusedKernelsNeedCuda) {
  EXPECT_FALSE(parse_run_config_yaml("").model.fused_kernels);
  expect_errors({{"model: {fused_kernels: true}\n",
                  {},
                  "model.fused_kernels: true needs train.device cuda (the fused kernels are CUDA "
                  "kernels)"},
                 {"", {"model.fused_kernels=true"},
                  "model.fused_kernels: true needs train.device cuda (the fused kernels are CUDA "
                  "kernels)"},
                 {"model: {fused_kernels: maybe}\n",
                  {},
                  "model.fused_kernels: expected true or false, got 'maybe'"}});
  const RunConfig c =
      parse_run_config_yaml("model: {fused_kernels: true}\ntrain: {device: cuda}\n");
  EXPECT_TRUE(c.model.fused_kernels);
}

// bf16-states (bf16 gradients and moments, no masters) runs where AdamW updates the bf16
// parameters themselves: not on CPU, not offloaded, not at ZeRO stages 1-3.
TEST(ConfigErrors, Bf16StatesNeedsCudaStageZeroAndNoOffload) {
  expect_errors({
      {"memory: {precision: bf16-states}\n",
       {},
       "memory.precision: bf16-states needs train.device cuda (bf16 is a CUDA feature here)"},
      {"memory: {precision: bf16-states, offload_optimizer: true}\ntrain: {device: cuda}\n",
       {},
       "memory.precision: bf16-states needs memory.offload_optimizer false (the offloaded "
       "optimizer keeps fp32 master weights; use bf16)"},
      {"memory: {precision: bf16-states}\nzero: {stage: 2}\ntrain: {device: cuda}\n",
       {},
       "memory.precision: bf16-states needs zero.stage 0 (ZeRO stages 1-3 keep fp32 master "
       "shards; use bf16)"},
  });
  const RunConfig c =
      parse_run_config_yaml("memory: {precision: bf16-states}\ntrain: {device: cuda}\n");
  EXPECT_EQ(c.memory.precision, "bf16-states");
}

TEST(ConfigErrors, MeshDoesNotMatchWorld) {
  RunConfig c = parse_run_config_yaml("mesh: {sp: 2, dp: 2}\n");
  expect_user_error([&] { validate(c, 2); }, "mesh: dp*sp = 4 does not match the world size 2");
  expect_user_error([&] { validate(c, 8); }, "mesh: dp*sp = 4 does not match the world size 8");
  validate(c, 4);
  validate(c, -1);
}

TEST(ConfigErrors, HeadCountsIncompatibleWithSp) {
  // 12 query heads, 3 KV heads (h 384, hd 32).
  const std::string model = "model: {hidden_size: 384, num_heads: 12, num_kv_heads: 3}\n";
  expect_errors({
      {"mesh: {sp: 3}\n",
       {},
       "mesh.sp: 3 does not divide model.num_heads 8 (Ulysses gives each rank num_heads/sp query "
       "heads; mesh.uneven_heads: true splits them unevenly or mesh.sp_ring: auto (ring attention "
       "over the rest))"},
      {model + "mesh: {sp: 4}\n",
       {},
       "mesh.sp: 4 and model.num_kv_heads 3 do not fit: need num_kv_heads % sp == 0 or sp % "
       "num_kv_heads == 0, or mesh.uneven_heads: true or mesh.sp_ring: auto (ring attention over "
       "the rest)"},
      {"model: {num_kv_heads: 3}\n", {}, "model.num_kv_heads: 3 does not divide num_heads 8"},
  });
  // 12 % 3 == 0, 3 % 3 == 0 and 12 % 6 == 0, 6 % 3 == 0: fine.
  for (int sp : {3, 6, 12}) {
    parse_run_config_yaml(model + "mesh: {sp: " + std::to_string(sp) + "}\n");
  }
}

// mesh.sp_ring factors sp into an all-to-all the heads allow times a ring; auto picks the largest
// all-to-all (7 heads at sp 8: 1 x 8 evenly, 4 x 2 unevenly; 32 heads over 8 KV heads at sp 64:
// 32 x 2).
TEST(ConfigErrors, RingFactorsMustDivideSpAndFitTheHeads) {
  const std::string seven = "model: {hidden_size: 56, num_heads: 7, num_kv_heads: 1}\n";
  expect_errors({
      {seven + "mesh: {sp: 8, sp_ring: 3}\n",
       {},
       "mesh.sp_ring: 3 does not divide mesh.sp 8 (sp = sp_a2a x sp_ring)"},
      {seven + "mesh: {sp: 8, sp_ring: 2}\n",
       {},
       "mesh.sp_ring: 2 leaves an all-to-all over sp / sp_ring = 4 ranks, which model.num_heads 7 "
       "/ num_kv_heads 1 do not split evenly (mesh.uneven_heads: true splits them unevenly)"},
  });
  const auto ring_of = [](const std::string& yaml) {
    const RunConfig c = parse_run_config_yaml(yaml);
    return resolved_sp_ring(c.mesh, c.model.num_heads, c.model.num_kv_heads);
  };
  EXPECT_EQ(ring_of(seven + "mesh: {sp: 8, sp_ring: auto}\n"), 8);
  EXPECT_EQ(ring_of(seven + "mesh: {sp: 8, sp_ring: auto, uneven_heads: true}\n"), 2);
  EXPECT_EQ(ring_of(seven + "mesh: {sp: 7, sp_ring: auto}\n"), 1);
  EXPECT_EQ(ring_of("model: {hidden_size: 256, num_heads: 32, num_kv_heads: 8}\n"
                    "mesh: {sp: 64, sp_ring: auto}\n"),
            2);
  EXPECT_EQ(ring_of(seven + "mesh: {sp: 8, uneven_heads: true, sp_ring: 2}\n"), 2);
}

// A hint names only what can help: an uneven split cannot give more ranks than query heads one
// each, so an sp (or an all-to-all) beyond the heads is pointed at the ring alone.
TEST(ConfigErrors, HintsBeyondTheHeadsNameTheRingOnly) {
  const std::string three = "model: {hidden_size: 24, num_heads: 3, num_kv_heads: 1}\n";
  expect_errors({
      {three + "mesh: {sp: 4}\n",
       {},
       "mesh.sp: 4 does not divide model.num_heads 3 (Ulysses gives each rank num_heads/sp query "
       "heads, and sp exceeds them; set mesh.sp_ring: auto (ring attention over the rest))"},
      {three + "mesh: {sp: 8, sp_ring: 2}\n",
       {},
       "mesh.sp_ring: 2 leaves an all-to-all over sp / sp_ring = 4 ranks, which model.num_heads 3 "
       "/ num_kv_heads 1 do not split evenly (more ranks than query heads; mesh.sp_ring: auto "
       "takes the largest all-to-all they allow)"},
  });
}

// mesh.uneven_heads lets sp split the heads unevenly (hq 7 at sp 2-7, hkv 3 at sp 4), as long as
// every rank gets a query head.
TEST(ConfigErrors, UnevenHeadsAllowSpNotDividingHeads) {
  const std::string seven = "model: {hidden_size: 56, num_heads: 7, num_kv_heads: 1}\n";
  expect_errors({
      {seven + "mesh: {sp: 3}\n",
       {},
       "mesh.sp: 3 does not divide model.num_heads 7 (Ulysses gives each rank num_heads/sp query "
       "heads; mesh.uneven_heads: true splits them unevenly or mesh.sp_ring: auto (ring attention "
       "over the rest))"},
      {seven + "mesh: {sp: 8, uneven_heads: true}\n",
       {},
       "mesh.sp: 8 exceeds model.num_heads 7: with mesh.uneven_heads every rank still needs at "
       "least one query head; set mesh.sp_ring: auto (ring attention over the rest)"},
      {seven, {"mesh.sp=8", "mesh.uneven_heads=true"},
       "mesh.sp: 8 exceeds model.num_heads 7: with mesh.uneven_heads every rank still needs at "
       "least one query head; set mesh.sp_ring: auto (ring attention over the rest)"},
  });
  for (int sp : {2, 3, 4, 7}) {
    const RunConfig c = parse_run_config_yaml(
        seven + "mesh: {sp: " + std::to_string(sp) + ", uneven_heads: true}\n");
    EXPECT_TRUE(c.mesh.uneven_heads);
    EXPECT_EQ(c.mesh.sp, sp);
  }
  parse_run_config_yaml("model: {hidden_size: 384, num_heads: 12, num_kv_heads: 3}\n",
                        {"mesh.sp=4", "mesh.uneven_heads=true"});
  EXPECT_FALSE(parse_run_config_yaml("").mesh.uneven_heads);  // off unless asked for
}

TEST(ConfigErrors, HeadDimUnsetOrOdd) {
  expect_errors({
      {"model: {hidden_size: 250}\n",
       {},
       "model.head_dim: not set, and hidden_size 250 is not divisible by num_heads 8"},
      {"model: {hidden_size: 264, num_heads: 8, head_dim: 33}\n",
       {},
       "model.head_dim: must be even (RoPE rotates half-splits), got 33"},
  });
}

// Qwen3 and Mistral-Nemo give head_dim explicitly: num_heads * head_dim need not be hidden_size.
TEST(ConfigErrors, ExplicitHeadDimNeedNotMatchHiddenSize) {
  const RunConfig c = parse_run_config_yaml("model: {num_heads: 8, head_dim: 64}\n");
  EXPECT_EQ(c.model.head_dim, 64);
  EXPECT_EQ(c.model.hidden_size, 256);
}

TEST(ConfigErrors, FamilyAndSlidingWindow) {
  expect_errors({
      {"model: {family: gemma2}\n",
       {},
       "model.family: 'gemma2' is not supported (supported: llama, mistral, qwen2, qwen3)"},
      {"model: {family: mistral, sliding_window: 4096}\nsequence: {length: 8192}\n",
       {},
       "model.sliding_window: 4096 is shorter than sequence.length 8192: sliding-window attention "
       "is not implemented (a model without a window, such as Mistral v0.3, or a sequence no "
       "longer than the window)"},
      {"model: {sliding_window: -1}\n", {}, "model.sliding_window: must be >= 0, got -1"},
  });
  // A window as long as the sequence masks nothing.
  const RunConfig c = parse_run_config_yaml(
      "model: {family: mistral, sliding_window: 4096}\nsequence: {length: 4096}\n");
  EXPECT_EQ(c.model.sliding_window, 4096);
}

TEST(ConfigErrors, UnknownPreset) {
  expect_user_error_prefix([] { parse_run_config_yaml("model: {preset: llama-9b}\n"); },
                           "model.preset: unknown preset 'llama-9b' (available: ");
  try {
    parse_run_config_yaml("model: {preset: llama-9b}\n");
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("llama-3.1-8b, llama-3.2-1b, llama-3.2-3b"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos) << e.what();
  }
}

TEST(ConfigErrors, BadPresetFileNamesTheFile) {
  testing::TempDir dir;
  const std::string bad_type = dir.write("bad-type.yaml", "model:\n  hidden_size: big\n");
  expect_user_error([&] { parse_run_config_yaml("model: {preset: " + bad_type + "}\n"); },
                    bad_type + ": model.hidden_size: expected an integer, got 'big'");
  const std::string chained = dir.write("chained.yaml", "model:\n  preset: tiny\n");
  expect_user_error([&] { parse_run_config_yaml("model: {preset: " + chained + "}\n"); },
                    chained + ": model.preset: unknown key");
  const std::string missing = dir.path() + "/missing.yaml";
  expect_user_error([&] { parse_run_config_yaml("model: {preset: " + missing + "}\n"); },
                    "model.preset: file '" + missing + "' does not exist");
}

TEST(ConfigErrors, PresetAndLoadTogether) {
  expect_errors({{"model: {preset: tiny, load: /models/x}\n",
                  {},
                  "model.load: cannot be combined with model.preset 'tiny' (shapes come from "
                  "/models/x/config.json)"}});
}

TEST(ConfigErrors, MissingOrUnparsableFile) {
  expect_user_error([] { load_run_config("/nonexistent/run.yaml", {}); },
                    "/nonexistent/run.yaml: cannot read file");
  testing::TempDir dir;
  const std::string path = dir.write("broken.yaml", "mesh:\n  sp: 2\n dp: [1\n");
  expect_user_error_prefix([&] { load_run_config(path, {}); }, path + ": line ");
  expect_user_error_prefix([] { parse_run_config_yaml("mesh: {sp: 2\n"); }, "run config: line ");
}

TEST(ConfigErrors, ValidateRejectsProgrammaticMistakesToo) {
  RunConfig c;  // as the tuner would build one
  c.memory.tiled_mlp.value = -1;
  expect_user_error([&] { validate(c); }, "memory.tiled_mlp: must be >= 1 or auto");
  c = RunConfig();
  c.optim.lr = std::numeric_limits<double>::quiet_NaN();
  expect_user_error([&] { validate(c); }, "optim.lr: must be > 0, got nan");
}

}  // namespace
}  // namespace ulysses::config
