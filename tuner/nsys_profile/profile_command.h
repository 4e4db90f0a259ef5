// `ulysses-tune profile`: re-runs a trial (or any run config) under Nsight Systems with the
// training-step NVTX range as capture range, exports the report to SQLite and stores the
// kernel-time split (NCCL comm vs compute, their overlap; nsys_ingest.h) in the results
// database's `profiles` table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ulysses::nsys_profile {

// The options of `ulysses-tune profile` (CLI names in the comments).
struct ProfileOptions {
  std::string db_path = "results.db";    // --db
  int64_t trial_id = -1;                 // --trial ID (a trial stored by a sweep)
  std::string config_path;               // --config RUN.yaml (instead of --trial)
  std::vector<std::string> overrides;    // --set KEY=VALUE
  int nproc = 0;  // --nproc: ranks (ulysses-tune launch when > 1); 0: the trial's world, else 1
  std::string out_dir = "runs/profile";  // --out: report, export, run config, run output
  std::string nsys;                      // --nsys PATH; "" = $NSYS, else nsys on PATH
};

// Adds the subcommand; parsing writes into *options, which must outlive the parse.
CLI::App* add_profile_command(CLI::App& app, ProfileOptions* options);

// The nsys executable: `requested` if given, else $NSYS, else `nsys` found on PATH; "" when
// none is an executable file.
std::string find_nsys(const std::string& requested);

// The nsys command line that profiles `command` into <out_dir>/profile.nsys-rep: CUDA + NVTX
// tracing, capture from the first `step@ulysses` range to the end of the run.
std::vector<std::string> nsys_profile_command(const std::string& nsys, const std::string& out_dir,
                                              const std::vector<std::string>& command);

// Loads the run config (from the trial or --config) and validates it for nproc ranks, then
// requires nsys (UserError "nsys: ..." when it is not installed), runs the profile, exports
// SQLite, ingests it skipping profile.warmup_steps steps per rank, stores one `profiles` row and
// prints the split. Returns 0, or the status of the failing nsys command.
// Throws UserError for bad options, a trial the store does not have, a run config that does not
// validate, or an export without kernels.
int run_profile(const ProfileOptions& options);

}  // namespace ulysses::nsys_profile
