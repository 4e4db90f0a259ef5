// sbatch scripts and submission (see sbatch.h).
#include "tuner/launch/sbatch.h"

#include <c10/util/Exception.h>
#include <sys/wait.h>

#include <cstdio>
#include <regex>

#include "common/error.h"
#include "common/paths.h"
#include "tuner/launch/launch_plan.h"

namespace ulysses::launch {

std::string sbatch_script(const SbatchJob& job) {
  TORCH_CHECK(job.nodes >= 1 && job.ntasks_per_node >= 1 && !job.job_name.empty(),
              "sbatch_script: bad job shape");
  std::string text = "#!/usr/bin/env bash\n";
  for (const std::string& line : job.comments) text += "# " + line + "\n";
  text += "#SBATCH --job-name=" + job.job_name + "\n";
  text += "#SBATCH --nodes=" + std::to_string(job.nodes) + "\n";
  text += "#SBATCH --ntasks-per-node=" + std::to_string(job.ntasks_per_node) + "\n";
  if (job.gpus_per_node > 0) {
    text += "#SBATCH --gpus-per-node=" + std::to_string(job.gpus_per_node) + "\n";
  }
  if (job.time_limit_min > 0) text += "#SBATCH --time=" + std::to_string(job.time_limit_min) + "\n";
  if (!job.output.empty()) text += "#SBATCH --output=" + job.output + "\n";
  if (job.no_kill) text += "#SBATCH --no-kill\n";
  text += "set -euo pipefail\n";
  for (const std::string& line : job.body) text += line + "\n";
  return text;
}

std::optional<std::string> parse_sbatch_job_id(const std::string& sbatch_stdout) {
  static const std::regex kSubmitted(R"((?:Submitted batch job )?([0-9]+)(?:;\S*)?\s*$)");
  std::smatch m;
  if (!std::regex_search(sbatch_stdout, m, kSubmitted)) return std::nullopt;
  return m[1].str();
}

std::string submit_sbatch(const std::string& script_path) {
  const std::string sbatch = find_on_path("sbatch");
  if (sbatch.empty()) throw UserError("--submit: sbatch is not on PATH (run on a SLURM login node)");
  const std::string command =
      shell_quote(sbatch) + " --parsable " + shell_quote(script_path) + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw UserError("--submit: cannot run " + sbatch);
  std::string answer;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) answer += buffer;
  const int status = pclose(pipe);
  const std::optional<std::string> id = parse_sbatch_job_id(answer);
  if (status != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !id) {
    while (!answer.empty() && (answer.back() == '\n' || answer.back() == ' ')) answer.pop_back();
    throw UserError("--submit: sbatch refused " + script_path + ": " + answer);
  }
  return *id;
}

}  // namespace ulysses::launch
