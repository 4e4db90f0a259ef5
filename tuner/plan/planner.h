// `ulysses-tune plan` without the command line: meshes x memory features of one model on one
// hardware profile, each predicted by the cost model (tuner/costmodel/): peak memory per rank,
// host memory per node, step time, tokens/s per device, MFU, the longest sequence that fits, and
// what limits it (device memory, host memory for offloads, heads vs sp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"
#include "tuner/calibrate/hardware_profile.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/costmodel/time_model.h"
#include "tuner/results/calibrated_model.h"

namespace ulysses::plan {

// A set of memory features; Ulysses SP is always on (sp from the mesh).
struct FeatureSet {
  std::string name;  // "tiled+ckpt", or the --features text
  bool tiled_mlp = false, tiled_loss = false, checkpointing = false;
  bool offload_checkpoints = false, offload_optimizer = false;
  int64_t zero_stage = -1;  // 0-3 ("zero3" in the text), -1 = the request's zero_stage
  bool device_gradients = false;  // with offload_optimizer: memory.offload_gradients false
};

// The default sets, from none to all of ALST's: base, tiled, tiled+ckpt, tiled+ckpt-offload, alst.
std::vector<FeatureSet> default_feature_sets();

// Parses "tiled-mlp,tiled-loss,checkpoint,offload-checkpoints,offload-optimizer,
// device-gradients,zero<N>" (any subset, "alst" = the five memory features; device-gradients keeps
// the fp32 gradients on the device under optimizer offload, "none" = none, or a default set's name; zero0-zero3
// pick the ZeRO stage; "ulysses" and "bf16" are accepted and change nothing: SP is always on, the
// precision is --precision). Throws UserError("--features: unknown feature 'x'").
FeatureSet parse_features(const std::string& text);

struct PlanRequest {
  config::ModelOptions model;      // resolved (preset loaded, head_dim set or 0)
  calibrate::HardwareProfile hardware;
  int64_t world = 1;               // ranks (devices)
  int64_t seqlen = 0;              // 0 = --max-seqlen only
  int64_t micro_batch = 1;
  std::string precision;           // "" = bf16 on cuda, fp32 on cpu
  std::vector<FeatureSet> features;
  int64_t zero_stage = 0;          // zero.stage of sets that name none (0-3)
  costmodel::MemoryCoefficients memory;
  costmodel::TimeCoefficients time;  // used when time_calibrated, else time_coefficients()
  bool time_calibrated = false;      // per mesh
  int64_t max_search_tokens = int64_t{1} << 27;  // longest length tried by the search
  // mesh.uneven_heads in every row: an sp that does not divide the heads is a row too, charged
  // by the rank with the most heads (costmodel::a2a_heads).
  bool uneven_heads = false;
  // Also rows with ring attention: every sp_ring > 1 that divides sp and leaves an all-to-all
  // degree sp / sp_ring the heads allow (evenly, or unevenly with uneven_heads). Without it only
  // sp_ring 1 (all-to-all alone).
  bool ring = false;
};

// time_coefficients and memory_coefficients (the defaults of a hardware profile) are in
// results/calibrated_model.h.

struct PlanRow {
  int64_t dp = 1, sp = 1;
  int64_t sp_ring = 1;      // mesh.sp_ring: sp = sp / sp_ring all-to-all x sp_ring ring
  std::string features;
  int64_t zero_stage = 0;   // the ZeRO stage the row assumes: its feature set's, else --zero
  bool uneven_heads = false;  // sp splits the heads unevenly (PlanRequest::uneven_heads)
  bool valid = true;        // false: the mesh breaks a rule, or seqlen exceeds the model's
                            // sliding window (limit says which)
  std::string limit;        // "fits" | "device memory" | "host memory" | "heads vs sp: ..." |
                            // "model.sliding_window W: ..."
  int64_t seqlen = 0;       // the figures' length: --seqlen, else max_seqlen, else sp x 1024
  int64_t peak_bytes = 0;   // per rank at seqlen
  int64_t host_bytes_per_node = 0;
  double step_ms = 0, tokens_per_s_per_device = 0, mfu = 0;
  int64_t max_seqlen = 0;       // longest fitting length (multiple of sp x 1024); 0 = none fits
  std::string max_limit;        // what stops the length from growing (also
                                // "model.sliding_window W": no longer length is supported)
  // The largest model this row holds at its seqlen: the model's layers (same shapes) grown or
  // shrunk to the most that fit, and its parameters then; 0 when not one layer fits.
  int64_t max_layers = 0;
  int64_t max_parameters = 0;
};

// Usable bytes per rank: device memory minus 0.6 GiB for the CUDA context (CUDA), or the whole
// memory_gib (CPU). Host bytes per node: host_memory_gib.
int64_t usable_device_bytes(const calibrate::HardwareProfile& hw);

// Every valid-or-not mesh (dp x sp = world, sp dividing world) x every feature set, in that
// order (sp ascending). Throws UserError for world < 1 or micro_batch < 1.
std::vector<PlanRow> make_plan(const PlanRequest& r);

// The run config a row describes (validated against the world), for tests and --json. Its
// zero.stage is set after validation (a plan may describe a world the config validation would
// reduce to stage 0).
config::RunConfig row_config(const PlanRequest& r, int64_t sp, const FeatureSet& f,
                             int64_t seqlen, int64_t sp_ring = 1);

}  // namespace ulysses::plan
