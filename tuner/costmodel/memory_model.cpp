// Lower-bound memory terms per rank (see memory_model.h). Shapes: bs = micro_batch,
// T = ceil(sl / sp) local tokens, h hidden, V vocab, L layers, P parameters.
#include "tuner/costmodel/memory_model.h"

namespace ulysses::costmodel {

int64_t MemoryEstimate::total_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : terms) total += t.bytes;
  return total;
}

int64_t parameter_count(const config::ModelOptions& m) {
  const int64_t h = m.hidden_size, hd = m.head_dim > 0 ? m.head_dim : h / m.num_heads;
  const int64_t attention = h * m.num_heads * hd        // q_proj
                            + 2 * h * m.num_kv_heads * hd  // k_proj, v_proj
                            + m.num_heads * hd * h;        // o_proj
  const int64_t mlp = 3 * h * m.intermediate_size;        // gate, up, down
  const int64_t layer = attention + mlp + 2 * h;          // + two RMSNorm weights
  const int64_t embeddings = m.vocab_size * h;
  return embeddings + m.num_layers * layer + h + (m.tie_embeddings ? 0 : embeddings);
}

MemoryEstimate lower_bound_peak(const config::RunConfig& c) {
  const bool on_cpu = c.train.device == "cpu";
  const bool bf16 = c.memory.precision == "bf16";
  const int64_t p = parameter_count(c.model);
  const int64_t weight_bytes = bf16 ? 2 : 4;
  const int64_t sp = c.mesh.sp, bs = c.sequence.micro_batch;
  const int64_t local_tokens = (c.sequence.length + sp - 1) / sp;
  const int64_t h = c.model.hidden_size, v = c.model.vocab_size;

  MemoryEstimate e;
  e.terms.push_back({"weights", p * weight_bytes, "P x " + std::to_string(weight_bytes) + " B"});
  // Gradients accumulate in fp32 buffers whatever the weights' dtype (train/grad_buffers.h).
  e.terms.push_back({"gradients", 4 * p, "P x 4 B (fp32 accumulation)"});
  // AdamW moments (and fp32 masters for bf16) live on this rank unless offloaded to a host that
  // is not this rank's memory (on CPU the host is the device).
  if (!c.memory.offload_optimizer || on_cpu) {
    e.terms.push_back({"adam moments", 8 * p, "P x 2 x 4 B"});
    if (bf16) e.terms.push_back({"fp32 master weights", 4 * p, "P x 4 B"});
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

}  // namespace ulysses::costmodel
