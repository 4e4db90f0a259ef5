// One trial of a sweep (runner: local): the real ulysses-train ranks of one
// configuration as supervised child processes with a timeout, then how it ended (classify.h) and
// what it measured (measurements.h), ready for the store (store/trial_record.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"
#include "tuner/trial/classify.h"
#include "tuner/trial/measurements.h"

namespace ulysses::trial {

struct TrialSpec {
  std::string run_dir;      // created (parents too); gets run.yaml and rank-<i>.out / .err logs
  std::string config_yaml;  // the full run config, written to run_dir/run.yaml; its output.dir
                            // must already be output_dir (the runner does not parse it)
  std::string output_dir;   // where ulysses-train writes metrics.jsonl / summary.json
  int nproc = 1;            // local ranks (= world size)
  double timeout_s = 0;     // 0 = none
  double grace_s = 5;       // SIGTERM -> SIGKILL when stopping ranks
  std::string trainer;      // path of ulysses-train (no PATH lookup; tests pass a fake script)
  std::vector<std::string> trainer_args;  // empty = {"--config", run_dir + "/run.yaml"}
  std::vector<std::string> extra_env;     // "K=V" added to each rank's environment
  int nnodes = 1;            // runner srun: nodes of the job step (nproc ranks spread evenly)
  std::string name;          // runner srun: the step's --job-name; "" = "ulysses-trial"
  // runner local: the CPUs the ranks run on (sched_setaffinity); empty = the caller's. The
  // calling thread takes this affinity while it starts the ranks (they inherit it) and gets its
  // own back before run_trial returns.
  std::vector<int> cpus;
  // runner srun: the nodes of the step (--nodelist; nnodes of them); empty = SLURM chooses.
  std::vector<std::string> nodelist;
};

struct TrialOutcome {
  // ok | oom | failed | timeout | killed (store::kTrialStatuses); "running" when the caller was
  // interrupted (SIGINT/SIGTERM): the ranks were stopped and the trial has no result.
  std::string status;
  std::optional<int64_t> exit_code;  // deciding rank's status (128 + signal); 0 ok; 124 timeout
  // One line: the deciding rank's last stderr line ("" for ok), then "; " and
  // Measurements::error when a measurement file was refused.
  std::string error;
  double wall_s = 0;                 // from starting the ranks until the last one was reaped
  int failed_rank = -1;              // the rank whose exit decided oom / failed / killed
  int interrupt_signal = 0;          // set iff status == "running"
  // runner srun: set when the step ended by a node failure (a node or its slurmstepd failed, a
  // task could not be launched on a node, or srun did not end by the step's time limit and
  // our backstop stopped it): the line that says so. The trial says nothing about its
  // configuration then, and the sweep takes the nodes out of use.
  std::string node_failure;
  // Measurements of rank 0 (measurements.h); also kept for failed trials (steps that ran).
  std::optional<double> step_ms, tokens_per_s, tokens_per_s_per_rank, final_loss;
  std::optional<int64_t> peak_mem_bytes, peak_host_bytes;
  std::string summary_json = "{}";
  std::vector<store::TrialStep> steps;
  std::vector<store::TrialPhase> phases;
};

// Runs the trial to its end and returns how it ended. Creates run_dir, writes run.yaml, removes
// a summary.json / metrics.jsonl left in output_dir by an earlier run, picks a free port and
// starts nproc ranks of `trainer trainer_args` with torchrun's variables as `ulysses-tune launch`
// sets them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR=127.0.0.1,
// MASTER_PORT; launch_plan.h) over this process's environment plus extra_env; rank i's stdout
// and stderr go to run_dir/rank-<i>.out / .err. Each rank is its own process group: a failing
// rank, the timeout or an interrupt stops every rank and whatever it started (SIGTERM, SIGKILL
// after grace_s); no process outlives the call.
// A failed trial is a result, not an error. Throws UserError when run_dir or run.yaml cannot be
// written, std::system_error when a log file cannot be opened or a process cannot be created.
// REQUIRES: nproc >= 1; run_dir, output_dir and trainer non-empty; timeout_s, grace_s >= 0;
// every extra_env entry holds '='; called as launch::supervise() requires: no other thread takes
// SIGINT, SIGTERM or SIGCHLD (a sweep with several slots blocks them in every thread and calls
// this from one thread per slot; each supervision polls its own children).
TrialOutcome run_trial(const TrialSpec& spec);

// The pieces every runner shares (srun_runner.cpp uses them too).
// Creates run_dir, writes run.yaml and removes summary.json / metrics.jsonl an earlier run left in
// output_dir. Throws UserError when run_dir or run.yaml cannot be written.
void prepare_run_dir(const TrialSpec& spec);
// The trainer's argv: trainer + trainer_args, or trainer --config run_dir/run.yaml.
std::vector<std::string> trainer_argv(const TrialSpec& spec);
// Rank i's log file: run_dir/rank-<i>.<stream> (stream "out" | "err").
std::string rank_log(const TrialSpec& spec, int rank, const char* stream);
// Sets the outcome's status, exit_code, error and failed_rank from `c` and its measurements
// (summary_json, steps, phases, ...) from `m` (read_measurements of output_dir); m.error, when
// set, is added to the error.
void fill_outcome(Classification c, Measurements m, TrialOutcome* outcome);

// Copies every field of the outcome that the record has: status, exit_code, error, wall_s and the
// measurements (summary_json -> summary). Steps and phases go to SweepStore::finish_trial.
void apply_outcome(const TrialOutcome& outcome, store::TrialRecord* record);

}  // namespace ulysses::trial
