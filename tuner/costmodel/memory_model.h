// The memory model of one rank: every component the trainer holds, each
// with its formula (kept beside the bytes for reports), and how they combine into the peak.
// Two entry points:
//   lower_bound_peak  terms every configuration must hold at once; the sweep prunes with it (a
//                     lower bound never drops a configuration that would fit).
//   predict_memory    the full model: static state, saved activations, the largest transient
//                     working set (or the optimizer step's, when that is higher), the allocator's
//                     overhead and (CPU) the process baseline; on CPU it predicts the rank's peak
//                     RSS, on CUDA the caching allocator's reserved peak, which also holds the
//                     layers' cached blocks beside the loss's larger ones ("cached layer blocks").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"
#include "sp/head_split.h"

namespace ulysses::costmodel {

// When a component is alive, which decides how it adds up into the peak.
enum class Lifetime {
  kStatic,     // the whole step (runtime, weights, gradients, optimizer states)
  kSaved,      // from its layer's forward to its backward: all layers' add up at the loss
  kTransient,  // one working set at a time: the peak adds only the largest
  kStep,       // the optimizer step, after backward has freed the saved and transient terms:
               // the peak is the larger of (saved + largest transient) and the largest of these
  kOverhead,   // the allocator's share on top of the rest
};

enum class Location { kDevice, kHost };

struct MemoryTerm {
  std::string name;     // "weights", "gradients", ...
  int64_t bytes = 0;
  std::string formula;  // how it was computed, for reports
  Lifetime lifetime = Lifetime::kStatic;
  Location location = Location::kDevice;
};

struct MemoryEstimate {
  std::vector<MemoryTerm> terms;
  // Sum of every term (lower_bound_peak's terms all coexist).
  int64_t total_bytes() const;
};

// The few free coefficients of the memory model; calibrated (costmodel/fit.h) or defaults.
struct MemoryCoefficients {
  // CPU: resident bytes of a rank before its model exists (LibTorch, Gloo, OpenMP pool): part of
  // the measured peak RSS. CUDA: 0 (the allocator's peak excludes the CUDA context).
  double runtime_bytes = 0.0;
  // Allocator overhead: fraction of the dynamic (non-runtime) bytes lost to fragmentation and
  // rounding (glibc arenas on CPU, caching-allocator blocks on CUDA).
  double allocator_fraction = 0.05;
  // Scale on the saved + transient activation terms (1 = the hand counts below).
  double activation_scale = 1.0;
  // What-if knobs for comparing with other stacks (not this trainer's behaviour): bytes per
  // gradient element (this stack: 4, fp32 flat buffers) and the ranks weights, gradients and
  // optimizer states are sharded over at least (1 = as zero.stage says; see the ZeRO terms).
  int64_t gradient_bytes = 4;
  int64_t state_shards = 1;
};

// Coefficients before a sweep's own calibration. CPU: runtime 124 MiB and 7.8 % allocator
// overhead, fitted by `ulysses-tune plan --fit` on the quickstart sweep of the 2-core dev machine
// (reports/plan-vs-alst/quickstart-fit.txt). CUDA: 0 and 5 % (assumed, not yet measured).
MemoryCoefficients default_memory_coefficients(const std::string& device_type);

// Per-rank prediction. On CPU host memory is the device: every term is counted in peak_bytes.
struct MemoryPrediction {
  std::vector<MemoryTerm> terms;
  int64_t peak_bytes = 0;       // device peak (CPU: peak RSS incl. runtime_bytes)
  int64_t host_bytes = 0;       // host memory this rank holds on top (CUDA offloads); CPU: 0
  std::string largest_transient;  // name of the transient (or step term) that sets the peak
};

// Parameters of the model (embeddings, every layer, final norm, LM head unless tied): the
// numel summed over the named_parameters() of model::LlamaForCausalLM built from `m`.
// Throws UserError "model.family: ..." for a family config/model_family.h does not know.
int64_t parameter_count(const config::ModelOptions& m);
// Parameters of one decoder layer: attention (q/k/v/o projections, plus Qwen2's q/k/v biases
// (hq + 2 hkv) x hd and Qwen3's q_norm/k_norm weights 2 hd), MLP, two RMSNorm weights.
int64_t layer_parameter_count(const config::ModelOptions& m);

// ZeRO (zero.stage, over the world = dp x sp ranks; a world of 1 is stage 0) as the model counts
// it, per rank:
//   stage 1  AdamW moments and fp32 master weights / world (ZeroOptimizer keeps a flat fp32
//            master shard, even for fp32 parameters); gradients and weights whole.
//   stage 2  as stage 1 and, when kZero2ShardsGradientBuffer, the fp32 gradient buffer / world.
//   stage 3  also the gradients and the weights / world (an fp32 weight shard is its own
//            master unless the optimizer is offloaded off the device), plus the all-gathered
//            working set of the unit being computed and the next one, prefetched
//            (zero/zero_partition.h):
//            layer + max(layer, V x h) weights (the embedding or the head beside the first or
//            last layer), and at stages 2 and 3 the fp32 pending gradients of the
//            unit whose backward is running ([world x S_i] per parameter until its
//            reduce-scatter): max(layer, V x h) x 4 B.
// Stage 3 always recomputes each layer in backward (memory/activation_checkpoint.h), so the
// model counts it as memory.checkpointing.
// Stage 2 as built (zero/zero_partition.h) keeps only this rank's fp32 gradient shard; false
// models the earlier stage 2 that accumulated into the full buffer.
inline constexpr bool kZero2ShardsGradientBuffer = true;

// Elements of one piece of the device AdamW update off CUDA: the update's temporaries (two at a
// time, in the fp32 master dtype) are at most a piece each. Mirrors kDevicePiece in
// optim/adamw_aten.h (the trainer's value; change both together). On CUDA the update is one fused
// kernel with no temporaries.
inline constexpr int64_t kOptimizerPieceElements = int64_t{1} << 22;

// Ring attention's math path (sp/ring_attention.h): it holds scores for as many query rows at a
// time as fit in this many bytes, one block [bs, hq, rows, C] in fp32 (the compute dtype of
// fp32, fp16 and bf16 inputs). Mirrors kRingScoreBlockBytes (the trainer's value; change both
// together).
inline constexpr int64_t kRingMathScoreBlockBytes = int64_t{256} << 20;

// The largest dense packed-document mask local attention builds (bs x sl^2 elements): longer
// packed sequences run each document on its own. Mirrors kMaxDenseDocMaskBytes in
// model/sdpa_attention.h.
inline constexpr int64_t kDenseDocumentMaskElements = int64_t{64} << 20;

// Bytes a page-locked host block of `bytes` takes: its size rounded up to a 4 KiB page
// (common/pinned_host.h locks blocks of their own size; PyTorch's pinned allocator, which rounds
// up to a power of two, is not used). The offloaded activation checkpoints are such blocks, one
// per layer, and so are the optimizer's host buffers.
int64_t pinned_block_bytes(int64_t bytes);

// Lower bound of one rank's peak memory for a validated run config with world = dp * sp ranks,
// above the process's start-up baseline: only state the trainer certainly holds at once (the
// sweep prunes a configuration whose bound exceeds its limit, so it must never overshoot). On CPU (train.device cpu) host memory is the device:
// offloads move nothing out of it.
MemoryEstimate lower_bound_peak(const config::RunConfig& c);

// The full memory model for a validated run config (see the components in memory_model.cpp).
MemoryPrediction predict_memory(const config::RunConfig& c, const MemoryCoefficients& k);

// Tiles memory.tiled_mlp / tiled_loss resolve to for this config (the trainer's auto rules:
// sp/tiled_mlp.h, sp/tiled_logits_loss.h).
int64_t mlp_tiles(const config::RunConfig& c);
int64_t loss_tiles(const config::RunConfig& c);

// Bytes per element of the model dtype (memory.precision): 2 for bf16, 4 for fp32.
int64_t dtype_bytes(const config::RunConfig& c);

// mesh.sp_ring as the trainer resolves it (config/mesh_factors.h): 1 = all-to-all only.
int64_t ring_ranks(const config::RunConfig& c);
// sequence.length padded as the data loader pads it: to a multiple of sp, or of 2 sp with a ring.
int64_t padded_length(const config::RunConfig& c);

// The most query heads and KV heads one rank holds after the all-to-all at degree sp
// (sp::max_rank_heads): hq / sp and max(hkv, sp) / sp when sp splits the heads evenly, else the
// uneven split's largest (mesh.uneven_heads). Heads no mesh can split (sp > hq) count as
// ceil(hq / sp) and ceil(max(hkv, sp) / sp), so an invalid row still gets numbers.
sp::HeadLoad a2a_heads(const config::ModelOptions& m, int64_t sp);

}  // namespace ulysses::costmodel
