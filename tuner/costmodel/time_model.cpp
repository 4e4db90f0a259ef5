// FLOPs and bytes of one step (see time_model.h). Per layer and token, forward: GEMMs
// 2 x (h qd + 2 h kvd0 + qd h + 3 h ffn) FLOPs (kvd0 = hkv hd, before replication); causal
// attention 2 x 2 x sl x qd / 2 per token of this rank (with an uneven head split, sp_a2a x the
// query heads of the rank with the most of them x hd, the rank that sets the step time; model_flops
// keeps the true qd); the LM head 2 x h x V. Ring attention (sp = sp_a2a x sp_ring) adds its K/V
// pass (ring_bytes). Backward costs twice the forward; checkpointing (and ZeRO-3, which always
// recomputes) recomputes every layer's forward once more, tiled MLP its MLP. Communication per
// ZeRO stage: see StepWork. The offloaded optimizer's phase on a GPU: its norm, host update and
// upload (StepWork), after backward.
// Family extras (Qwen2's q/k/v biases, Qwen3's q/k norms) add no FLOPs here, as in
// profile/flops.h (elementwise), but their parameters travel in every gradient and weight
// collective (parameter_count, layer_parameter_count).
#include "tuner/costmodel/time_model.h"

#include <algorithm>

#include "tuner/costmodel/memory_model.h"

namespace ulysses::costmodel {

StepWork step_work(const config::RunConfig& c) {
  const config::ModelOptions& m = c.model;
  const double sp = static_cast<double>(c.mesh.sp);
  const double world = static_cast<double>(c.mesh.dp * c.mesh.sp);
  // sp = sp_a2a x sp_ring: the heads split over sp_a2a ranks, the sequence over all sp.
  const int64_t ring_degree = ring_ranks(c);
  const int64_t a2a_degree = c.mesh.sp / ring_degree;
  const double a2a = static_cast<double>(a2a_degree), ring_size = static_cast<double>(ring_degree);
  const int64_t t_local = padded_length(c) / c.mesh.sp;
  const double sl = static_cast<double>(t_local) * sp;
  const double tokens = static_cast<double>(c.sequence.micro_batch * c.sequence.grad_accum) *
                        static_cast<double>(t_local);
  const double h = static_cast<double>(m.hidden_size), v = static_cast<double>(m.vocab_size);
  const double hd = static_cast<double>(m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_heads);
  const double qd = static_cast<double>(m.num_heads) * hd;
  const double kvd0 = static_cast<double>(m.num_kv_heads) * hd;
  // After the all-to-all, per local token: the heads of the rank with the most of them, x sp_a2a
  // (qd_a2a == qd and kvd = max(hkv, sp_a2a) hd when sp_a2a splits the heads evenly;
  // memory_model.h). A ring rank attends its block to the whole sequence, so the attention per
  // local token is that of the all-to-all alone.
  const sp::HeadLoad most = a2a_heads(m, a2a_degree);
  const double qd_a2a = a2a * static_cast<double>(most.q) * hd;
  const double kvd = a2a * static_cast<double>(most.kv) * hd;
  const double ffn = static_cast<double>(m.intermediate_size);
  const double layers = static_cast<double>(m.num_layers);
  const double d = static_cast<double>(dtype_bytes(c));
  const int64_t zero_stage = world > 1 ? c.zero.stage : 0;  // a world of 1 is stage 0
  // ZeRO-3 recomputes every layer in backward (memory/activation_checkpoint.h).
  const bool checkpointing =
      c.memory.checkpointing || c.memory.offload_activations || zero_stage == 3;
  const bool tiled_mlp = mlp_tiles(c) > 1;

  const double attn_gemm = 2 * (h * qd + 2 * h * kvd0 + qd * h);  // per token, forward
  const double mlp_gemm = 2 * 3 * h * ffn;
  const double core = 2 * 2 * sl * qd / 2;  // causal QK^T + PV per token (all heads, after a2a)
  // What the rank with the most heads computes: its step time (an uneven split's ceil(hq/sp)).
  const double core_charged = 2 * 2 * sl * qd_a2a / 2;
  const double head = 2 * h * v;

  StepWork w;
  w.tokens = tokens;
  const double fwd_layer_gemm = layers * (attn_gemm + mlp_gemm);
  double recompute_gemm = 0, recompute_core = 0;
  if (checkpointing) {
    recompute_gemm = fwd_layer_gemm, recompute_core = layers * core_charged;
  } else if (tiled_mlp) {
    recompute_gemm = layers * mlp_gemm;  // sequence_tiled_compute recomputes each tile
  }
  w.matmul_flops = tokens * (3 * (fwd_layer_gemm + head) + recompute_gemm);
  w.attention_flops = tokens * (3 * layers * core_charged + recompute_core);
  w.model_flops = tokens * (3 * (fwd_layer_gemm + head) + 3 * layers * core);
  if (a2a_degree > 1) {
    // q, k, v over and the output back in forward; their gradients in backward; again in the
    // recompute. A rank keeps 1/sp_a2a of what it sends.
    const double per_layer = tokens * (qd_a2a + 2 * kvd + qd_a2a) * d * (a2a - 1) / a2a;
    w.a2a_bytes = layers * per_layer * (2 + (checkpointing ? 1 : 0));
  }
  if (ring_degree > 1) {
    const double block_kv = tokens * 2 * kvd;  // elements of this rank's block's K and V
    const double forward = (ring_size - 1) * block_kv * d;
    const double backward = (ring_size - 1) * block_kv * d + ring_size * block_kv * 4.0;
    w.ring_bytes = layers * (forward * (checkpointing ? 2 : 1) + backward);
  }
  const double params = static_cast<double>(parameter_count(m));
  const double ring = (world - 1) / world;
  const double micro_batches = static_cast<double>(c.sequence.grad_accum);
  // ZeRO-2/3 units (zero/zero_partition.h): the embedding [V, h], each layer, and the head (final
  // norm + LM head, or the tied embedding gathered again for it).
  const double layer_params = static_cast<double>(layer_parameter_count(m));
  const double embedding_unit = v * h, head_unit = h + v * h;
  if (zero_stage <= 1 && world > 1) w.allreduce_bytes = 2 * ring * 4.0 * params;
  if (zero_stage >= 2) {
    // Every unit's fp32 gradients reduce-scattered once per micro-batch.
    w.zero_reduce_bytes =
        micro_batches * ring * 4.0 * (embedding_unit + layers * layer_params + head_unit);
  }
  // Stages 1-2: the updated shards all-gathered once per step in the parameters' dtype.
  if (zero_stage == 1 || zero_stage == 2) w.zero_gather_bytes = ring * d * params;
  if (zero_stage >= 3) {
    // Per micro-batch: the embedding and each layer for the forward, the head once for its
    // forward and backward, each layer again for its recompute and backward.
    w.zero_gather_bytes =
        micro_batches * ring * d * (embedding_unit + 2 * layers * layer_params + head_unit);
  }
  if (c.memory.offload_activations && c.train.device != "cpu") {
    w.offload_bytes += 2 * layers * tokens * h * d;
  }
  if (c.memory.offload_optimizer && c.train.device != "cpu") {
    // ZeRO-1+ ranks update their shard of the parameters.
    const double updated = zero_stage >= 1 ? params / world : params;
    w.offload_bytes += updated * 4;  // the fp32 gradient sums down, during backward
    w.optimizer_norm_bytes = updated * 4;
    w.optimizer_host_bytes = updated * (7 * 4 + d);
    w.optimizer_upload_bytes = updated * d;
    w.host_threads = c.optim.host_threads;
  }
  return w;
}

TimePrediction predict_time(const StepWork& w, const TimeCoefficients& k) {
  TimePrediction p;
  const double attention = k.ms_per_tflop_attention >= 0 ? k.ms_per_tflop_attention : k.ms_per_tflop;
  p.compute_ms = w.matmul_flops / 1e12 * k.ms_per_tflop + w.attention_flops / 1e12 * attention;
  p.a2a_ms = w.a2a_bytes / 1e9 * k.ms_per_gb_a2a;
  p.ring_ms = w.ring_bytes / 1e9 * (k.ms_per_gb_ring >= 0 ? k.ms_per_gb_ring : k.ms_per_gb_a2a);
  // Each block's transfer runs while the block before it computes.
  p.ring_exposed_ms = std::max(0.0, p.ring_ms - w.attention_flops / 1e12 * attention);
  p.allreduce_ms = w.allreduce_bytes / 1e9 * k.ms_per_gb_allreduce;
  p.offload_ms = w.offload_bytes / 1e9 * k.ms_per_gb_offload;
  p.zero_reduce_ms = w.zero_reduce_bytes / 1e9 * k.ms_per_gb_allreduce;
  p.zero_gather_ms = w.zero_gather_bytes / 1e9 * k.ms_per_gb_allreduce;
  // The host passes at the fitted thread count; fewer threads stream that much less.
  const double fewer_threads = w.host_threads > 0 && k.host_threads > w.host_threads
                                   ? static_cast<double>(k.host_threads) / w.host_threads
                                   : 1.0;
  p.optimizer_norm_ms = w.optimizer_norm_bytes / 1e9 * k.ms_per_gb_host * fewer_threads;
  p.optimizer_update_ms = w.optimizer_host_bytes / 1e9 * k.ms_per_gb_host * fewer_threads;
  p.optimizer_upload_ms = w.optimizer_upload_bytes / 1e9 *
                          (k.ms_per_gb_upload >= 0 ? k.ms_per_gb_upload : k.ms_per_gb_offload);
  p.optimizer_ms = p.optimizer_norm_ms + p.optimizer_update_ms + p.optimizer_upload_ms;
  p.overhead_ms = k.overhead_ms;
  p.step_ms = p.compute_ms +
              (1 - k.overlap) * (p.a2a_ms + p.allreduce_ms + p.zero_reduce_ms + p.zero_gather_ms +
                                 p.offload_ms) +
              p.ring_exposed_ms + (1 - k.optimizer_overlap) * p.optimizer_ms + p.overhead_ms;
  return p;
}

double default_ms_per_gb_host(double host_memory_gbps, int64_t ranks_on_node) {
  if (!(host_memory_gbps > 0)) return 0.0;
  const double ranks = static_cast<double>(std::max<int64_t>(1, ranks_on_node));
  const double per_rank = host_memory_gbps / ranks;
  return 1000.0 / (kHostPassEfficiency * per_rank);
}

}  // namespace ulysses::costmodel
