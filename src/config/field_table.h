// Every key of the run config, one line each, in the order files are written. The YAML reader, the
// writer (to_yaml), the unknown-key check and --set overrides all walk this one table, so they
// cannot disagree about which keys exist.
#pragma once
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::config {

// Calls visit(key, field) for every key of the `model:` section (also the keys of a
// profiles/models/*.yaml file). M is ModelOptions or const ModelOptions.
template <class M, class Visit>
void for_each_model_field(M& m, Visit&& visit) {
  visit("preset", m.preset);
  visit("family", m.family);
  visit("hidden_size", m.hidden_size);
  visit("num_layers", m.num_layers);
  visit("num_heads", m.num_heads);
  visit("num_kv_heads", m.num_kv_heads);
  visit("head_dim", m.head_dim);
  visit("intermediate_size", m.intermediate_size);
  visit("vocab_size", m.vocab_size);
  visit("rope_theta", m.rope_theta);
  visit("rope_scaling_type", m.rope_scaling_type);
  visit("rope_scaling_factor", m.rope_scaling_factor);
  visit("rope_low_freq_factor", m.rope_low_freq_factor);
  visit("rope_high_freq_factor", m.rope_high_freq_factor);
  visit("rope_original_max_position", m.rope_original_max_position);
  visit("rope_attention_factor", m.rope_attention_factor);
  visit("rope_beta_fast", m.rope_beta_fast);
  visit("rope_beta_slow", m.rope_beta_slow);
  visit("rope_mscale", m.rope_mscale);
  visit("rope_mscale_all_dim", m.rope_mscale_all_dim);
  visit("rope_truncate", m.rope_truncate);
  visit("rms_norm_eps", m.rms_norm_eps);
  visit("sliding_window", m.sliding_window);
  visit("tie_embeddings", m.tie_embeddings);
  visit("init_seed", m.init_seed);
  visit("init_std", m.init_std);
  visit("max_position_embeddings", m.max_position_embeddings);
  visit("bos_token_id", m.bos_token_id);
  visit("eos_token_id", m.eos_token_id);
  visit("load", m.load);
  visit("fused_kernels", m.fused_kernels);
}

// Calls visit(section, key, field) for every key of the run config. C is RunConfig or
// const RunConfig. Sections appear in kSections order.
template <class C, class Visit>
void for_each_field(C& c, Visit&& visit) {
  for_each_model_field(c.model, [&](const char* key, auto& field) { visit("model", key, field); });
  visit("mesh", "sp", c.mesh.sp);
  visit("mesh", "dp", c.mesh.dp);
  visit("mesh", "uneven_heads", c.mesh.uneven_heads);
  visit("mesh", "sp_ring", c.mesh.sp_ring);
  visit("sequence", "length", c.sequence.length);
  visit("sequence", "micro_batch", c.sequence.micro_batch);
  visit("sequence", "grad_accum", c.sequence.grad_accum);
  visit("data", "source", c.data.source);
  visit("data", "seed", c.data.seed);
  visit("data", "token_dtype", c.data.token_dtype);
  visit("data", "pack", c.data.pack);
  visit("data", "eod_token", c.data.eod_token);
  visit("data", "packing", c.data.packing);
  visit("data", "overlong", c.data.overlong);
  visit("data", "loss_mask", c.data.loss_mask);
  visit("memory", "tiled_mlp", c.memory.tiled_mlp);
  visit("memory", "tiled_loss", c.memory.tiled_loss);
  visit("memory", "checkpointing", c.memory.checkpointing);
  visit("memory", "offload_activations", c.memory.offload_activations);
  visit("memory", "offload_optimizer", c.memory.offload_optimizer);
  visit("memory", "offload_gradients", c.memory.offload_gradients);
  visit("memory", "precision", c.memory.precision);
  visit("memory", "limit_gib", c.memory.limit_gib);
  visit("attention", "backend", c.attention.backend);
  visit("attention", "skip_all_but_last", c.attention.skip_all_but_last);
  visit("attention", "disable_in_eval", c.attention.disable_in_eval);
  visit("optim", "lr", c.optim.lr);
  visit("optim", "betas", c.optim.betas);
  visit("optim", "eps", c.optim.eps);
  visit("optim", "weight_decay", c.optim.weight_decay);
  visit("optim", "grad_clip", c.optim.grad_clip);
  visit("optim", "warmup_steps", c.optim.warmup_steps);
  visit("optim", "schedule", c.optim.schedule);
  visit("optim", "min_lr", c.optim.min_lr);
  visit("optim", "max_consecutive_skips", c.optim.max_consecutive_skips);
  visit("optim", "host_threads", c.optim.host_threads);
  visit("optim", "overlap_host_update", c.optim.overlap_host_update);
  visit("zero", "stage", c.zero.stage);
  visit("zero", "bucket_mb", c.zero.bucket_mb);
  visit("train", "steps", c.train.steps);
  visit("train", "seed", c.train.seed);
  visit("train", "device", c.train.device);
  visit("checkpoint", "dir", c.checkpoint.dir);
  visit("checkpoint", "every", c.checkpoint.every);
  visit("checkpoint", "save_initial", c.checkpoint.save_initial);
  visit("checkpoint", "resume", c.checkpoint.resume);
  visit("checkpoint", "overwrite", c.checkpoint.overwrite);
  visit("profile", "warmup_steps", c.profile.warmup_steps);
  visit("profile", "nvtx", c.profile.nvtx);
  visit("profile", "peak_tflops", c.profile.peak_tflops);
  visit("output", "dir", c.output.dir);
  visit("eval", "source", c.eval.source);
  visit("eval", "seed", c.eval.seed);
  visit("eval", "every", c.eval.every);
  visit("eval", "steps", c.eval.steps);
  visit("comm", "timeout_s", c.comm.timeout_s);
  visit("comm", "collective_timeout_s", c.comm.collective_timeout_s);
  visit("comm", "store", c.comm.store);
  visit("comm", "backend", c.comm.backend);
}

// The top-level sections of a run config, in file order.
inline const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {
      "model", "mesh",       "sequence", "data",   "memory", "attention", "optim",
      "zero",  "train",      "checkpoint", "profile", "output", "eval",   "comm"};
  return names;
}

// The keys of one section (empty for an unknown section), in file order.
inline std::vector<std::string> section_keys(const std::string& section) {
  std::vector<std::string> keys;
  const RunConfig defaults;
  for_each_field(defaults, [&](const char* name, const char* key, const auto&) {
    if (section == name) keys.push_back(key);
  });
  return keys;
}

}  // namespace ulysses::config
