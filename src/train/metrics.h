// Step metrics: rank 0 appends one JSON object per step to <output.dir>/metrics.jsonl
// and writes summary.json at the end (medians over the steps after profile.warmup_steps), with
// per-rank throughput, achieved model TFLOP/s and MFU (profile/flops.h).
#pragma once
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "profile/phase_timer.h"

namespace ulysses::train {

struct StepMetrics {
  int64_t step = 0;           // 1-based
  double loss = 0.0;          // forward loss of this step, before its update
  double grad_norm = 0.0;     // global L2 norm before clipping
  double lr = 0.0;
  int64_t tokens = 0;         // tokens processed by the whole job this step (padded)
  int64_t valid_tokens = 0;   // labels that counted in the loss
  double step_ms = 0.0;
  double tokens_per_s = 0.0;  // whole job
  int64_t peak_mem_bytes = 0;       // CUDA: the device footprint (DeviceMemory); else RSS peak
  int64_t peak_host_bytes = 0;
  std::map<std::string, double> phases;  // ms per phase (inclusive, profile/phase_timer.h)
  // Exclusive ms per category; their sum is the time inside timed scopes (<= step_ms).
  double compute_ms = 0.0;
  double comm_ms = 0.0;
  double offload_ms = 0.0;
  double optimizer_ms = 0.0;
  double comm_wait_ms = 0.0;  // comm the compute stream waited on (== comm_ms, phase_timer.h)
  double model_flops = 0.0;   // whole job, this step (profile::training_flops); 0 = unknown
  bool skipped = false;       // grad_norm was not finite: the optimizer did not step
  int64_t first_sample = 0;   // global index of the step's first sample (data position)

  // Copies the phases and category totals of `times`.
  void set_times(const profile::StepTimes& times);
};

// The largest metrics.jsonl a resumed run reads back: a step record is about 1 KiB, so this
// holds some 250 000 steps. A longer file is refused in one line, not read.
inline constexpr int64_t kMaxMetricsFileBytes = int64_t{256} << 20;  // 256 MiB

class MetricsWriter {
 public:
  // Creates `dir` and starts metrics.jsonl there. A fresh run (resumed_step 0) truncates it. A run
  // resumed after step `resumed_step` keeps the records of steps <= resumed_step already in the
  // file (the steps before the checkpoint, so the summary covers the whole run) and drops later
  // ones (they are trained again), then appends. Throws UserError when it cannot write, or when
  // the file to resume is over kMaxMetricsFileBytes (read_input_file's one-line error).
  MetricsWriter(const std::string& dir, int64_t warmup_steps, int64_t resumed_step = 0);

  // Step records kept from an earlier run by the constructor.
  int64_t kept_steps() const { return kept_steps_; }

  // Per-rank figures: each step's work is shared by `world_size` ranks; `peak_flops_per_rank`
  // (FLOP/s of one device, 0 = unknown) turns achieved FLOP/s into MFU. Defaults: 1 rank, 0.
  // REQUIRES: world_size >= 1, peak_flops_per_rank >= 0.
  void set_throughput_basis(int64_t world_size, double peak_flops_per_rank);

  // Appends one line to metrics.jsonl (flushed, so a killed run keeps what it did).
  void write_step(const StepMetrics& m);
  // Appends an evaluation record ({"eval": {...}}) to metrics.jsonl.
  void write_eval(const nlohmann::json& record);

  // Writes summary.json: medians of step_ms, tokens_per_s, phases and category times over the
  // steps after warmup (all steps when there are no others), tokens/s per rank, achieved model
  // TFLOP/s per rank and MFU (when model_flops and the peak are known), first and final loss,
  // skipped steps, peak memory, the start-up baseline it counts from ("memory_baseline_bytes",
  // memory::startup_baseline_bytes(), when recorded), plus `extra` fields. Kept records from
  // before a resume count.
  void write_summary(const nlohmann::json& extra) const;

 private:
  std::string dir_;
  int64_t warmup_steps_;
  int64_t world_size_ = 1;
  double peak_flops_per_rank_ = 0.0;
  std::ofstream metrics_;
  std::vector<StepMetrics> steps_;
  int64_t kept_steps_ = 0;
};

}  // namespace ulysses::train
