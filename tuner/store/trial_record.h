// The records of a sweep as the store keeps them (schema in migrations.cpp,
// version 2): one SweepRecord per `ulysses-tune sweep` and one TrialRecord per point of its space
// that the search ran, pruned, skipped or found invalid. One result schema, many printers
// (terminal tables, markdown, CSV, JSON): everything that reports on a sweep reads these.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ulysses::store {

// How a trial ended. Values are the strings stored in trials.status.
//   running  started, no result yet (a killed sweep leaves these; --resume re-runs them)
//   ok       every rank exited 0 and summary.json was read
//   oom      a rank exited 12 (out of memory)
//   failed   a rank exited with another non-zero status (13 = comm failure included)
//   timeout  the trial ran past its timeout and was stopped
//   killed   a rank died from a signal we did not send
//   pruned   not run: the memory model predicts it cannot fit (predicted_peak_bytes > limit)
//   invalid  not run: the configuration breaks a rule (reason says which)
//   skipped  not run: the search knows its outcome or that it cannot win (reason says why)
inline constexpr const char* kTrialStatuses[] = {"running", "ok",     "oom",     "failed", "timeout",
                                                 "killed",  "pruned", "invalid", "skipped"};

struct TrialRecord {
  int64_t id = 0;        // set by the store
  int64_t sweep_id = 0;
  std::string key;        // canonical point + length + probe flag; unique within a sweep
  std::string point = "{}";  // JSON object: axis key path -> value, e.g. {"mesh.sp": 2}
  std::string config_yaml;   // the full run config the ranks got (config::to_yaml)
  std::string config_json = "{}";
  int64_t seqlen = 0;
  bool probe = false;        // a memory probe run with attention.skip_all_but_last
  int64_t world_size = 1, dp = 1, sp = 1;
  std::string status = "running";
  std::optional<int64_t> exit_code;
  std::string error;     // the failing rank's last error line
  std::string reason;    // why pruned / invalid / skipped
  std::string started_at, finished_at;  // UTC ISO 8601; "" when not run
  std::optional<double> wall_s;
  std::string run_dir;
  // Measurements (set when status is ok; peak memory also for some failures).
  std::optional<double> step_ms;                // median after warmup
  std::optional<double> tokens_per_s;           // whole job
  std::optional<double> tokens_per_s_per_rank;  // = tokens_per_s / world_size
  std::optional<int64_t> peak_mem_bytes;        // max over ranks and steps
  std::optional<int64_t> peak_host_bytes;
  std::optional<double> final_loss;
  // The per-rank memory limit the trial ran (or was pruned) under; and the model's predictions.
  std::optional<int64_t> limit_bytes;
  std::optional<int64_t> predicted_peak_bytes;
  std::optional<double> predicted_step_ms;
  std::string summary = "{}";  // summary.json of the run, verbatim
  // The slot the trial ran on ("cores 0-0", "cuda 2,3", "nodes n1,n2"); "" (NULL) when the sweep
  // ran one slot, or the trial did not run. Schema version 6.
  std::string slot;
  // Set on a re-measure: the id of the trial it measured again with no other trial running.
  std::optional<int64_t> remeasure_of;

  bool ran() const { return exit_code.has_value(); }
};

// One measured step of a trial (table trial_steps).
struct TrialStep {
  int64_t step = 0;
  double loss = 0.0, grad_norm = 0.0, step_ms = 0.0, tokens_per_s = 0.0;
  int64_t peak_mem_bytes = 0;
};

// Median ms per step of one phase (a metrics.jsonl phase such as "a2a", "attention", "mlp",
// "loss", "grad_sync", "optimizer", "offload", or a category total "compute_ms", "comm_ms",
// "offload_ms", "optimizer_ms", "comm_wait_ms"), table trial_phases.
struct TrialPhase {
  std::string phase;
  double ms = 0.0;
};

// The machine's load while a trial ran (table trial_load): the 1-minute load average
// (/proc/loadavg) when the sweep started it and when it ended, and the machine's online cores.
struct TrialLoad {
  int64_t trial_id = 0;
  std::optional<double> start_load_1m, end_load_1m;  // nullopt: not readable
  int64_t cores = 0;                                 // 0: unknown
};

// Two trials whose runs overlapped in time (table trial_neighbours, both directions stored).
struct TrialNeighbour {
  int64_t trial_id = 0;
  int64_t neighbour_id = 0;
};

struct SweepRecord {
  int64_t id = 0;  // set by the store
  std::string name;
  std::string created_at, finished_at;
  std::string status = "running";  // running | finished | interrupted | failed (an error)
  std::string experiment_path, experiment_yaml;
  std::string search = "smart";  // smart | grid
  std::string objective = "throughput";
  std::string environment = "{}";  // JSON
  std::string summary = "{}";      // JSON: trials run / pruned / skipped, grid size, best trial
};

}  // namespace ulysses::store
