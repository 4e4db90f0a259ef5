// `ulysses-tune recommend` and `ulysses-tune export`.
//   recommend --db F [--sweep NAME] [--objective throughput|max-seqlen] [--trainer F]
//             [--no-check] --out DIR
//     DIR/recommended.yaml (runs as it is under `ulysses-tune launch`), ds_config.json,
//     arctic_training.yaml, accelerate_config.yaml, launch.sh (local, torchrun, srun lines),
//     WHY.md and numerics-check/ (the numerics check's run configs and runs). Warnings of the
//     exports go to stderr and into WHY.md.
//   export --db F --trial ID --format native|deepspeed|arctic|accelerate [--out FILE]
//     one trial's configuration in one format, to stdout or FILE; its output.dir is
//     runs/<sweep>-trial-<ID> (never the trial's run directory).
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace ulysses::recommend {

struct RecommendOptions {
  std::string db_path;    // --db (required)
  std::string sweep;      // --sweep; "" = the newest
  std::string objective;  // --objective; "" = the experiment's
  std::string out_dir;    // --out (required)
  std::string backend;    // --backend native|deepspeed: rank that backend's trials; "" = all
  std::string trainer;    // --trainer: ulysses-train of the numerics check; "" = beside us
  bool no_check = false;  // --no-check: recommend without the numerics check
};

struct ExportOptions {
  std::string db_path;
  int64_t trial_id = -1;
  std::string format = "native";
  std::string out_path;  // "" = stdout
  bool force = false;    // replace an existing out_path
};

CLI::App* add_recommend_command(CLI::App& app, RecommendOptions* options);
CLI::App* add_export_command(CLI::App& app, ExportOptions* options);

// Returns 0 after writing every file. Throws UserError, writing nothing, for a missing or
// corrupt database, an unknown sweep, or a sweep without a qualifying trial (the line says why:
// e.g. "no trial fits at 8192 tokens within the head-room").
// The numerics check (numerics_check.h) runs on the best candidate; one that fails it is not
// recommended (a line on stderr says why) and the next configuration in rank order is checked,
// up to kMaxCheckedCandidates; when none passes, returns 1 writing nothing but the checks' rows in
// the database. It does not run with --no-check, for a winner of the deepspeed backend, or for a
// sweep whose trials were not run by ulysses-train (WHY.md says why).
int run_recommend(const RecommendOptions& options);
inline constexpr int kMaxCheckedCandidates = 3;
// Returns 0. Throws UserError for a missing database, an unknown trial id, a trial that never
// ran (pruned, invalid, skipped: it has no run config), or an unwritable --out.
int run_export(const ExportOptions& options);

}  // namespace ulysses::recommend
