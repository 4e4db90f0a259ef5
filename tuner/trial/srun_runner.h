// runner: srun: a trial as one SLURM job step inside the current allocation.
// The step command line, its environment and how its end maps to a trial status are pure
// functions here (tested without SLURM); SrunRunner runs the step under the supervisor.
#pragma once
#include <string>
#include <vector>

#include "tuner/launch/supervisor.h"
#include "tuner/trial/classify.h"
#include "tuner/trial/runner.h"

namespace ulysses::trial {

// Seconds past the step's time limit after which the runner stops srun itself: slurmctld checks
// time limits about every 30 s and then gives the tasks KillWait (30 s by default) to end.
inline constexpr double kSlurmLimitSlackS = 75.0;

struct SrunStep {
  std::string srun = "srun";  // srun's path
  int nnodes = 1;
  int ntasks = 1;             // REQUIRES: a multiple of nnodes
  double timeout_s = 0;       // the trial timeout; 0 = no --time
  std::string job_name = "ulysses-trial";
  std::string run_dir;        // task t's stdout / stderr: run_dir/rank-<t>.out / .err
  std::vector<std::string> command;  // the trainer's argv
  // The step's nodes (a slot of the sweep: nnodes of them); empty = SLURM chooses.
  std::vector<std::string> nodelist;
};

// The step's time limit in whole minutes (SLURM's unit): ceil(timeout_s / 60), 0 when no timeout.
int step_time_limit_min(double timeout_s);

// `srun --nodes N --ntasks T --ntasks-per-node T/N --kill-on-bad-exit=1 --quit-on-interrupt
// [--nodelist A,B --overlap] [--time M] --job-name NAME --output RUN_DIR/rank-%t.out
// --error RUN_DIR/rank-%t.err COMMAND...`
// With a node list the step runs on exactly those nodes; --overlap lets it start while an
// earlier step on them is still being cleaned up (SLURM 22.05 holds a step's resources a while
// after srun ends, and the sweep's own batch step shares the first node): the sweep never puts
// two trials on one node. Without --exact the step gets every CPU of its nodes, as a one-slot
// sweep's step does. Pure.
// REQUIRES: nnodes >= 1, ntasks a positive multiple of nnodes, command non-empty, nodelist
// empty or of nnodes names.
std::vector<std::string> srun_step_argv(const SrunStep& step);

// `base` ("K=V" entries) for the step: torchrun's rank variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_*) removed so that the ranks read SLURM's
// (SLURM_PROCID, SLURM_NTASKS, ...), MASTER_ADDR / MASTER_PORT set, and OMP_NUM_THREADS=1 added
// when tasks_per_node > 1 and base does not set it. Pure.
std::vector<std::string> srun_environment(std::vector<std::string> base,
                                          const std::string& master_addr, int master_port,
                                          int tasks_per_node);

// The first host of a SLURM node list ("node[07-10],x1" -> "node07"), as the ranks compute it
// (comm/dist_env.h). Throws UserError naming `variable` for a list it cannot read.
std::string first_host(const std::string& variable, const std::string& node_list);

// How each task ended, from srun's stderr ("srun: error: HOST: task 1: Exited with exit code 12",
// "...: tasks 0,2-3: Terminated"); index = task, tasks not named exited 0. Exit codes above 128
// count as a death from signal code - 128 (as the shell reports one). A signal counts as sent by
// us (signalled_by_us) when its task is reported after srun started terminating the step
// ("_step_signal: Terminating" or slurmstepd's "CANCELLED AT": kill-on-bad-exit stopping the
// rest, or a scancel); a task reported before that failed by itself, even from a signal (the
// kernel's OOM killer, a crash). Without such a line: when another task exited with a code in
// 1..128 or the step was cancelled. pid = `pid` for every named task (classify() needs > 0).
// Returns an empty vector when srun named no task. Pure.
std::vector<launch::ProcessExit> parse_srun_task_exits(const std::string& srun_stderr,
                                                       int ntasks, bool step_cancelled, int pid);

// The line of srun's stderr (or the tasks' messages) that says the step ended by a node failure
// ("srun: error: Node failure on n3", "*** STEP 5.2 ON n3 CANCELLED AT ... DUE TO NODE FAILURE
// ***", "NODE_FAIL", "Task launch for StepId=... failed on node n3: ..."), or "" when none does.
// backstop_timed_out: our own timeout stopped srun, i.e. SLURM did not end the step by its time
// limit plus kSlurmLimitSlackS: also a node failure ("srun did not end ..."). Pure.
std::string node_failure_line(const std::string& messages, bool backstop_timed_out,
                              double backstop_s);

// How the step ended by slurmstepd's own words ("*** STEP 12.3 ON n1 CANCELLED AT ... DUE TO
// TIME LIMIT ***") anywhere in `text`.
enum class StepEnd { kNormal, kTimeLimit, kCancelled };
StepEnd step_end(const std::string& text);

// The trial status of a step (the same statuses as classify() for local trials):
//   srun's own outcome ok / interrupted / timed out (our backstop) -> as classify();
//   step_end kTimeLimit -> timeout (exit_code 124, "step time limit of M min reached; ...");
//   kCancelled with no task failing on its own -> running ("step cancelled (scancel)"): the
//   sweep stops and --resume re-runs the trial;
//   otherwise the tasks' exits from srun's stderr go through classify(), so oom (12) wins over
//   a peer's comm failure (13) as it does locally; when srun named no task, srun's exit status
//   decides (12 oom, 124 timeout, a signal killed, else failed; error = srun's last line).
// `last_stderr_lines[t]` is task t's last non-empty stderr line. Pure.
Classification classify_step(const launch::SupervisionResult& srun, const std::string& srun_stderr,
                             StepEnd end, bool summary_readable,
                             const std::vector<std::string>& last_stderr_lines, double timeout_s,
                             int ntasks);

// Runs each trial as `srun_step_argv` under the supervisor (one process: srun, its stdout and
// stderr in run_dir/srun.out / srun.err), with our own timeout at the step's limit +
// kSlurmLimitSlackS as a backstop; SIGINT/SIGTERM are forwarded to srun, which forwards them to
// the tasks; a step still listed after srun was stopped is scancel'ed. A spec with a node list
// runs on those nodes, its ranks' MASTER_ADDR the first of them; a node failure
// (node_failure_line) is set on the outcome.
// Invariants: srun_ is an absolute path; job_id_ and master_addr_ come from the allocation.
class SrunRunner : public TrialRunner {
 public:
  // Throws UserError as make_trial_runner() documents.
  SrunRunner();
  TrialOutcome run(const TrialSpec& spec) override;
  std::string kind() const override { return "srun"; }

 private:
  void cancel_leftover_step(const std::string& job_name) const;

  std::string srun_, job_id_, master_addr_;
};

}  // namespace ulysses::trial
