// The run config of ulysses-train as plain structs, one per top-level YAML section. Defaults are
// written on the fields. Only src/config/ parses YAML into these; the rest of the code sees
// structs. Field names equal the YAML keys.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace ulysses::config {

// Shapes of a decoder of one of the supported families (model/family.h).
struct ModelOptions {
  std::string preset;               // name of profiles/models/<preset>.yaml, "" = inline fields
  // llama | qwen2 | qwen3 | mistral: what the family adds to the Llama block (q/k/v biases,
  // per-head q/k norms) and the HF layout its checkpoints are written in.
  std::string family = "llama";
  int64_t hidden_size = 256;        // h
  int64_t num_layers = 2;           // L
  int64_t num_heads = 8;            // hq
  int64_t num_kv_heads = 2;         // hkv; hq % hkv == 0
  int64_t head_dim = 0;             // hd; 0 = hidden_size / num_heads (resolved by validation)
  int64_t intermediate_size = 512;  // ffn
  int64_t vocab_size = 1024;        // V
  double rope_theta = 10000.0;
  // RoPE scaling, computed as transformers' modeling_rope_utils does: rope_scaling_type "" = none,
  // linear (inv_freq / factor), dynamic (NTK; only while positions stay below
  // max_position_embeddings, where transformers leaves the frequencies unscaled), yarn, llama3
  // (Llama 3.1). Each field names the types that read it.
  std::string rope_scaling_type;
  double rope_scaling_factor = 8.0;           // linear, dynamic, yarn, llama3
  double rope_low_freq_factor = 1.0;          // llama3
  double rope_high_freq_factor = 4.0;         // llama3
  int64_t rope_original_max_position = 8192;  // yarn, llama3: the pre-scaling context length
  double rope_attention_factor = 0.0;  // yarn: cos/sin multiplier; 0 = from factor and mscale
  double rope_beta_fast = 32.0;        // yarn: ramp boundary (rotations), extrapolated above
  double rope_beta_slow = 1.0;         // yarn: ramp boundary (rotations), interpolated below
  double rope_mscale = 0.0;            // yarn: with rope_mscale_all_dim (both != 0), the
  double rope_mscale_all_dim = 0.0;    // attention factor's numerator and denominator mscale
  bool rope_truncate = true;           // yarn: floor/ceil the ramp's correction range
  double rms_norm_eps = 1.0e-5;
  // Sliding-window attention span in tokens (Mistral's sliding_window); 0 = none. Not implemented:
  // validation refuses a window shorter than the sequence, where it would change attention.
  int64_t sliding_window = 0;
  bool tie_embeddings = false;
  uint64_t init_seed = 1234;
  double init_std = 0.02;           // normal(0, init_std) for every weight matrix
  // Written to a checkpoint's HF config.json (and read from one); training reads it only for
  // dynamic RoPE scaling.
  int64_t max_position_embeddings = 131072;
  int64_t bos_token_id = 1;         // 0 <= id < vocab_size
  int64_t eos_token_id = 2;         // 0 <= id < vocab_size
  std::string load;                 // HF model dir (config.json + *.safetensors), "" = random init
  // RMSNorm and SwiGLU through the fused CUDA kernels (src/kernels/) where the tensors
  // allow (CUDA, bf16/fp16, contiguous, supported sizes); the ATen ops otherwise. Needs
  // train.device cuda and a build with the kernels.
  bool fused_kernels = false;
};

// A count: N >= 1, or auto (= 0 here) resolved at run time (tile counts, mesh.sp_ring).
struct TileCount {
  int64_t value = 1;  // 0 means auto
  bool is_auto() const { return value == 0; }
};

// world = dp * sp. SP groups are contiguous ranks [i*sp, (i+1)*sp); DP groups are strided.
struct MeshOptions {
  int64_t sp = 1;
  int64_t dp = 1;
  // Allow an sp that does not divide the heads: each rank of an SP group takes a contiguous range
  // of ceil or floor(hq/sp) query heads (the first hq % sp ranks the ceil) and the KV heads those
  // use. false = sp must divide hq, and hkv % sp == 0 or sp % hkv == 0.
  bool uneven_heads = false;
  // How the SP group factors: sp = sp_a2a x sp_ring. The heads are exchanged all-to-all over
  // sp_a2a ranks (contiguous within the SP group); attention then runs as zig-zag ring attention
  // over the sp_ring groups of ranks that hold the same heads. 1 = all-to-all only; auto = the
  // largest sp_a2a the heads allow (evenly, or unevenly with uneven_heads). Must divide sp.
  TileCount sp_ring;
};

struct SequenceOptions {
  int64_t length = 4096;     // sl before padding to a multiple of sp
  int64_t micro_batch = 1;   // bs
  int64_t grad_accum = 1;
};

struct DataOptions {
  std::string source = "synthetic";  // synthetic | tokens:PATH | megatron:PREFIX
  uint64_t seed = 0;
  std::string token_dtype = "uint16";  // uint16 | uint32 (tokens:PATH only)
  bool pack = false;                   // pack documents with per-document position ids
  int64_t eod_token = -1;              // document separator for packing; -1 = none
  // windows: fixed windows of the token stream; documents: whole documents packed into each
  // sequence, padded (megatron:PREFIX sources; implies pack).
  std::string packing = "windows";
  std::string overlong = "truncate";  // documents longer than sequence.length: truncate | drop
  // PREFIX_loss_mask beside a megatron:PREFIX source: auto (read it when present) | require |
  // ignore (learn every token).
  std::string loss_mask = "auto";
};

struct MemoryOptions {
  TileCount tiled_mlp;
  TileCount tiled_loss;
  bool checkpointing = false;
  bool offload_activations = false;
  bool offload_optimizer = false;
  // With offload_optimizer at zero.stage 0: the fp32 gradient sums in host memory (true) or on
  // the device (false: the host update streams them in pieces).
  bool offload_gradients = true;
  std::string precision = "fp32";  // fp32 | bf16 | bf16-states
  double limit_gib = 0.0;          // per-rank cap; 0 = none
};

struct AttentionOptions {
  std::string backend = "auto";     // auto | math | flash | efficient | cudnn
  bool skip_all_but_last = false;   // debug: core attention only in the last layer
  bool disable_in_eval = false;     // evaluation bypasses SP
};

struct OptimOptions {
  double lr = 1.0e-3;
  std::array<double, 2> betas = {0.9, 0.95};
  double eps = 1.0e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;           // global L2 norm; 0 = off
  int64_t warmup_steps = 0;
  std::string schedule = "constant";  // constant | linear | cosine
  double min_lr = 0.0;
  // Steps whose grad_norm is not finite skip the update; this many in a row stop the run
  // (diverged). 0 = never stop.
  int64_t max_consecutive_skips = 5;
  // Threads of the host AdamW pass and gradient norm under memory.offload_optimizer. 0 = auto:
  // on a GPU the CPUs this process may run on divided among its node's ranks (the launcher's
  // local world size: torchrun, SLURM or Open MPI), on the CPU the intra-op threads (the host is
  // the device there).
  int64_t host_threads = 0;
  // With memory.offload_optimizer at zero.stage 0 (gradients on the host): each parameter's
  // host AdamW update runs while backward goes on, as soon as its gradient is final, with the clip
  // applied exactly at the end (redone from the kept state on steps that clip). "true", "false"
  // (the whole update after backward; the default: the kept state costs 12 bytes per parameter
  // of host memory) or "auto": true on a GPU, false on the CPU (where the host threads are the
  // ones backward runs on). Either way the same results bit for bit.
  std::string overlap_host_update = "false";
};

// ZeRO over the world group (all dp x sp ranks): 0 = every rank holds full optimizer state;
// 1 = optimizer states and fp32 masters sharded; 2 = also gradients (reduce-scatter per layer
// into shard-sized buffers); 3 = also the weights (gathered per layer when used). In a world of 1
// every stage is a no-op.
struct ZeroOptions {
  int64_t stage = 0;
  double bucket_mb = 128.0;  // size of one gradient reduce / weight gather, MiB (all stages)
};

struct TrainOptions {
  int64_t steps = 10;
  uint64_t seed = 0;
  std::string device = "cpu";  // cpu | cuda
};

struct CheckpointOptions {
  std::string dir;          // "" = no checkpoints
  int64_t every = 0;        // save every N steps (and at the end when dir is set); 0 = only at end
  bool save_initial = false;
  std::string resume;       // a step-<N> directory, or "latest" under dir
  bool overwrite = false;   // replace checkpoints in dir written by another run
};

struct ProfileOptions {
  int64_t warmup_steps = 1;  // steps excluded from summary medians
  bool nvtx = true;
  // Peak TFLOP/s of one rank's device for MFU in summary.json (e.g. from profiles/hardware/);
  // 0 = take $ULYSSES_PEAK_TFLOPS, and when that is unset MFU is not reported.
  double peak_tflops = 0.0;
};

struct OutputOptions {
  std::string dir = "runs/example";  // metrics.jsonl, summary.json
};

// Held-out evaluation.
struct EvalOptions {
  std::string source;  // "" = no evaluation; else a data source string like DataOptions::source
  uint64_t seed = 1;   // for synthetic eval data
  int64_t every = 0;   // evaluate every N steps (and after the last); 0 = only after the last
  int64_t steps = 1;   // eval batches per evaluation
};

// Distributed runtime (documented in README).
struct CommOptions {
  // Rendezvous: every rank must arrive, and the store answer, within this.
  double timeout_s = 300.0;
  // One collective: the backend aborts a collective that has not finished after this. NCCL counts
  // from when the collective is queued, which at long sequences can be minutes of compute queued
  // ahead of it; a dead peer is usually noticed sooner (a lost connection).
  double collective_timeout_s = 1800.0;
  std::string store = "tcp";    // tcp (MASTER_ADDR:MASTER_PORT) | file:PATH
  std::string backend = "auto";  // auto (gloo on cpu, nccl on cuda) | gloo | nccl
};

struct RunConfig {
  ModelOptions model;
  MeshOptions mesh;
  SequenceOptions sequence;
  DataOptions data;
  MemoryOptions memory;
  AttentionOptions attention;
  OptimOptions optim;
  ZeroOptions zero;
  TrainOptions train;
  CheckpointOptions checkpoint;
  ProfileOptions profile;
  OutputOptions output;
  EvalOptions eval;
  CommOptions comm;
};

}  // namespace ulysses::config
