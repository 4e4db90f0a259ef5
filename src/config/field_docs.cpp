// The one-sentence meaning of each run-config key, and the Markdown reference generated from
// them plus the field table's types and defaults.
#include "config/field_docs.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <sstream>

#include "config/field_table.h"
#include "config/yaml_values.h"

namespace ulysses::config {
namespace {

// key path -> meaning. Keep to one line of plain text (no '|': it would split a table cell).
const std::map<std::string, std::string>& meanings() {
  static const std::map<std::string, std::string> table = {
      {"model.preset",
       "A model from profiles/models/NAME.yaml (tiny, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, "
       "qwen2.5-7b, qwen3-4b, qwen3-8b, mistral-7b-v0.3, mistral-nemo-12b, ...) or a path to such "
       "a file; its fields replace the defaults below, and fields written "
       "in the run config win over it. \"\" = the inline fields."},
      {"model.family",
       "Decoder family: llama, qwen2 (Qwen2/2.5: q/k/v biases), qwen3 (per-head q/k RMSNorm "
       "before RoPE) or mistral; checkpoints are written in its HF layout (model_type)."},
      {"model.hidden_size", "Model width h."},
      {"model.num_layers", "Decoder layers."},
      {"model.num_heads",
       "Query heads hq; must be divisible by mesh.sp unless mesh.uneven_heads is set."},
      {"model.num_kv_heads",
       "Key/value heads hkv (GQA/MQA); divides num_heads; hkv % sp == 0 or sp % hkv == 0 (KV "
       "heads are then replicated sp/hkv times) unless mesh.uneven_heads is set."},
      {"model.head_dim", "Per-head size hd, even; 0 = hidden_size / num_heads."},
      {"model.intermediate_size", "SwiGLU MLP inner width."},
      {"model.vocab_size", "Vocabulary size V (>= 2); every token id must be below it."},
      {"model.rope_theta", "RoPE base frequency."},
      {"model.rope_scaling_type",
       "RoPE scaling, computed as transformers computes it: \"\" = none, linear (frequencies / "
       "factor), dynamic (NTK; only for sequences no longer than max_position_embeddings, where "
       "transformers leaves RoPE unscaled), yarn (YaRN, as Qwen2.5's long-context configs), "
       "llama3 (Llama 3.1)."},
      {"model.rope_scaling_factor", "linear, dynamic, yarn and llama3 scaling: factor."},
      {"model.rope_low_freq_factor", "llama3 scaling: low-frequency factor."},
      {"model.rope_high_freq_factor", "llama3 scaling: high-frequency factor (> low)."},
      {"model.rope_original_max_position",
       "yarn and llama3 scaling: the context length before scaling "
       "(original_max_position_embeddings)."},
      {"model.rope_attention_factor",
       "yarn scaling: the factor cos and sin are multiplied by; 0 = transformers' default from "
       "the factor (0.1 ln(factor) + 1) or from rope_mscale / rope_mscale_all_dim."},
      {"model.rope_beta_fast",
       "yarn scaling: frequencies turning at least this often over the original context are kept."},
      {"model.rope_beta_slow",
       "yarn scaling: frequencies turning at most this often over the original context are divided "
       "by the factor (a linear ramp between)."},
      {"model.rope_mscale",
       "yarn scaling: with rope_mscale_all_dim (both non-zero) the attention factor is "
       "mscale(factor, rope_mscale) / mscale(factor, rope_mscale_all_dim); 0 = unset."},
      {"model.rope_mscale_all_dim", "yarn scaling: see rope_mscale; 0 = unset."},
      {"model.rope_truncate",
       "yarn scaling: round the ramp's ends to whole dims (transformers' truncate)."},
      {"model.rms_norm_eps", "RMSNorm epsilon."},
      {"model.sliding_window",
       "Sliding-window attention span in tokens (Mistral); 0 = none. A window shorter than "
       "sequence.length is refused (sliding-window attention is not implemented)."},
      {"model.tie_embeddings", "The LM head shares the token embedding's weight."},
      {"model.init_seed",
       "Seed of the random weight init (identical on every rank, mesh and ZeRO stage; on CUDA the "
       "weights are drawn on the device, so a CUDA run starts from other values than a CPU run)."},
      {"model.init_std", "Standard deviation of the normal init of every weight matrix."},
      {"model.max_position_embeddings",
       "Written to a checkpoint's HF config.json (and read from one); training uses it only with "
       "dynamic RoPE scaling (the longest sequence supported)."},
      {"model.bos_token_id",
       "Written to / read from HF config.json; in [0, vocab_size). A checkpoint of model.load "
       "writes the source's value as it was there (null, absent) unless this key sets another."},
      {"model.eos_token_id",
       "Written to / read from HF config.json (the first of a list); in [0, vocab_size). A "
       "checkpoint of model.load writes the source's value as it was there (a list, null, "
       "absent) unless this key sets another."},
      {"model.load",
       "A Hugging Face model directory (config.json + *.safetensors): shapes from config.json, "
       "weights from the safetensors; not combinable with preset. \"\" = random init."},
      {"model.fused_kernels",
       "RMSNorm and SwiGLU (silu(gate) * up, also in the tiled MLP) through fused CUDA kernels "
       "where the tensors allow (bf16/fp16, contiguous, hidden sizes the kernels take), the ATen "
       "ops otherwise. Needs train.device cuda and a build with the kernels (a CUDA LibTorch and "
       "nvcc)."},
      {"mesh.sp",
       "Sequence-parallel degree: ranks that share one sequence (Ulysses all-to-all, times "
       "mesh.sp_ring ring attention). SP groups are contiguous ranks."},
      {"mesh.dp", "Data-parallel replicas; dp * sp must equal the number of ranks."},
      {"mesh.uneven_heads",
       "Allow an sp that does not divide the heads: each SP rank takes a contiguous range of "
       "ceil(hq/sp) or floor(hq/sp) query heads (the first hq % sp ranks the ceil) and the KV "
       "heads those use (a KV head used by several ranks is on each of them). Exact; the rank "
       "with the most heads sets the attention time. sp must not exceed hq. false = sp must "
       "divide hq, and hkv % sp == 0 or sp % hkv == 0. With mesh.sp_ring these rules apply to "
       "sp / sp_ring."},
      {"mesh.sp_ring",
       "How the SP group factors: sp = sp_a2a x sp_ring. The heads go all-to-all over sp_a2a "
       "ranks (contiguous ranks of the SP group), then attention runs as ring attention over the "
       "sp_ring ranks that hold the same heads: the sequence is cut into 2 sp_ring chunks, ring "
       "rank j holds chunks j and 2 sp_ring - 1 - j (zig-zag, so every rank does the same causal "
       "work), and K/V blocks pass around the ring while the previous block computes. This lets "
       "sp exceed the head count. 1 = all-to-all only; auto = the largest sp_a2a the heads allow "
       "(evenly, or unevenly with mesh.uneven_heads). Must divide sp; with a ring the sequence is "
       "padded to a multiple of 2 sp."},
      {"sequence.length",
       "Tokens per sequence (sl); padded up to a multiple of sp (of 2 sp with mesh.sp_ring > 1) "
       "with ignored labels."},
      {"sequence.micro_batch", "Sequences per rank per micro-step (bs)."},
      {"sequence.grad_accum",
       "Micro-steps per optimizer step; a step's global batch is dp * micro_batch * grad_accum "
       "sequences."},
      {"data.source",
       "synthetic (seeded random tokens), tokens:PATH (a flat file of token ids) or "
       "megatron:PREFIX (PREFIX.bin + PREFIX.idx, a Megatron-LM indexed dataset)."},
      {"data.seed", "Seed of the synthetic tokens."},
      {"data.token_dtype", "uint16 or uint32: the id size in a tokens:PATH file."},
      {"data.pack",
       "Documents inside a sequence get position ids from 0 and attend only to themselves "
       "(boundaries from a megatron:PREFIX index or data.eod_token); windows may still cut a "
       "document, which data.packing documents never does."},
      {"data.eod_token",
       "The document separator id of a flat file when packing; -1 = none (required for packing "
       "a tokens:PATH file)."},
      {"data.packing",
       "windows: each sequence is the next sequence.length tokens of the stream (documents may be "
       "cut; the pretraining default). documents: whole documents of a megatron:PREFIX source "
       "(the conversations of an SFT dataset) packed in order into each sequence, never cut "
       "across two, the rest padded with ignored labels; implies data.pack. eval.source is read "
       "the same way."},
      {"data.overlong",
       "With data.packing documents, a document longer than sequence.length: truncate (keep its "
       "first sequence.length tokens) or drop (leave it out). Both are counted in the log and "
       "summary.json (data_packing)."},
      {"data.loss_mask",
       "auto: a megatron:PREFIX source with PREFIX_loss_mask.bin/.idx beside it (the SFT mask "
       "prepare/prepare_data.py writes) learns only the tokens whose mask is 1: the label "
       "predicting a token of mask 0 is ignored, before any sharding; require: the same, and a "
       "source without that mask is an error; ignore: learn every token. Applies to data.source "
       "and eval.source."},
      {"memory.tiled_mlp",
       "Run the MLP over N sequence tiles (TiledMLP); auto = ceil(local length / hidden_size), "
       "the same on every rank; 1 = off."},
      {"memory.tiled_loss",
       "LM head + cross-entropy over N sequence tiles, so the full [sl, V] logits never exist; "
       "auto picks N; 1 = off."},
      {"memory.checkpointing", "Activation checkpointing per decoder layer."},
      {"memory.offload_activations",
       "Keep the checkpointed hidden states in host memory (needs checkpointing)."},
      {"memory.offload_optimizer", "fp32 master weights and AdamW states in host memory; the "
                                   "update runs on the CPU."},
      {"memory.offload_gradients",
       "With offload_optimizer at zero.stage 0 on a GPU: true keeps the fp32 gradient sums in host "
       "memory (copied out during backward; 16 B per parameter on the host, none on the device), "
       "false on the device (4 B per parameter there; the host update streams them in pieces: 12 "
       "B per parameter on the host). Same results either way. No effect otherwise."},
      {"memory.precision",
       "fp32, bf16 or bf16-states (both bf16 modes need train.device cuda). bf16: bf16 weights "
       "and activations, gradients summed in fp32, fp32 master weights and AdamW moments (16 B "
       "per parameter beyond the weights). bf16-states: transformers' numerics with a bf16 model "
       "and torch.optim.AdamW(fused=True): gradients summed and all-reduced in bf16, bf16 AdamW "
       "moments, no master weights (6 B per parameter beyond the weights); zero.stage 0 without "
       "memory.offload_optimizer only (ZeRO stages 1-3 and the offloaded optimizer keep fp32 "
       "masters)."},
      {"memory.limit_gib",
       "Per-rank memory cap in GiB (on CPU: the process address space); exceeding it exits 12. "
       "0 = none."},
      {"attention.backend",
       "auto, math, flash, efficient or cudnn; the last three need train.device cuda. auto lets "
       "SDPA pick a fused kernel; on CUDA it never falls back to the [sl, sl] math kernel (inputs "
       "no fused kernel takes are an error naming this key)."},
      {"attention.skip_all_but_last",
       "Debug/probe: core attention only in the last layer (others return the right shape), to "
       "find memory limits without the quadratic compute. Loss and gradients are then wrong."},
      {"attention.disable_in_eval", "Evaluation runs without sequence parallelism."},
      {"optim.lr", "Peak learning rate of AdamW (> 0)."},
      {"optim.betas", "AdamW betas, each in [0, 1)."},
      {"optim.eps", "AdamW epsilon (> 0)."},
      {"optim.weight_decay", "Decoupled weight decay (torch.optim.AdamW semantics)."},
      {"optim.grad_clip", "Clip the global L2 gradient norm to this; 0 = off."},
      {"optim.warmup_steps", "Linear warmup steps from 0 to lr."},
      {"optim.schedule", "constant, linear or cosine (the last two decay to min_lr)."},
      {"optim.min_lr", "The learning rate the schedule decays to; in [0, lr]."},
      {"optim.max_consecutive_skips",
       "A step whose grad_norm is not finite skips its update; this many such steps in a row "
       "stop the run (diverged). 0 = never stop."},
      {"optim.host_threads",
       "Threads of the host AdamW update and gradient norm with memory.offload_optimizer. 0 = "
       "auto: on a GPU the CPUs the process may run on divided among its node's ranks "
       "(LOCAL_WORLD_SIZE), on the CPU the intra-op threads. summary.json records the count."},
      {"optim.overlap_host_update",
       "auto, true or false. With memory.offload_optimizer, true runs the host AdamW update (and "
       "its share of the gradient norm) on a host thread while backward and the gradient "
       "reduction go on, each piece as soon as its gradient is final, keeping the old weights "
       "and moments (12 bytes per parameter of host memory; at ZeRO stages 1-3 per parameter of "
       "the rank's shard). zero.stage 0 (with memory.offload_gradients): each parameter, a "
       "decoder layer's after its backward of the step's last micro-batch on one rank, after its "
       "sum over the world on several. Stage 1: the rank's shard of the flat gradient buffer, "
       "once the buckets up to its end are summed. Stages 2 and 3: each parameter's shard, once "
       "its layer's reduce-scatter of the last micro-batch has landed, during the backward of "
       "the layers below; this needs the gradient shards in host memory (a CPU run; on a GPU "
       "they stay on the device). At the end the step commits when the norm does not clip, is "
       "redone from the kept state with the clip factor when it does, and is undone when the "
       "norm is not finite. The results equal false's bit for bit. false (the default): the "
       "whole update after backward. true where the overlap cannot run (no optimizer offload, "
       "stage 0 without gradient offload, stages 1-3 on a GPU) is an error; auto runs it on a "
       "GPU where it can and otherwise updates after backward (on the CPU the host threads are "
       "those backward runs on: none is idle to hide the update on). Not the default: the kept "
       "state adds 12 bytes per parameter to the offloaded optimizer's 16 of host memory on "
       "every rank at stage 0 (96 GB for 8B parameters), so that on one H100 with a 224 GB host "
       "the longest ALST length ulysses-tune plan finds for Llama-3.1-8B drops from 426K to 58K "
       "tokens (its checkpoints share that host). summary.json's optimizer_overlap says how much "
       "of the optimizer ran before the end of backward."},
      {"train.steps", "Optimizer steps to run (0 = none; evaluation still runs when set)."},
      {"train.seed", "Seed of the trainer's random state (saved in checkpoints)."},
      {"train.device", "cpu or cuda (cuda:LOCAL_RANK)."},
      {"checkpoint.dir",
       "Where checkpoints go: DIR/step-N/ (HF model.safetensors + config.json, optimizer and "
       "trainer state). \"\" = no checkpoints."},
      {"checkpoint.every", "Save every N steps (and after the last step); 0 = only after the last."},
      {"checkpoint.save_initial", "Also save the weights before the first step to DIR/initial/."},
      {"checkpoint.resume",
       "A step-N directory to continue from bit-for-bit, or latest (the highest step-N under "
       "dir; none yet = start fresh). \"\" = start fresh."},
      {"checkpoint.overwrite",
       "Allow replacing a checkpoint in dir that another run wrote (a different run id: a fresh "
       "start, or a resume of another run). false = such a run stops before step 1, naming it."},
      {"profile.warmup_steps", "Steps left out of the medians in summary.json."},
      {"profile.nvtx", "Emit NVTX ranges (when compiled in)."},
      {"profile.peak_tflops",
       "One rank's peak TFLOP/s for MFU in summary.json (profiles/hardware/); 0 = take "
       "$ULYSSES_PEAK_TFLOPS, and no MFU when that is unset."},
      {"output.dir", "Where rank 0 writes metrics.jsonl and summary.json (docs/outputs.md)."},
      {"eval.source",
       "Held-out data, a source string like data.source; \"\" = no evaluation. Loss and "
       "perplexity overall and per position bucket."},
      {"eval.seed", "Seed of synthetic eval data."},
      {"eval.every", "Evaluate every N steps (and after the last); 0 = only after the last."},
      {"eval.steps", "Eval batches per evaluation (>= 1)."},
      {"comm.timeout_s",
       "Rendezvous timeout in seconds: every rank must arrive within it (else exit 13)."},
      {"comm.collective_timeout_s",
       "Timeout of one collective in seconds (NCCL counts from when it is queued, so it must "
       "cover the compute queued ahead of it at long sequences); a collective past it makes the "
       "ranks exit 13."},
      {"comm.store",
       "Rendezvous: tcp (MASTER_ADDR:MASTER_PORT) or file:PATH (a shared file)."},
      {"zero.stage",
       "ZeRO over all dp x sp ranks: 0 = every rank holds the full AdamW state; 1 = AdamW "
       "moments and fp32 master weights sharded over the ranks; 2 = also the gradients "
       "(each layer's reduce-scattered into shard-sized fp32 buffers as soon as its backward "
       "ends); 3 = also the weights (gathered per layer for forward and again for backward, "
       "freed after use; layers always recompute in backward, as with memory.checkpointing). "
       "In a world of 1 every stage is a no-op."},
      {"zero.bucket_mb",
       "Size in MiB of one gradient all-reduce / reduce-scatter and one weight all-gather (every "
       "stage); > 0."},
      {"comm.backend", "auto (gloo on cpu, nccl on cuda), gloo or nccl (cuda only)."},
  };
  return table;
}

const std::map<std::string, std::string>& section_intros() {
  static const std::map<std::string, std::string> intros = {
      {"model", "Shapes of the Llama-family decoder. The defaults below are the inline model's."},
      {"mesh", "How the ranks are arranged: world size = dp * sp."},
      {"sequence", "Sequence length and batch."},
      {"data", "Training tokens. Step s uses samples [(s-1)G, sG), G = dp * micro_batch * "
               "grad_accum."},
      {"memory", "ALST memory features; each leaves loss and gradients unchanged."},
      {"attention", "The attention core."},
      {"optim", "AdamW and the learning-rate schedule."},
      {"train", "The run."},
      {"checkpoint", "Checkpoints in Hugging Face format."},
      {"profile", "Timing and NVTX."},
      {"output", "Where results go."},
      {"eval", "Held-out evaluation."},
      {"zero", "ZeRO sharding of optimizer state and gradients over the world group."},
      {"comm", "The distributed runtime."},
  };
  return intros;
}

std::string type_name(const int64_t&) { return "integer"; }
std::string type_name(const uint64_t&) { return "integer >= 0"; }
std::string type_name(const double&) { return "number"; }
std::string type_name(const bool&) { return "bool"; }
std::string type_name(const std::string&) { return "string"; }
std::string type_name(const TileCount&) { return "integer >= 1 or auto"; }
std::string type_name(const std::array<double, 2>&) { return "[number, number]"; }

template <class T>
std::string default_text(const T& value) {
  YAML::Emitter out;
  emit_value(out, value);
  return out.c_str();
}

}  // namespace

std::string field_meaning(const std::string& key_path) {
  const auto it = meanings().find(key_path);
  return it == meanings().end() ? "" : it->second;
}

std::vector<std::string> undocumented_keys() {
  std::vector<std::string> missing;
  const RunConfig defaults;
  for_each_field(defaults, [&](const char* section, const char* key, const auto&) {
    const std::string path = std::string(section) + "." + key;
    if (field_meaning(path).empty()) missing.push_back(path);
  });
  return missing;
}

std::vector<std::string> stale_documented_keys() {
  std::set<std::string> known;
  const RunConfig defaults;
  for_each_field(defaults, [&](const char* section, const char* key, const auto&) {
    known.insert(std::string(section) + "." + key);
  });
  std::vector<std::string> stale;
  for (const auto& [path, meaning] : meanings()) {
    if (!known.count(path)) stale.push_back(path);
  }
  return stale;
}

std::string config_reference_markdown() {
  std::ostringstream md;
  md << "# Run config reference (ulysses-train)\n\n"
        "<!-- Generated by `ulysses-train --print-config-reference` from src/config/field_table.h "
        "and src/config/field_docs.cpp; do not edit by hand (the test DocsReference checks that "
        "this file is current). -->\n\n"
        "A run config is a YAML file of the sections below; every key is optional (a key left "
        "out takes its default), an unknown key is an error, and `--set section.key=value` "
        "overrides any key (the value is read as YAML: `--set memory.tiled_mlp=auto`, `--set "
        "optim.betas=[0.9,0.99]`). Resolution order, later wins: these defaults; the model "
        "preset (`model.preset`) or the HF config (`model.load`); the file; the `--set` "
        "overrides. Bad input exits 2 with one line naming the key "
        "(`memory.tiled_mpl: unknown key (did you mean memory.tiled_mlp?)`). An example with "
        "comments: `experiments/runs/tiny-cpu.yaml`.\n";
  const RunConfig defaults;
  std::string open_section;
  for_each_field(defaults, [&](const char* section, const char* key, const auto& field) {
    if (open_section != section) {
      open_section = section;
      md << "\n## " << section << "\n\n";
      const auto intro = section_intros().find(section);
      if (intro != section_intros().end()) md << intro->second << "\n\n";
      md << "| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    const std::string path = std::string(section) + "." + key;
    const std::string meaning = field_meaning(path);
    md << "| `" << path << "` | " << type_name(field) << " | `" << default_text(field) << "` | "
       << (meaning.empty() ? "(undocumented)" : meaning) << " |\n";
  });
  return md.str();
}

}  // namespace ulysses::config
