// Validation of a RunConfig: one list of checks per section, each naming its key. The first
// failing check throws; checks are ordered so that later ones may rely on earlier ones.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "common/error.h"
#include "config/mesh_factors.h"
#include "config/model_family.h"
#include "config/run_config.h"
#include "config/yaml_values.h"

namespace ulysses::config {
namespace {

std::string show(int64_t value) { return std::to_string(value); }
std::string show(double value) { return format_double(value); }

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw UserError(key + ": " + what);
}

void at_least(const std::string& key, int64_t value, int64_t min) {
  require(value >= min, key, "must be >= " + show(min) + ", got " + show(value));
}

// NaN fails these comparisons, so NaN is rejected too.
void positive(const std::string& key, double value) {
  require(value > 0, key, "must be > 0, got " + show(value));
}

void non_negative(const std::string& key, double value) {
  require(value >= 0, key, "must be >= 0, got " + show(value));
}

void one_of(const std::string& key, const std::string& value,
            std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* option : allowed) {
    if (value == option) return;
    if (!list.empty()) list += '|';
    list += option;
  }
  require(false, key, "must be one of " + list + ", got '" + value + "'");
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

// synthetic | tokens:PATH | megatron:PREFIX
void data_source(const std::string& key, const std::string& source) {
  if (source == "synthetic") return;
  for (const char* kind : {"tokens:", "megatron:"}) {
    if (starts_with(source, kind)) {
      require(source.size() > std::string(kind).size(), key,
              std::string(kind) + " needs a path after the colon, got '" + source + "'");
      return;
    }
  }
  require(false, key, "must be synthetic, tokens:PATH or megatron:PREFIX, got '" + source + "'");
}

void validate_model(ModelOptions& m) {
  model_family(m.family);
  at_least("model.hidden_size", m.hidden_size, 1);
  at_least("model.num_layers", m.num_layers, 1);
  at_least("model.num_heads", m.num_heads, 1);
  at_least("model.num_kv_heads", m.num_kv_heads, 1);
  at_least("model.head_dim", m.head_dim, 0);
  at_least("model.intermediate_size", m.intermediate_size, 1);
  at_least("model.vocab_size", m.vocab_size, 2);
  if (m.head_dim == 0) {
    require(m.hidden_size % m.num_heads == 0, "model.head_dim",
            "not set, and hidden_size " + show(m.hidden_size) + " is not divisible by num_heads " +
                show(m.num_heads));
    m.head_dim = m.hidden_size / m.num_heads;
  }
  require(m.head_dim % 2 == 0, "model.head_dim",
          "must be even (RoPE rotates half-splits), got " + show(m.head_dim));
  require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
          show(m.num_kv_heads) + " does not divide num_heads " + show(m.num_heads));
  positive("model.rope_theta", m.rope_theta);
  const std::string& rope = m.rope_scaling_type;
  require(rope.empty() || rope == "linear" || rope == "dynamic" || rope == "yarn" ||
              rope == "llama3",
          "model.rope_scaling_type",
          "must be linear, dynamic, yarn, llama3 or empty (no scaling), got '" + rope + "'");
  if (!rope.empty()) positive("model.rope_scaling_factor", m.rope_scaling_factor);
  if (rope == "llama3") {
    positive("model.rope_low_freq_factor", m.rope_low_freq_factor);
    require(m.rope_high_freq_factor > m.rope_low_freq_factor, "model.rope_high_freq_factor",
            "must be > rope_low_freq_factor " + show(m.rope_low_freq_factor) + ", got " +
                show(m.rope_high_freq_factor));
  }
  if (rope == "llama3" || rope == "yarn") {
    at_least("model.rope_original_max_position", m.rope_original_max_position, 1);
  }
  if (rope == "yarn") {
    non_negative("model.rope_attention_factor", m.rope_attention_factor);
    positive("model.rope_beta_fast", m.rope_beta_fast);
    positive("model.rope_beta_slow", m.rope_beta_slow);
    require(std::isfinite(m.rope_mscale), "model.rope_mscale", "must be a finite number");
    require(std::isfinite(m.rope_mscale_all_dim), "model.rope_mscale_all_dim",
            "must be a finite number");
  }
  require(rope != "dynamic" || m.head_dim > 2, "model.head_dim",
          "dynamic RoPE scaling needs a head dim > 2, got " + show(m.head_dim));
  positive("model.rms_norm_eps", m.rms_norm_eps);
  at_least("model.sliding_window", m.sliding_window, 0);
  positive("model.init_std", m.init_std);
  at_least("model.max_position_embeddings", m.max_position_embeddings, 1);
  for (auto [key, id] : {std::pair{"model.bos_token_id", m.bos_token_id},
                         std::pair{"model.eos_token_id", m.eos_token_id}}) {
    require(id >= 0 && id < m.vocab_size, key,
            "must be in [0, vocab_size " + show(m.vocab_size) + "), got " + show(id));
  }
}

// Mesh vs world and vs the model's head counts. The head rules apply to the all-to-all degree
// sp / sp_ring; with sp_ring 1 that is sp itself.
void validate_mesh(const RunConfig& c, int world_size) {
  const int64_t sp = c.mesh.sp, hq = c.model.num_heads, hkv = c.model.num_kv_heads;
  at_least("mesh.sp", sp, 1);
  at_least("mesh.dp", c.mesh.dp, 1);
  if (world_size != -1) {
    require(c.mesh.dp * sp == world_size, "mesh",
            "dp*sp = " + show(c.mesh.dp * sp) + " does not match the world size " +
                show(int64_t{world_size}));
  }
  if (!c.mesh.sp_ring.is_auto()) at_least("mesh.sp_ring", c.mesh.sp_ring.value, 1);
  const int64_t ring = resolved_sp_ring(c.mesh, hq, hkv);
  require(sp % ring == 0, "mesh.sp_ring",
          show(ring) + " does not divide mesh.sp " + show(sp) + " (sp = sp_a2a x sp_ring)");
  const int64_t a2a = sp / ring;
  // Hints name only what can help: an uneven split needs at least one query head per rank.
  if (ring > 1) {
    const std::string hint =
        a2a > hq ? " (more ranks than query heads; mesh.sp_ring: auto takes the largest "
                   "all-to-all they allow)"
                 : " (mesh.uneven_heads: true splits them unevenly)";
    require(heads_allow_a2a(hq, hkv, a2a, c.mesh.uneven_heads), "mesh.sp_ring",
            show(ring) + " leaves an all-to-all over sp / sp_ring = " + show(a2a) +
                " ranks, which model.num_heads " + show(hq) + " / num_kv_heads " + show(hkv) +
                (c.mesh.uneven_heads ? " cannot split (more ranks than query heads)"
                                     : " do not split evenly" + hint));
    return;
  }
  const std::string ring_hint = " or mesh.sp_ring: auto (ring attention over the rest)";
  if (c.mesh.uneven_heads) {
    // Any split of the heads, as long as every rank gets a query head.
    require(sp <= hq, "mesh.sp",
            show(sp) + " exceeds model.num_heads " + show(hq) +
                ": with mesh.uneven_heads every rank still needs at least one query head; set "
                "mesh.sp_ring: auto (ring attention over the rest)");
    return;
  }
  require(hq % sp == 0, "mesh.sp",
          show(sp) + " does not divide model.num_heads " + show(hq) +
              (sp <= hq ? " (Ulysses gives each rank num_heads/sp query heads; "
                              "mesh.uneven_heads: true splits them unevenly" + ring_hint + ")"
                            : " (Ulysses gives each rank num_heads/sp query heads, and sp exceeds "
                              "them; set mesh.sp_ring: auto (ring attention over the rest))"));
  require(hkv % sp == 0 || sp % hkv == 0, "mesh.sp",
          show(sp) + " and model.num_kv_heads " + show(hkv) +
              " do not fit: need num_kv_heads % sp == 0 or sp % num_kv_heads == 0, or "
              "mesh.uneven_heads: true" + ring_hint);
}

void validate_run(const RunConfig& c) {
  const bool cpu = c.train.device == "cpu";
  one_of("train.device", c.train.device, {"cpu", "cuda"});
  at_least("train.steps", c.train.steps, 0);

  at_least("sequence.length", c.sequence.length, 1);  // padded to a multiple of sp at run time
  // transformers' dynamic NTK scaling rescales the frequencies by the longest position a forward
  // has seen so far (per model replica, across steps), which an SP shard or a packed batch does
  // not see; below max_position_embeddings it leaves them unscaled, and so does ulysses-train.
  const int64_t ring = resolved_sp_ring(c.mesh, c.model.num_heads, c.model.num_kv_heads);
  const int64_t multiple = sequence_multiple(c.mesh.sp, ring);
  const int64_t padded_length = (c.sequence.length + multiple - 1) / multiple * multiple;
  require(c.model.rope_scaling_type != "dynamic" ||
              padded_length <= c.model.max_position_embeddings,
          "model.rope_scaling_type",
          "dynamic (NTK) scaling is supported only for sequences no longer than "
          "max_position_embeddings " + show(c.model.max_position_embeddings) + " (got " +
              show(padded_length) + " tokens): beyond it transformers rescales by the longest "
              "position seen at forward time, which SP shards and packed batches do not know");
  // A window at least as long as the sequence never masks anything (no token is that far back).
  require(c.model.sliding_window == 0 || c.model.sliding_window >= c.sequence.length,
          "model.sliding_window",
          show(c.model.sliding_window) + " is shorter than sequence.length " +
              show(c.sequence.length) +
              ": sliding-window attention is not implemented (a model without a window, such as "
              "Mistral v0.3, or a sequence no longer than the window)");
  at_least("sequence.micro_batch", c.sequence.micro_batch, 1);
  at_least("sequence.grad_accum", c.sequence.grad_accum, 1);

  data_source("data.source", c.data.source);
  one_of("data.token_dtype", c.data.token_dtype, {"uint16", "uint32"});
  require(!(starts_with(c.data.source, "tokens:") && c.data.token_dtype == "uint16" &&
            c.model.vocab_size > 65536),
          "data.token_dtype",
          "uint16 cannot hold the ids of vocab_size " + show(c.model.vocab_size) + "; use uint32");
  require(c.data.eod_token >= -1 && c.data.eod_token < c.model.vocab_size, "data.eod_token",
          "must be -1 (none) or a token id below vocab_size " + show(c.model.vocab_size) +
              ", got " + show(c.data.eod_token));
  one_of("data.packing", c.data.packing, {"windows", "documents"});
  one_of("data.overlong", c.data.overlong, {"truncate", "drop"});
  one_of("data.loss_mask", c.data.loss_mask, {"auto", "require", "ignore"});
  // Whole documents and a required mask come from Megatron datasets (their index and
  // PREFIX_loss_mask), for training and evaluation alike.
  const auto megatron_only = [&](const std::string& key, const std::string& source) {
    if (source.empty() || starts_with(source, "megatron:")) return;
    require(c.data.packing != "documents", "data.packing",
            "documents packs whole documents, which only a megatron:PREFIX source marks (in its "
            "index); " + key + " is " + source + ", which has no document boundaries");
    require(c.data.loss_mask != "require", "data.loss_mask",
            "require reads PREFIX_loss_mask beside a megatron:PREFIX source; " + key + " is " +
                source);
  };
  megatron_only("data.source", c.data.source);
  megatron_only("eval.source", c.eval.source);

  require(c.memory.tiled_mlp.value >= 0, "memory.tiled_mlp", "must be >= 1 or auto");
  require(c.memory.tiled_loss.value >= 0, "memory.tiled_loss", "must be >= 1 or auto");
  one_of("memory.precision", c.memory.precision, {"fp32", "bf16", "bf16-states"});
  require(!(cpu && c.memory.precision != "fp32"), "memory.precision",
          c.memory.precision + " needs train.device cuda (bf16 is a CUDA feature here)");
  // bf16-states keeps no fp32 masters: the offloaded and ZeRO-sharded optimizers update fp32
  // masters, so the mode runs where AdamW updates the bf16 parameters themselves.
  require(!(c.memory.precision == "bf16-states" && c.memory.offload_optimizer),
          "memory.precision",
          "bf16-states needs memory.offload_optimizer false (the offloaded optimizer keeps fp32 "
          "master weights; use bf16)");
  require(!(c.memory.precision == "bf16-states" && c.zero.stage != 0), "memory.precision",
          "bf16-states needs zero.stage 0 (ZeRO stages 1-3 keep fp32 master shards; use bf16)");
  non_negative("memory.limit_gib", c.memory.limit_gib);
  require(!(cpu && c.model.fused_kernels), "model.fused_kernels",
          "true needs train.device cuda (the fused kernels are CUDA kernels)");

  one_of("attention.backend", c.attention.backend, {"auto", "math", "flash", "efficient", "cudnn"});
  require(!cpu || c.attention.backend == "auto" || c.attention.backend == "math",
          "attention.backend", c.attention.backend + " needs train.device cuda (use auto or math)");

  positive("optim.lr", c.optim.lr);
  for (double beta : c.optim.betas) {
    require(beta >= 0 && beta < 1, "optim.betas",
            "each must be in [0, 1), got [" + show(c.optim.betas[0]) + ", " +
                show(c.optim.betas[1]) + "]");
  }
  positive("optim.eps", c.optim.eps);
  non_negative("optim.weight_decay", c.optim.weight_decay);
  non_negative("optim.grad_clip", c.optim.grad_clip);
  at_least("optim.warmup_steps", c.optim.warmup_steps, 0);
  one_of("optim.schedule", c.optim.schedule, {"constant", "linear", "cosine"});
  require(c.optim.min_lr >= 0 && c.optim.min_lr <= c.optim.lr, "optim.min_lr",
          "must be in [0, lr " + show(c.optim.lr) + "], got " + show(c.optim.min_lr));
  at_least("optim.max_consecutive_skips", c.optim.max_consecutive_skips, 0);
  at_least("optim.host_threads", c.optim.host_threads, 0);
  one_of("optim.overlap_host_update", c.optim.overlap_host_update, {"auto", "true", "false"});
  // Where the overlap cannot run, true is refused (auto falls back to the update after
  // backward); what depends on the world size and device (the gradient shards' place at ZeRO
  // stages 1-3) the trainer checks.
  require(c.optim.overlap_host_update != "true" || c.memory.offload_optimizer,
          "optim.overlap_host_update",
          "true needs memory.offload_optimizer (it overlaps the offloaded optimizer's host "
          "update)");
  require(c.optim.overlap_host_update != "true" || c.zero.stage != 0 ||
              c.memory.offload_gradients,
          "optim.overlap_host_update",
          "true needs memory.offload_gradients at zero.stage 0 (the host update reads the "
          "gradients where they were summed, in host memory)");

  require(c.zero.stage >= 0 && c.zero.stage <= 3, "zero.stage",
          "must be 0, 1, 2 or 3, got " + show(c.zero.stage));
  require(c.zero.bucket_mb > 0, "zero.bucket_mb", "must be > 0, got " + show(c.zero.bucket_mb));

  at_least("checkpoint.every", c.checkpoint.every, 0);
  require(!c.checkpoint.save_initial || !c.checkpoint.dir.empty(), "checkpoint.save_initial",
          "needs checkpoint.dir");
  require(c.checkpoint.resume != "latest" || !c.checkpoint.dir.empty(), "checkpoint.resume",
          "latest needs checkpoint.dir");

  at_least("profile.warmup_steps", c.profile.warmup_steps, 0);
  non_negative("profile.peak_tflops", c.profile.peak_tflops);
  require(!c.output.dir.empty(), "output.dir", "must not be empty");

  if (!c.eval.source.empty()) data_source("eval.source", c.eval.source);
  at_least("eval.every", c.eval.every, 0);
  at_least("eval.steps", c.eval.steps, 1);

  positive("comm.timeout_s", c.comm.timeout_s);
  positive("comm.collective_timeout_s", c.comm.collective_timeout_s);
  require(c.comm.store == "tcp" || (starts_with(c.comm.store, "file:") && c.comm.store.size() > 5),
          "comm.store", "must be tcp or file:PATH, got '" + c.comm.store + "'");
  one_of("comm.backend", c.comm.backend, {"auto", "gloo", "nccl"});
  require(!(cpu && c.comm.backend == "nccl"), "comm.backend", "nccl needs train.device cuda");
}

}  // namespace

void validate(RunConfig& config, int world_size) {
  TORCH_CHECK(world_size == -1 || world_size >= 1, "validate: world_size must be -1 or >= 1, got ",
              world_size);
  validate_model(config.model);
  validate_mesh(config, world_size);
  validate_run(config);
}

}  // namespace ulysses::config
