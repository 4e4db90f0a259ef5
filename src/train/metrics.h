// Step metrics (SPEC 5.7): rank 0 appends one JSON object per step to <output.dir>/metrics.jsonl
// and writes summary.json at the end (medians over the steps after profile.warmup_steps).
#pragma once
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
  int64_t peak_mem_bytes = 0;       // device peak on CUDA, else host RSS peak (this rank)
  int64_t peak_host_bytes = 0;
  std::map<std::string, double> phases;  // ms per phase
};

class MetricsWriter {
 public:
  // Creates `dir` and truncates metrics.jsonl there. Throws UserError when it cannot.
  MetricsWriter(const std::string& dir, int64_t warmup_steps);

  // Appends one line to metrics.jsonl (flushed, so a killed run keeps what it did).
  void write_step(const StepMetrics& m);
  // Appends an evaluation record ({"eval": {...}}) to metrics.jsonl.
  void write_eval(const nlohmann::json& record);

  // Writes summary.json: medians of step_ms, tokens_per_s and phases over the steps after
  // warmup (all steps when there are no others), final loss, peak memory, plus `extra` fields.
  void write_summary(const nlohmann::json& extra) const;

 private:
  std::string dir_;
  int64_t warmup_steps_;
  std::ofstream metrics_;
  std::vector<StepMetrics> steps_;
};

}  // namespace ulysses::train
