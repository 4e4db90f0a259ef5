// SLURM batch scripts as plain data: what `ulysses-tune sweep --submit` submits
// and the launch.sbatch that `recommend` writes beside launch.sh; and submitting one with sbatch.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace ulysses::launch {

struct SbatchJob {
  std::string job_name;
  int nodes = 1;
  int ntasks_per_node = 1;
  int gpus_per_node = 0;              // --gpus-per-node; 0 = none asked (CPU jobs)
  int time_limit_min = 0;             // --time in minutes; 0 = the partition's default
  std::string output;                 // --output pattern ("%j" = job id); "" = SLURM's default
  bool no_kill = false;               // --no-kill: a failed node leaves the job (not ends it)
  std::vector<std::string> comments;  // "# " lines under the shebang, above the #SBATCH block
  std::vector<std::string> body;      // shell lines after the #SBATCH block, as written
};

// `#!/usr/bin/env bash`, the comments, `#SBATCH --job-name / --nodes / --ntasks-per-node /
// [--gpus-per-node] / [--time] / [--output] / [--no-kill]` lines, `set -euo pipefail`, then the body. Pure.
// REQUIRES: nodes >= 1, ntasks_per_node >= 1, job_name non-empty.
std::string sbatch_script(const SbatchJob& job);

// The job id in sbatch's answer: "Submitted batch job 123" or --parsable's "123[;cluster]";
// nullopt when there is none. Pure.
std::optional<std::string> parse_sbatch_job_id(const std::string& sbatch_stdout);

// Runs `sbatch --parsable SCRIPT` (sbatch found on PATH) and returns the job id. Throws
// UserError("--submit: ...") when sbatch is not on PATH or refuses the script (its message).
std::string submit_sbatch(const std::string& script_path);

}  // namespace ulysses::launch
