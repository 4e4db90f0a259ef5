// The time model of one training step: work counted from the run config
// (FLOPs, all-to-all bytes, gradient all-reduce bytes, host-link bytes) and turned into
// milliseconds by throughputs, calibrated (costmodel/fit.h) or taken from a hardware profile.
#pragma once
#include <cstdint>
#include <string>

#include "config/options.h"

namespace ulysses::costmodel {

// Work of one optimizer step on one rank (micro_batch x grad_accum sequences of length sl).
struct StepWork {
  double matmul_flops = 0;     // forward + backward (+ recompute: checkpointing or ZeRO-3)
                               // GEMMs, incl. the LM head
  double attention_flops = 0;  // core attention (causal: half of QK^T and PV), fwd + bwd (+ rec)
  double a2a_bytes = 0;        // bytes this rank sends in Ulysses all-to-alls (0 at sp 1)
  // Ring attention (mesh.sp_ring R > 1): bytes this rank sends to its ring neighbour. Per layer,
  // with X = the K/V of its block (bs x T x sp_a2a x 2 kv heads x hd): forward (R - 1) X d,
  // backward (R - 1) X d for the blocks plus R X x 4 B for their fp32 gradients, and the forward
  // again when recomputing.
  double ring_bytes = 0;
  double allreduce_bytes = 0;  // ring all-reduce bytes of the fp32 gradients once per step
                               // (zero.stage 0, 1; 0 at world 1): 2 (w - 1) / w x 4 P
  // ZeRO (world w > 1, G = grad_accum micro-batches, d = bytes of the model dtype; units:
  // embedding E = V h, each layer, head H = h + V h; E + L layer + H = P without tied
  // embeddings):
  //   zero_reduce  stages 2-3: every unit's fp32 gradients reduce-scattered per micro-batch:
  //                G (w - 1) / w x 4 (E + L layer + H).
  //   zero_gather  stages 1-2: the updated shards all-gathered once per step in the parameters'
  //                dtype (zero/zero_optimizer.h): (w - 1) / w x d P. Stage 3, per micro-batch:
  //                the embedding and the layers for the forward, the head once, each layer again
  //                for its recompute + backward (one gather serves both):
  //                G (w - 1) / w x d (E + 2 L layer + H).
  double zero_reduce_bytes = 0;
  double zero_gather_bytes = 0;
  double offload_bytes = 0;    // checkpoints out + back, optimizer-offload gradients down (the
                               // transfers that run during forward and backward)
  // The offloaded optimizer on a GPU (memory.offload_optimizer), after backward, per rank
  // (P_r = the parameters this rank updates, d = bytes of the model dtype):
  //   optimizer_norm_bytes    the gradient-norm pass over the fp32 gradient sums: 4 P_r
  //   optimizer_host_bytes    the host AdamW pass: reads gradient, master, m, v (4 x 4 B), writes
  //                           master, m, v (3 x 4 B) and the weights in the model dtype (d):
  //                           (28 + d) P_r
  //   optimizer_upload_bytes  the updated weights host -> device (H2D): d P_r
  double optimizer_norm_bytes = 0, optimizer_host_bytes = 0, optimizer_upload_bytes = 0;
  int64_t host_threads = 0;    // optim.host_threads of the host pass; 0 = auto (as fitted)
  double model_flops = 0;      // 6 x N x tokens + attention, no recompute (for MFU)
  double tokens = 0;           // tokens this rank processes per step
};

StepWork step_work(const config::RunConfig& c);

// Throughputs of one rank and the constant cost per step; the fit's free coefficients are
// ms_per_tflop, ms_per_tflop_attention, ms_per_gb_a2a (= ms_per_gb_allreduce) and overhead_ms.
// The world group's collectives (all-reduce, ZeRO reduce-scatter and all-gather) all run at
// ms_per_gb_allreduce.
struct TimeCoefficients {
  double ms_per_tflop = 1.0;            // 1000 / achieved GEMM TFLOP/s
  double ms_per_tflop_attention = -1.0;  // 1000 / achieved attention TFLOP/s; < 0 = as GEMMs
  double ms_per_gb_a2a = 0.0;    // 1000 / all-to-all GB/s at this sp (0 = free)
  double ms_per_gb_ring = -1.0;  // 1000 / neighbour GB/s of the ring; < 0 = ms_per_gb_a2a
  double ms_per_gb_allreduce = 0.0;
  double ms_per_gb_offload = 0.0;  // 1000 / host-link GB/s
  double overlap = 0.0;          // fraction of communication + offload hidden behind compute
  // The offloaded optimizer: the norm and AdamW passes stream host memory at 1000 /
  // ms_per_gb_host GB/s with host_threads threads (0 = the threads of the trials it was fitted
  // on, unknown); with fewer threads they are that much slower (with more, the host's memory
  // bandwidth bounds them). The upload runs at ms_per_gb_upload (< 0 = ms_per_gb_offload).
  // optimizer_overlap: the fraction of the phase hidden behind backward (0: it runs after it).
  double ms_per_gb_host = 0.0;
  int64_t host_threads = 0;
  double ms_per_gb_upload = -1.0;
  double optimizer_overlap = 0.0;
  double overhead_ms = 0.0;      // per step: launches, optimizer, loader, synchronization
};

struct TimePrediction {
  double compute_ms = 0, a2a_ms = 0, allreduce_ms = 0, offload_ms = 0, overhead_ms = 0;
  double zero_reduce_ms = 0, zero_gather_ms = 0;
  // Ring attention's K/V pass, and the part of it the attention compute of the blocks does not
  // hide: max(0, ring - attention compute).
  double ring_ms = 0, ring_exposed_ms = 0;
  // The offloaded optimizer's phase: norm + host update + upload.
  double optimizer_norm_ms = 0, optimizer_update_ms = 0, optimizer_upload_ms = 0, optimizer_ms = 0;
  // compute + (1 - overlap) x (a2a + allreduce + zero_reduce + zero_gather + offload)
  //   + ring_exposed + (1 - optimizer_overlap) x optimizer + overhead
  double step_ms = 0;
};

TimePrediction predict_time(const StepWork& w, const TimeCoefficients& k);

// The offloaded optimizer's host passes before any calibration. Every rank of a node runs its
// pass at once, after its backward, so a rank streams its share of the node's host memory
// bandwidth: host_memory_gbps / ranks_on_node, at kHostPassEfficiency of that peak. The
// efficiency: the AdamW pass moves 44 B per 30 B that StepWork counts (each written cache line is
// read first: 16 B read + 2 x 14 B written), 0.68, and a streaming kernel reaches about 0.9 of
// the DDR peak. Returns ms per GB as StepWork counts it (ms_per_gb_host); 0 when the bandwidth is
// not > 0. REQUIRES: ranks_on_node >= 1.
inline constexpr double kHostPassEfficiency = 0.6;
double default_ms_per_gb_host(double host_memory_gbps, int64_t ranks_on_node);

}  // namespace ulysses::costmodel
