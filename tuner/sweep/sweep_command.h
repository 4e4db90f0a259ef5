// `ulysses-tune sweep EXPERIMENT.yaml [--db F] [--resume] [--dry-run] [--search grid|smart]
// [--runner local|srun] [--slots N|auto] [--submit]`: validates the experiment, explores its space
// with the search engine on real ulysses-train trials (local processes, or SLURM job steps with
// runner srun), several at once on disjoint slots when the experiment (or --slots) asks, stores
// every trial (SQLite) and prints progress and a summary; --submit hands the same sweep to sbatch
// instead.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace ulysses::sweep {

struct SweepOptions {
  std::string experiment_path;      // positional
  std::string db_path = "results.db";  // --db
  std::string name;                 // --name; default: the experiment's name (+ "-grid")
                                    // [A-Za-z0-9._-]+, not . or ..
  std::string method;               // --search smart|grid; "" = the experiment's
  std::string runs_dir;             // --runs-dir; default <db dir>/runs/<sweep name>
  std::string trainer;              // --trainer; default ulysses-train beside ulysses-tune
  int64_t max_trials = -1;          // --max-trials; -1 = the experiment's budget
  double wall_clock_s = -1;         // --wall-clock-s; -1 = the experiment's budget
  bool resume = false;              // --resume
  bool dry_run = false;             // --dry-run
  std::string runner;               // --runner local|srun; "" = the experiment's
  std::string slots;                // --slots N|auto; "" = the experiment's slots
  bool submit = false;              // --submit: write <runs dir>/sweep.sbatch and sbatch it
  std::string python;               // --python: the deepspeed backend's ranks; "" =
                                    // $ULYSSES_PYTHON, else python3
};

// Adds the `sweep` subcommand; parsing writes into *options (which must outlive the parse).
CLI::App* add_sweep_command(CLI::App& app, SweepOptions* options);

// Runs the sweep. Returns 0 when it finished (whatever its trials' statuses), kExitInterrupted
// when SIGINT/SIGTERM stopped it (the sweep is marked `interrupted`; --resume continues it).
// Throws UserError before anything runs or is written for a bad experiment, a sweep name that
// experiment::check_sweep_name refuses (the experiment's name or --name), a sweep name that
// exists without --resume, --resume without such a sweep, --resume with an experiment that
// differs from the one the sweep started with in anything that decides trial results
// (experiment/result_inputs.h: the error names the first key that differs; the budget's
// max_trials and wall_clock_s may change), or a database that is not one.
// --dry-run prints the space (each point valid or why not) and writes nothing.
// Slots (experiment key slots, --slots): a slot that cannot hold a trial is a UserError
// "slots: ..." before anything is written. With more than one, the best configuration is
// re-measured alone at the end (SweepHost::remeasure_best), counted among the runs; a sweep whose
// every slot failed (node failures) ends `failed` with a UserError.
// Runner srun needs a SLURM allocation (UserError before anything is written otherwise).
// --submit (runner srun only; needs no allocation: it runs on a login node) checks the experiment,
// then writes <runs dir>/sweep.sbatch (an allocation
// of the experiment's nodes (times its slots, when a number) x ranks per node running this sweep, --resume included, with
// absolute paths) and submits it; prints the job id, the database and the job's log. Throws
// UserError when sbatch is missing or refuses it. Returns 0 once submitted.
// REQUIRES: called from the main thread (trials are supervised child processes).
int run_sweep(const SweepOptions& options);

}  // namespace ulysses::sweep
