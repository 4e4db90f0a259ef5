// Building DeepSpeed's ops once before a sweep's trials (see deepspeed_ops.h).
#include "tuner/backends/deepspeed/deepspeed_ops.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/paths.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/supervisor.h"

namespace ulysses::backends {
namespace {

namespace fs = std::filesystem;

// A new private directory for the preparer's result and log (mkdtemp under $TMPDIR or /tmp).
std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = (fs::path(tmp && *tmp ? tmp : "/tmp") / "ulysses-ds-ops-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    throw UserError("TMPDIR: cannot create a directory for DeepSpeed's op build under " +
                    fs::path(pattern).parent_path().string());
  }
  return pattern;
}

}  // namespace

std::string deepspeed_ops_script() {
  const std::string home = project_home();
  return (fs::path(home.empty() ? "." : home) / "tuner" / "backends" / "deepspeed" / "ds_ops.py")
      .string();
}

PreparedOps prepare_deepspeed_ops(const std::string& python, const std::string& device) {
  const std::string temp = make_temp_dir();
  const std::string result_path = temp + "/result.json";
  const std::string log_path = temp + "/build.log";
  launch::ProcessSpec spec({python, deepspeed_ops_script(), "prepare", "--device", device,
                            "--result", result_path, "--log", log_path},
                           launch::current_environment());
  spec.stderr_path = log_path;  // until ds_ops.py sends its own output there; stdout: progress
  launch::SupervisorOptions options;  // no timeout: a first build can take minutes
  const launch::SupervisionResult run = launch::supervise({spec}, options);
  std::error_code ignored;
  if (run.outcome == launch::Outcome::kInterrupted) {
    std::fflush(stdout);
    std::fprintf(stderr, "deepspeed backend: interrupted (signal %d) while preparing DeepSpeed's "
                 "ops; no trial ran\n", run.interrupt_signal);
    fs::remove_all(temp, ignored);
    std::exit(kExitInterrupted);
  }

  nlohmann::json result;
  std::ifstream in(result_path);
  if (in) result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const std::string status = result.is_object() ? result.value("status", "") : "";
  if (status == "ok") {
    PreparedOps ops;
    ops.extensions_dir = result.value("extensions_dir", "");
    ops.ops = result.value("ops", std::vector<std::string>{});
    ops.seconds = result.value("seconds", 0.0);
    fs::remove_all(temp, ignored);
    // The trials inherit both: they import the ops from the directory they were built in, as
    // they are (ds_ops.py load_trial_ops).
    if (!ops.extensions_dir.empty()) {
      setenv("TORCH_EXTENSIONS_DIR", ops.extensions_dir.c_str(), 1);
      setenv("ULYSSES_DEEPSPEED_OPS_DIR", ops.extensions_dir.c_str(), 1);
    }
    return ops;
  }
  if (status == "stale_lock") {
    fs::remove_all(temp, ignored);
    throw UserError(result.value("message", "deepspeed backend: a stale build lock"));
  }
  const std::string why =
      status == "failed" ? result.value("message", "")
                         : "ds_ops.py " + (run.first_failure ? launch::describe_exit(*run.first_failure)
                                                             : std::string("wrote no result"));
  throw UserError("deepspeed backend: building DeepSpeed's ops failed: " + why +
                  " (the build's output: " + log_path + ")");
}

}  // namespace ulysses::backends
