// Calibration of the cost model from measured trials: the memory model's runtime bytes
// and allocator fraction, and the time model's throughputs and per-step overhead, each a
// least-squares fit (fit.h) over trials whose config and measurement are given.
#pragma once
#include <string>
#include <vector>

#include "config/options.h"
#include "tuner/costmodel/fit.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/costmodel/time_model.h"

namespace ulysses::costmodel {

struct Measured {
  config::RunConfig config;  // validated
  double value = 0;          // peak bytes, or step milliseconds
};

// peak = runtime_bytes + (1 + allocator_fraction) x dynamic, dynamic = the model's peak with no
// runtime and no overhead. activation_scale stays 1. REQUIRES >= 2 trials (else UserError).
MemoryCoefficients fit_memory(const std::vector<Measured>& trials, LinearFit* fit = nullptr);

// Bytes of the fit's communication column: all-to-all + all-reduce + ZeRO reduce and gather.
double comm_bytes(const StepWork& w);

// step_ms = ms_per_tflop x GEMM TFLOP + ms_per_tflop_attention x attention TFLOP
//           + ms_per_gb x comm_bytes GB + overhead_ms
//           + (1 - optimizer_overlap) x (ms_per_gb_host x host-pass GB + upload ms)
// where the host-pass GB are the offloaded optimizer's norm and AdamW bytes (time_model.h) and
// the upload runs at base's ms_per_gb_upload (or ms_per_gb_offload) when base gives one, a known
// part of each step; otherwise ms_per_gb_upload is a column of its own.
// Columns that are zero in every trial (e.g. no communication at world 1, no offloaded optimizer)
// are left out and their coefficient set to 0; so is a column these trials cannot tell from the
// ones before it (trials of one shape do GEMM, attention and overhead work in the same
// proportions: GEMM alone then explains them), named in `inseparable` (kTimeColumns' names); and
// so is a coefficient the least-squares fit makes negative (that column is dropped and the rest
// refitted). host_threads becomes the optim.host_threads the offloaded trials share (0 = auto or
// mixed). Offload, overlap and optimizer_overlap keep their values from `base`, and so do
// ms_per_gb_host and host_threads when no trial offloaded its optimizer (nothing measured them).
// REQUIRES >= 1 trial (else UserError).
TimeCoefficients fit_time(const std::vector<Measured>& trials, const TimeCoefficients& base,
                          LinearFit* fit = nullptr,
                          std::vector<std::string>* inseparable = nullptr);

// The time fit's columns, in order: "GEMM", "attention", "communication", "overhead",
// "host optimizer pass", "upload".
inline constexpr int kTimeColumnCount = 6;
extern const char* const kTimeColumns[kTimeColumnCount];

}  // namespace ulysses::costmodel
