// Memory terms per rank (see memory_model.h). Shapes: bs = micro_batch, sl = sequence length,
// T = ceil(sl / sp) local tokens, h hidden, V vocab, L layers, P parameters, ffn intermediate,
// qd = hq x hd, kvd = hkv_r x hd with hkv_r = max(hkv, sp) KV heads after the all-to-all
// (replicated when sp > hkv), d = bytes of the model dtype. With mesh.uneven_heads and an sp that
// does not split the heads evenly, the terms after the all-to-all are those of the rank with the
// most heads: qd = sp x ceil(hq / sp) x hd and kvd = sp x hkv_r x hd with hkv_r that rank's KV
// heads (sp/head_split.h), as if every rank held that many. What a family adds to the Llama block
// (config/model_family.h) is counted where it lives: Qwen2's q/k/v biases as parameters, Qwen3's
// q/k norms as parameters and saved activations.
#include "tuner/costmodel/memory_model.h"

#include <algorithm>

#include "config/mesh_factors.h"
#include "config/model_family.h"

namespace ulysses::costmodel {
namespace {

std::string n(int64_t v) { return std::to_string(v); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One gradient reduce / weight gather bucket: zero.bucket_mb (every stage, zero/grad_buffers.h).
int64_t bucket_bytes(const config::RunConfig& c) {
  return std::max<int64_t>(static_cast<int64_t>(c.zero.bucket_mb * 1024.0 * 1024.0), 1);
}

// How many ways each kind of state is split: ZeRO over the world (dp x sp ranks; in a world of 1
// every stage is stage 0, as the trainer does), or the what-if state_shards, whichever is more.
struct ZeroShards {
  int64_t stage = 0;
  int64_t optimizer = 1, gradients = 1, weights = 1;
};

ZeroShards zero_shards(const config::RunConfig& c, const MemoryCoefficients& k) {
  const int64_t world = c.mesh.dp * c.mesh.sp;
  ZeroShards z;
  z.stage = world > 1 ? c.zero.stage : 0;
  const int64_t what_if = std::max<int64_t>(1, k.state_shards);
  const bool grads = z.stage >= 3 || (z.stage == 2 && kZero2ShardsGradientBuffer);
  z.optimizer = std::max(what_if, z.stage >= 1 ? world : 1);
  z.gradients = std::max(what_if, grads ? world : 1);
  z.weights = std::max(what_if, z.stage >= 3 ? world : 1);
  return z;
}

// Saved bytes per token of one RMSNorm over [.., h] (model/rms_norm.cpp, its own backward): its
// input and its output in the model dtype (the output kept by the projections it feeds), and the
// fp32 1/rms per token.
int64_t rms_norm_saved_bytes(int64_t h, int64_t d) { return 2 * h * d + 4; }

// Saved bytes per token of Qwen3's q_norm and k_norm (qk_norm; 0 for other families). Each norms
// [bs, T, heads, hd] over hd before RoPE, on this rank's T tokens and every head (before the
// all-to-all): it saves its input, the q or k projection, in the model dtype and 1/rms per head
// in fp32 (model/rms_norm.cpp). Its output is not saved: RoPE multiplies it by cos and sin, which
// keeps only those. (hq + hkv) x (hd x d + 4 B).
int64_t qk_norm_saved_bytes(const config::ModelOptions& m, int64_t hd, int64_t d) {
  if (!config::model_family(m.family).qk_norm) return 0;
  return (m.num_heads + m.num_kv_heads) * (hd * d + 4);
}

// Elements of the largest tensor the device AdamW updates at once: a parameter at stage 0, the
// flat fp32 shard of every parameter at stage 1 (zero/zero_optimizer.h), a parameter's shard at
// stages 2 and 3. Parameters: the embedding / LM head [V, h], q_proj and o_proj [qd, h], the MLP's
// [ffn, h] (k_proj and v_proj are at most q_proj's size).
int64_t largest_update_numel(const config::RunConfig& c, int64_t stage, int64_t world) {
  const config::ModelOptions& m = c.model;
  const int64_t h = m.hidden_size, hd = m.head_dim > 0 ? m.head_dim : h / m.num_heads;
  const int64_t largest =
      std::max({m.vocab_size * h, m.num_heads * hd * h, m.intermediate_size * h});
  if (stage == 1) return ceil_div(parameter_count(m), world);
  if (stage >= 2) return ceil_div(largest, world);
  return largest;
}

// Whether AdamW keeps fp32 master weights apart from the weights: for bf16 weights, for an
// optimizer off the weights' device (CUDA offload), and for ZeRO 1-2's flat fp32 shards. Not
// for fp32 weights at stage 0 or 3: there the weight (shard) is its own master
// (zero/zero_optimizer.cpp).
bool separate_masters(bool bf16, bool optimizer_off_device, int64_t stage) {
  return bf16 || optimizer_off_device || stage == 1 || stage == 2;
}

}  // namespace

int64_t MemoryEstimate::total_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : terms) total += t.bytes;
  return total;
}

int64_t layer_parameter_count(const config::ModelOptions& m) {
  const config::ModelFamily family = config::model_family(m.family);
  const int64_t h = m.hidden_size, hd = m.head_dim > 0 ? m.head_dim : h / m.num_heads;
  const int64_t attention = h * m.num_heads * hd        // q_proj
                            + 2 * h * m.num_kv_heads * hd  // k_proj, v_proj
                            + m.num_heads * hd * h;        // o_proj
  const int64_t qkv_bias = family.qkv_bias ? (m.num_heads + 2 * m.num_kv_heads) * hd : 0;
  const int64_t qk_norm = family.qk_norm ? 2 * hd : 0;  // q_norm, k_norm weights [hd]
  const int64_t mlp = 3 * h * m.intermediate_size;        // gate, up, down
  return attention + qkv_bias + qk_norm + mlp + 2 * h;     // + two RMSNorm weights
}

sp::HeadLoad a2a_heads(const config::ModelOptions& m, int64_t sp) {
  const int64_t hq = m.num_heads, hkv = m.num_kv_heads;
  if (sp <= hq && hkv >= 1 && hq % hkv == 0) return sp::max_rank_heads(hq, hkv, sp);
  return {ceil_div(hq, sp), ceil_div(std::max(hkv, sp), sp)};
}

int64_t parameter_count(const config::ModelOptions& m) {
  const int64_t h = m.hidden_size;
  const int64_t embeddings = m.vocab_size * h;
  return embeddings + m.num_layers * layer_parameter_count(m) + h +
         (m.tie_embeddings ? 0 : embeddings);
}

int64_t pinned_block_bytes(int64_t bytes) {
  constexpr int64_t kPage = 4096;
  return (bytes + kPage - 1) / kPage * kPage;
}

MemoryCoefficients default_memory_coefficients(const std::string& device_type) {
  MemoryCoefficients k;
  if (device_type == "cuda") {
    k.runtime_bytes = 0, k.allocator_fraction = 0.05;
  } else {
    // `plan --fit` on the CPU quickstart sweep (experiments/quickstart-cpu.yaml, 18 ok trials,
    // whole-process peak RSS; reports/cost-model-cpu/): the runtime is the ranks' measured
    // start-up baseline (about 109 MiB), and the resident set grows by 2.4 x what the tensors
    // account for (allocator arenas of four ranks, freed blocks the allocator keeps mapped).
    k.runtime_bytes = 108.5 * (1 << 20), k.allocator_fraction = 1.38;
  }
  return k;
}

int64_t dtype_bytes(const config::RunConfig& c) { return c.memory.precision == "fp32" ? 4 : 2; }

// memory.precision bf16-states: bf16 gradient buffers and AdamW moments, no fp32 masters
// (memory/precision.h); bf16 keeps fp32 ones.
bool bf16_states(const config::RunConfig& c) { return c.memory.precision == "bf16-states"; }

int64_t ring_ranks(const config::RunConfig& c) {
  const int64_t ring = config::resolved_sp_ring(c.mesh, c.model.num_heads,
                                                std::max<int64_t>(1, c.model.num_kv_heads));
  return ring >= 1 && c.mesh.sp % ring == 0 ? ring : 1;
}

int64_t padded_length(const config::RunConfig& c) {
  const int64_t multiple = config::sequence_multiple(c.mesh.sp, ring_ranks(c));
  return ceil_div(c.sequence.length, multiple) * multiple;
}

int64_t mlp_tiles(const config::RunConfig& c) {
  const int64_t t = padded_length(c) / c.mesh.sp;
  if (!c.memory.tiled_mlp.is_auto()) return c.memory.tiled_mlp.value;
  return std::max<int64_t>(1, ceil_div(t, c.model.hidden_size));  // sp/tiled_mlp.h
}

int64_t loss_tiles(const config::RunConfig& c) {
  const int64_t t = padded_length(c) / c.mesh.sp;
  if (!c.memory.tiled_loss.is_auto()) return c.memory.tiled_loss.value;
  const int64_t bytes = c.sequence.micro_batch * t * c.model.vocab_size * 4;  // fp32 logits
  return std::clamp<int64_t>(ceil_div(bytes, int64_t{1} << 30), 1, t);  // sp/tiled_logits_loss.h
}

MemoryEstimate lower_bound_peak(const config::RunConfig& c) {
  const bool on_cpu = c.train.device == "cpu";
  const bool bf16 = c.memory.precision != "fp32";  // bf16 weights (bf16 or bf16-states)
  const bool states16 = bf16_states(c);
  const int64_t p = parameter_count(c.model);
  const int64_t weight_bytes = bf16 ? 2 : 4;
  const int64_t sp = c.mesh.sp, bs = c.sequence.micro_batch;
  const int64_t local_tokens = (c.sequence.length + sp - 1) / sp;
  const int64_t h = c.model.hidden_size, v = c.model.vocab_size;
  const ZeroShards z = zero_shards(c, MemoryCoefficients{});
  auto per = [&](int64_t shards) {
    return shards > 1 ? " / " + n(shards) + " (ZeRO-" + n(z.stage) + ")" : std::string();
  };

  MemoryEstimate e;
  e.terms.push_back({"weights", p * weight_bytes / z.weights,
                     "P x " + n(weight_bytes) + " B" + per(z.weights)});
  // Gradients accumulate in fp32 buffers whatever the weights' dtype (zero/grad_buffers.h), in
  // bf16 ones under bf16-states; under optimizer offload at stage 0 those buffers are in host
  // memory (GradientBuffers on_host).
  if (!(c.memory.offload_optimizer && c.memory.offload_gradients && z.stage == 0 && !on_cpu)) {
    e.terms.push_back({"gradients", (states16 ? 2 : 4) * p / z.gradients,
                       states16 ? "P x 2 B (bf16 accumulation)" + per(z.gradients)
                                : "P x 4 B (fp32 accumulation)" + per(z.gradients)});
  }
  // AdamW moments (and fp32 masters for bf16 or ZeRO 1-2) live on this rank unless offloaded to
  // a host that is not this rank's memory (on CPU the host is the device).
  if (!c.memory.offload_optimizer || on_cpu) {
    e.terms.push_back({"adam moments", (states16 ? 4 : 8) * p / z.optimizer,
                       (states16 ? "P x 2 x 2 B" : "P x 2 x 4 B") + per(z.optimizer)});
    if (separate_masters(bf16 && !states16, /*optimizer_off_device=*/false, z.stage)) {
      e.terms.push_back({"fp32 master weights", 4 * p / z.optimizer,
                         "P x 4 B" + per(z.optimizer)});
    }
  }
  // The hidden state every layer boundary keeps for backward ([bs, T, h] per layer), unless the
  // checkpoints are offloaded off the device.
  const bool offloaded = c.memory.offload_activations && !on_cpu;
  if (!offloaded) {
    e.terms.push_back({"layer inputs", c.model.num_layers * bs * local_tokens * h * weight_bytes,
                       "L x bs x T x h x " + std::to_string(weight_bytes) + " B"});
  }
  // Untiled logits: [bs, T, V] fp32 exist at once (tiled: one tile, not counted).
  if (c.memory.tiled_loss.value == 1) {
    e.terms.push_back({"logits", bs * local_tokens * v * 4, "bs x T x V x 4 B"});
  }
  return e;
}

MemoryPrediction predict_memory(const config::RunConfig& c, const MemoryCoefficients& k) {
  const config::ModelOptions& m = c.model;
  const bool on_cpu = c.train.device == "cpu";
  const bool bf16 = c.memory.precision != "fp32";  // bf16 weights (bf16 or bf16-states)
  const bool states16 = bf16_states(c);
  const int64_t d = dtype_bytes(c), p = parameter_count(m);
  const int64_t sp = c.mesh.sp, world = c.mesh.dp * c.mesh.sp, bs = c.sequence.micro_batch;
  const int64_t sl = padded_length(c), t = sl / sp;
  // sp = sp_a2a x sp_ring: after the all-to-all a rank holds its ring block, sp_a2a x T tokens of
  // its heads (the whole sequence without a ring).
  const int64_t ring = ring_ranks(c), a2a = sp / ring;
  const int64_t h = m.hidden_size, v = m.vocab_size, layers = m.num_layers;
  const int64_t hd = m.head_dim > 0 ? m.head_dim : h / m.num_heads;
  // The rank with the most heads; qd_a2a == qd (and kvd as above) when sp_a2a splits them evenly.
  const sp::HeadLoad most = a2a_heads(m, a2a);
  const int64_t qd_a2a = a2a * most.q * hd, kvd_a2a = a2a * most.kv * hd;
  const int64_t ffn = m.intermediate_size;
  const int64_t tokens = bs * t;
  const ZeroShards z = zero_shards(c, k);
  // ZeRO-3 recomputes every layer in backward whatever memory.checkpointing says.
  const bool checkpointing =
      c.memory.checkpointing || c.memory.offload_activations || z.stage == 3;
  const bool tiled_mlp = mlp_tiles(c) > 1;
  const bool math = c.attention.backend == "math";
  const Location opt_loc = c.memory.offload_optimizer && !on_cpu ? Location::kHost
                                                                 : Location::kDevice;
  const Location ckpt_loc = c.memory.offload_activations && !on_cpu ? Location::kHost
                                                                    : Location::kDevice;
  const std::string ds = n(d) + " B";

  MemoryPrediction out;
  auto add = [&](std::string name, double bytes, std::string formula, Lifetime life,
                 Location loc = Location::kDevice) {
    out.terms.push_back({std::move(name), static_cast<int64_t>(bytes), std::move(formula), life,
                         loc});
  };

  // --- static state ---
  if (k.runtime_bytes > 0) {
    add("runtime", k.runtime_bytes, "calibrated: the rank's resident bytes before the model",
        Lifetime::kStatic);
  }
  auto per = [&](int64_t shards) {
    if (shards <= 1) return std::string();
    return " / " + n(shards) + (k.state_shards > 1 ? " shards (what-if)" : " (ZeRO over the world)");
  };
  add("weights", static_cast<double>(p) * d / z.weights, "P x " + ds + per(z.weights),
      Lifetime::kStatic);
  if (z.stage >= 3) {
    // ZeRO-3 gathers one unit's full weights for its forward/backward and prefetches the
    // next: two layers, or a layer beside the embedding / LM head [V, h].
    const double layer = static_cast<double>(layer_parameter_count(m));
    add("zero-3 gathered weights", (layer + std::max(layer, static_cast<double>(v) * h)) * d,
        "(layer + max(layer, V x h)) params x " + ds +
            " (the unit computing and the next, prefetched)",
        Lifetime::kStatic);
    // Parameters of any size are gathered in place (zero_partition.h): no staging beside them.
  }
  if (z.stage >= 2) {
    // A unit's gradient contributions wait in full-size fp32 until its reduce-scatter has run,
    // which overlaps the backward of the unit before: two units at once (the head's, V x h,
    // while the last layer's backward runs).
    const double layer = static_cast<double>(layer_parameter_count(m));
    add("zero pending gradients", (layer + std::max(layer, static_cast<double>(v) * h)) * 4.0,
        "(layer + max(layer, V x h)) params x 4 B (the fp32 gradients of the unit in backward and "
        "of the one being reduce-scattered)",
        Lifetime::kStatic);
  }
  // Gradients: fp32 flat buffers for every parameter dtype (zero/grad_buffers.h). Under optimizer
  // offload at stage 0 (and memory.offload_gradients) they are in host memory (GradientBuffers
  // on_host: each contribution is copied out during backward and summed on the CPU, where the
  // host AdamW reads it); the device then holds only autograd's one contribution at a time,
  // counted with the layer's backward.
  // bf16-states: bf16 flat buffers (2 B, not a what-if).
  const bool grads_on_host =
      opt_loc == Location::kHost && z.stage == 0 && c.memory.offload_gradients;
  const int64_t gradient_bytes = states16 ? 2 : k.gradient_bytes;
  add("gradients", static_cast<double>(gradient_bytes) * p / z.gradients,
      "P x " + n(gradient_bytes) + " B" +
          (states16                  ? " (bf16 flat buffers: memory.precision bf16-states)"
           : gradient_bytes == 4     ? " (fp32 flat buffers)"
                                     : " (what-if)") +
          per(z.gradients) +
          (z.stage == 2 && !kZero2ShardsGradientBuffer
               ? " (ZeRO-2 as built: the full buffer during accumulation)"
               : "") +
          (grads_on_host ? " (on the host: optimizer offload)" : ""),
      Lifetime::kStatic, grads_on_host ? Location::kHost : Location::kDevice);
  // Reduced in place bucket by bucket: the backend stages at most one bucket.
  if (world > 1) {
    add("gradient reduction buffer",
        static_cast<double>(std::min(bucket_bytes(c), gradient_bytes * p)),
        "min(zero.bucket_mb bucket, " + n(gradient_bytes) +
            " P) when dp x sp > 1 (in-place reduction, one bucket staged)",
        Lifetime::kStatic);
  }
  // AdamW: two fp32 moments; an fp32 master unless the parameter is its own (fp32 on the
  // optimizer's device at stage 0 or 3; ZeRO 1-2 keep a flat fp32 master shard). Offloaded
  // (CUDA): on the host, with page-locked staging buffers (optim/adamw.h). bf16-states: two bf16
  // moments and no master (stage 0 on the device only).
  const double ps = static_cast<double>(p) / z.optimizer;
  add("adam moments", (states16 ? 4.0 : 8.0) * ps,
      (states16 ? "P x 2 x 2 B" : "P x 2 x 4 B") + per(z.optimizer), Lifetime::kStatic, opt_loc);
  if (!states16 && separate_masters(bf16, opt_loc == Location::kHost, z.stage)) {
    add("fp32 master weights", 4.0 * ps, "P x 4 B" + per(z.optimizer), Lifetime::kStatic,
        opt_loc);
  }
  // optim.overlap_host_update, where the trainer runs it: the optimizer offloaded and, at stage
  // 0, the gradients on the host (true, or auto on a GPU); at stages 1-3 the gradient shards on
  // the host, i.e. a CPU run (true only: auto overlaps on a GPU). Each shard's master weights and
  // moments are copied aside before its update made during backward, to put back on a step that
  // clips (zero/overlapped_host_update.h, zero/overlapped_shard_update.h): 12 B per parameter of
  // the rank's optimizer shard, where the optimizer state lives.
  const std::string& overlap = c.optim.overlap_host_update;
  const bool overlapped =
      c.memory.offload_optimizer &&
      (z.stage == 0 ? c.memory.offload_gradients &&
                          (overlap == "true" || (overlap == "auto" && !on_cpu))
                    : on_cpu && overlap == "true");
  if (overlapped) {
    add("overlapped update's kept state", 12.0 * ps,
        "P x (4 B weights + 2 x 4 B moments)" + per(z.optimizer) + " (optim.overlap_host_update)",
        Lifetime::kStatic, opt_loc);
  }
  if (opt_loc == Location::kHost) {
    // 64 MiB each: two download buffers when the gradients are on the device, two for the
    // converted weights of bf16 parameters going back to it (stage 0).
    const int buffers = (grads_on_host ? 0 : 2) + (bf16 && z.stage == 0 ? 2 : 0);
    if (buffers > 0) {
      add("host update staging", buffers * 64.0 * 1024 * 1024,
          n(buffers) + " x 64 MiB (pinned; the host update's pieces)", Lifetime::kStatic,
          Location::kHost);
    }
  }

  // --- activations saved for backward ---
  // Per token and layer, what autograd keeps: two RMSNorms (norm bytes each, see
  // rms_norm_saved_bytes: 2h d + 4), Qwen3's q/k norms (qk_norm_saved_bytes), and in elements of
  // the model dtype q/k/v after the all-to-all qd + 2 kvd, attention output qd, o_proj input qd,
  // untiled MLP gate/up/silu/product 4 ffn. Qwen2's biases save nothing (at::linear with a bias
  // keeps the input and the weight, as without).
  const int64_t norm_bytes = rms_norm_saved_bytes(h, d);
  const int64_t qk_norm_bytes = qk_norm_saved_bytes(m, hd, d);
  const int64_t mlp_elems = tiled_mlp ? 0 : 4 * ffn;
  // Packed batches through SDPA build a dense document mask while bs x sl^2 is within
  // kDenseDocumentMaskElements (model/sdpa_attention.cpp).
  const double dense_mask = static_cast<double>(bs) * sl * sl;
  const bool dense_document_mask =
      ring == 1 && !math && c.data.pack && dense_mask <= kDenseDocumentMaskElements;
  // On CUDA, where SDPA's memory-efficient kernel runs (fp32, the efficient backend, a dense
  // mask), it refuses native GQA and K/V are expanded to the query heads: the attention keeps
  // K/V of qd each, and its backward makes their gradients at that size.
  const bool kv_expanded = !on_cpu && ring == 1 && !math && most.q > most.kv &&
                           (!bf16 || c.attention.backend == "efficient" || dense_document_mask);
  const int64_t kvd_attention = kv_expanded ? qd_a2a : kvd_a2a;
  const std::string kv_name =
      kv_expanded ? "2qd [K/V expanded for CUDA's efficient kernel]" : "2kvd";
  const int64_t layer_bytes =
      2 * norm_bytes + qk_norm_bytes + (3 * qd_a2a + 2 * kvd_attention + mlp_elems) * d;
  const std::string layer_formula =
      "(2 norm" + std::string(qk_norm_bytes > 0 ? " + qk norm" : "") + " + (3qd + " + kv_name +
      std::string(tiled_mlp ? "" : " + 4ffn") + ") x " + ds + ") x bs x T";
  const std::string norm_formula =
      " [norm = 2h x " + ds + " + 4 B per token" +
      (qk_norm_bytes > 0 ? "; qk norm = (hq + hkv) x (hd x " + ds + " + 4 B)" : std::string()) +
      "]";
  const double scale = k.activation_scale;
  // Math attention (model/attention_core.cpp) keeps the softmax probabilities [bs, hq/sp, sl, sl]
  // per layer, in fp32 whatever the model dtype (it computes in fp32 for fp16/bf16).
  // (Ring attention keeps none: it recomputes each pair of chunks in backward.)
  const double probs = math && ring == 1 ? static_cast<double>(bs) * most.q * sl * sl * 4 : 0.0;
  // The mask each layer's local attention keeps for its backward (none with a ring, which masks a
  // block of query rows at a time). Math: the bool mask masked_fill_ saves, [sl, sl] causal or,
  // packed, [bs, sl, sl]. Packed through SDPA while a dense mask serves (bs x sl^2 within
  // kDenseDocumentMaskElements): the bool mask [bs, 1, sl, sl] becomes SDPA's additive mask in
  // the model dtype, which its backward keeps; longer packed batches run each document on its own
  // (or the varlen flash kernel) and keep no mask.
  double layer_mask = 0;
  std::string layer_mask_formula;
  if (ring == 1 && math) {
    layer_mask = c.data.pack ? dense_mask : static_cast<double>(sl) * sl;
    layer_mask_formula = c.data.pack ? "bs x sl^2 x 1 B" : "sl^2 x 1 B";
  } else if (dense_document_mask) {
    layer_mask = dense_mask * d;
    layer_mask_formula = "bs x sl^2 x " + ds + " (SDPA's additive mask, dense while bs x sl^2 <= " +
                         n(kDenseDocumentMaskElements >> 20) + "Mi)";
  }
  // Backward of one layer adds its gradients: dq, dk, dv (qd + 2kvd), the hidden-state gradient
  // h, and for an untiled MLP the gate/up gradients 2 ffn; saved tensors are freed as it goes.
  const int64_t grad_elems = qd_a2a + 2 * kvd_attention + h + (tiled_mlp ? 0 : 2 * ffn);
  const std::string grad_formula = "(qd + " + std::string(kv_expanded ? "2qd" : "2kvd") + " + h" +
                                   std::string(tiled_mlp ? "" : " + 2ffn") + ") x bs x T x " + ds;
  if (checkpointing) {
    const int64_t checkpoint_bytes = tokens * h * d;  // one layer's input [bs, T, h]
    if (ckpt_loc == Location::kHost) {
      // One page-locked block per layer of its own size (memory/activation_offload.h), kept
      // from step to step.
      add("checkpoints (offloaded)",
          static_cast<double>(layers) * pinned_block_bytes(checkpoint_bytes),
          "L x bs x T x h x " + ds + " (page-locked blocks, whole pages)",
          Lifetime::kSaved, ckpt_loc);
    } else {
      add("checkpoints", static_cast<double>(layers) * checkpoint_bytes,
          "L x bs x T x h x " + ds, Lifetime::kSaved, ckpt_loc);
    }
    // Backward recomputes one layer at a time: its saved set (its attention mask included), then
    // its gradients.
    add("layer recompute",
        scale * (static_cast<double>(layer_bytes) * tokens +
                 static_cast<double>(grad_elems) * tokens * d + 2 * probs) +
            layer_mask,
        layer_formula + " + " + grad_formula + (probs > 0 ? " + 2 x probs" : "") +
            (layer_mask > 0 ? " + mask [" + layer_mask_formula + "]" : "") + norm_formula,
        Lifetime::kTransient);
  } else {
    add("activations", scale * (static_cast<double>(layers) * layer_bytes * tokens +
                                layers * probs),
        "L x " + layer_formula + (probs > 0 ? " + L x probs" : "") + norm_formula,
        Lifetime::kSaved);
    if (layer_mask > 0) {
      add("attention masks", layers * layer_mask,
          "L x " + layer_mask_formula + " (the mask each layer's attention keeps)",
          Lifetime::kSaved);
    }
    add("layer backward", scale * (static_cast<double>(grad_elems) * tokens * d + probs),
        grad_formula + (probs > 0 ? " + probs" : "") + " (gradients of one layer)",
        Lifetime::kTransient);
  }
  // Residual stream: embedding output and the hidden-state gradient, and the final RMSNorm's
  // saved set (its output included).
  add("residual stream", static_cast<double>(2 * h * d + norm_bytes) * tokens,
      "(2h x " + ds + " + norm) x bs x T" + norm_formula, Lifetime::kSaved);

  // --- working sets, one at a time ---
  if (tiled_mlp) {
    const int64_t tile = ceil_div(t, mlp_tiles(c));
    add("tiled MLP tile", scale * 6.0 * bs * tile * ffn * d,
        "6 ffn x bs x ceil(T / tiles) x " + ds + " (tile forward + backward)",
        Lifetime::kTransient);
  }
  const int64_t lt = loss_tiles(c);
  const double cast = bf16 ? 2.0 : 0.0;  // the GEMM's model-dtype logits before the fp32 upcast
  // The largest block of the loss's working set: one tile's fp32 logits [rows, V].
  double loss_block = 0;
  if (lt > 1) {
    const int64_t rows = ceil_div(tokens, lt);
    loss_block = 4.0 * rows * v;
    // Per tile (sp/tiled_logits_loss.cpp): the fp32 logits and their softmax, the logits freed once
    // the softmax exists; the logit gradient is the softmax corrected in place, and for bf16 its
    // bf16 copy takes the freed logits' place: 8 B per logit at once. Kept over the tiles: the
    // weight gradient summed in fp32 (with bf16, where the GEMM cannot add into the fp32 sum, each
    // tile's product a block of 8192 rows at a time) and the hidden gradient.
    const double grad_w = 4.0 * v * h + (bf16 ? 1.0 * std::min<int64_t>(v, 8192) * h * d : 0.0);
    add("loss tile", 8.0 * rows * v + grad_w + static_cast<double>(tokens) * h * d,
        "2 x 4 B x ceil(bs T / tiles) x V (fp32 logits, softmax) + fp32 grad W [V, h]" +
            std::string(bf16 ? " + a [8192, h] product block" : "") + " + grad hidden [bs T, h]",
        Lifetime::kTransient);
  } else {
    loss_block = 4.0 * tokens * v;
    // The plain loss through autograd (model/lm_loss.cpp): the fp32 upcast of the logits (for bf16
    // made from the GEMM's bf16 logits), the log-softmax autograd keeps, and in backward the NLL
    // and log-softmax gradients beside it: 12 B at once, and on CUDA the bf16 logits' block stays
    // reserved beside the three fp32 ones, which it is too small to hold.
    add("logits", (3.0 * 4 + cast) * tokens * v,
        "(3 x 4 B" + std::string(bf16 ? " + 2 B" : "") +
            ") x bs x T x V (fp32 logits, log-softmax, its gradient)",
        Lifetime::kTransient);
  }
  if (probs > 0) {
    add("attention scores", 2.0 * probs, "2 x bs x hq/sp x sl^2 x 4 B (math backend)",
        Lifetime::kTransient);
  }
  double ring_score_block = 0;  // one block of the ring's math path (none on the flash kernels)
  if (ring > 1) {
    // One layer's ring attention: the block's K/V and the next one arriving (d), their fp32
    // gradients travelling in backward (two), and the fp32 output / dq accumulators of the
    // block's queries (ring_attention.h).
    const double block_kv = static_cast<double>(tokens) * 2 * kvd_a2a;
    const double block_q = static_cast<double>(tokens) * qd_a2a;
    add("ring attention buffers", block_kv * (2.0 * d + 2 * 4.0) + block_q * 2 * 4.0,
        "bs x T x (2kvd x (2 x " + ds + " + 2 x 4 B) + qd x 2 x 4 B) (K/V blocks in flight, "
        "their fp32 gradients, fp32 accumulators)",
        Lifetime::kTransient);
    // Pairs of chunks run through the flash kernels, document-masked ones through the varlen
    // kernel (on CPU one flash call per document), and hold no scores: on CPU under every backend
    // but math; on CUDA with bf16, the flash or auto backend and a head size the kernels take
    // (a multiple of 8 up to 256; compute capability 8.0 or newer, which the model assumes).
    // Every other pair takes the math path: blocks of query rows [bs, hq/sp_a2a, rows, C] in fp32
    // with rows as many as fit kRingMathScoreBlockBytes (at least one, at most C), the backward
    // holding three blocks at once (scores, probabilities, their gradient), the forward two.
    const bool cuda_flash = bf16 && (c.attention.backend == "flash" ||
                                     c.attention.backend == "auto") &&
                            hd % 8 == 0 && hd <= 256;
    const bool math_pairs = math || (!on_cpu && !cuda_flash);
    if (math_pairs) {
      const int64_t chunk = a2a * t / 2;
      const int64_t row_bytes = bs * most.q * chunk * 4;
      const int64_t rows =
          std::clamp<int64_t>(kRingMathScoreBlockBytes / std::max<int64_t>(row_bytes, 1), 1,
                              std::max<int64_t>(chunk, 1));
      ring_score_block = static_cast<double>(rows) * row_bytes;
      add("ring score blocks", 3.0 * ring_score_block,
          "3 x bs x hq/sp_a2a x rows x C x 4 B, C = sl / (2 sp_ring) = " + n(chunk) + ", rows = " +
              n(rows) + " (min(C, " + n(kRingMathScoreBlockBytes >> 20) +
              " MiB / (bs x hq/sp_a2a x C x 4 B)); the ring's math path)",
          Lifetime::kTransient);
    }
  }
  if (sp > 1) {
    add("all-to-all buffers", 2.0 * tokens * (qd_a2a + 2 * kvd_a2a) * d,
        "2 x bs x T x (qd + 2kvd) x " + ds + " (send + receive)", Lifetime::kTransient);
  }

  // --- the optimizer step, after backward ---
  // The device AdamW (optim/adamw.cpp; not under optimizer offload, whose host pass works in
  // cache-sized chunks): on CUDA one fused kernel per tensor, no temporaries; elsewhere the ATen
  // ops over pieces of at most kOptimizerPieceElements, whose denominator keeps two fp32
  // temporaries of a piece at once.
  if (!c.memory.offload_optimizer) {
    if (c.train.device == "cuda") {
      add("optimizer step", 0.0, "0 (one fused AdamW kernel per tensor on CUDA)", Lifetime::kStep);
    } else {
      const int64_t piece =
          std::min(kOptimizerPieceElements, largest_update_numel(c, z.stage, world));
      add("optimizer step", 2.0 * piece * 4,
          "2 x min(" + n(kOptimizerPieceElements) +
              ", largest updated tensor) x 4 B (two fp32 temporaries of one piece)",
          Lifetime::kStep);
    }
  }

  // --- combine ---
  double stat = 0, saved = 0, transient = 0, step = 0, host = 0;
  double layer_transient = 0, loss_transient = 0;  // the largest of each kind
  std::string largest_step;
  for (const MemoryTerm& term : out.terms) {
    if (term.location == Location::kHost) {
      host += term.bytes;
      continue;
    }
    if (term.lifetime == Lifetime::kStatic) stat += term.bytes;
    if (term.lifetime == Lifetime::kSaved) saved += term.bytes;
    if (term.lifetime == Lifetime::kTransient) {
      const bool loss = term.name == "loss tile" || term.name == "logits";
      double& largest = loss ? loss_transient : layer_transient;
      largest = std::max(largest, static_cast<double>(term.bytes));
      if (term.bytes > transient) {
        transient = term.bytes;
        out.largest_transient = term.name;
      }
    }
    if (term.lifetime == Lifetime::kStep && term.bytes > step) {
      step = term.bytes;
      largest_step = term.name;
    }
  }
  // CUDA's caching allocator keeps every block it has handed out and serves a request only from a
  // free block at least as large. The layers' working sets (the forward's before the loss, the
  // recompute's of the step before) are made of blocks of at most layer_block: when the loss's
  // are larger, none of them can hold a loss block, so the reserved peak holds both working sets.
  // (On CPU large blocks go back to the system when freed: the larger working set alone.)
  const double layer_block =
      std::max({4.0 * tokens * std::max(h, qd_a2a), probs, ring_score_block});
  if (!on_cpu && loss_block > layer_block && layer_transient > 0 && loss_transient > 0) {
    add("cached layer blocks", std::min(layer_transient, loss_transient),
        "the smaller of the largest layer working set and the loss's (CUDA: the layers' blocks, "
        "at most fp32 [bs T, max(h, qd)], stay reserved beside the loss's larger ones)",
        Lifetime::kOverhead);
    transient += out.terms.back().bytes;
  }
  // Forward/backward holds the saved terms and one transient; the optimizer step comes after
  // backward has freed them.
  const double working = std::max(saved + transient, step);
  if (step > saved + transient) out.largest_transient = largest_step;
  const double dynamic = stat - k.runtime_bytes + working;
  const double overhead = k.allocator_fraction * dynamic;
  add("allocator overhead", overhead,
      "fraction x (static - runtime + max(saved + largest transient (+ cached layer blocks), "
      "optimizer step))",
      Lifetime::kOverhead);
  out.peak_bytes = static_cast<int64_t>(stat + working + overhead);
  out.host_bytes = static_cast<int64_t>(host);
  return out;
}

}  // namespace ulysses::costmodel
