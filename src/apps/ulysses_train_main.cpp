// ulysses-train: one rank of a training job. Rank and world come from torchrun, SLURM or Open MPI
// variables (else a world of 1); see README.md.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>

#include "comm/dist_env.h"
#include "comm/exit_status.h"
#include "comm/mesh.h"
#include "common/build_info.h"
#include "common/error.h"
#include "config/field_docs.h"
#include "config/mesh_factors.h"
#include "config/run_config.h"
#include "memory/memory_limit.h"
#include "train/preflight.h"
#include "train/trainer.h"

namespace {

std::string join(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

// The run config, validated for the world, with its inputs checked (train/preflight.h). Every
// rank of a node reads the same files and checks the same things before meeting its peers, so
// only the node's first rank (rank 0 on one node) reports a bad input (thrown); the others get
// nullopt and exit kExitUsage without a word: one line per node, not one per rank.
std::optional<ulysses::config::RunConfig> checked_config(
    const ulysses::comm::DistEnv& env, const std::string& config_path,
    const std::vector<std::string>& overrides) {
  using namespace ulysses;
  try {
    config::RunConfig config = config::load_run_config(config_path, overrides);
    config::validate(config, env.world_size);
    train::check_run_inputs(config);
    return config;
  } catch (const UserError&) {
    if (env.local_rank == 0) throw;
    return std::nullopt;
  }
}

int run(const std::string& config_path, const std::vector<std::string>& overrides) {
  using namespace ulysses;
  const comm::DistEnv env = comm::detect_dist_env();
  const std::optional<config::RunConfig> checked = checked_config(env, config_path, overrides);
  if (!checked) return kExitUsage;
  const config::RunConfig& config = *checked;
  // Long tiled sequences fragment the caching allocator's fixed segments; expandable segments
  // (what ALST runs with) avoid most of it. Set before the allocator reads its settings, and
  // only when the user has not chosen.
  const bool default_alloc_conf =
      config.train.device == "cuda" && std::getenv("PYTORCH_CUDA_ALLOC_CONF") == nullptr;
  if (default_alloc_conf) setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", 0);
  const at::Device device = train::select_device(config, env);
  comm::DeviceMesh mesh = comm::DeviceMesh::create(
      env, config.mesh.dp, config.mesh.sp, config.comm, device,
      config::resolved_sp_ring(config.mesh, config.model.num_heads, config.model.num_kv_heads));
  // From here on a failing rank reports its cause and exits at once, before its process groups
  // are torn down (comm/exit_status.h: its peers then fail as a consequence of its own status).
  return comm::run_rank_or_exit([&] {
    std::cout << "ulysses-train: rank " << mesh.rank() << " of " << mesh.world().size() << " (dp "
              << mesh.dp_size() << " x sp " << mesh.sp_size() << "), sp group "
              << join(mesh.sp().global_ranks()) << ", dp group " << join(mesh.dp().global_ranks())
              << std::endl;
    // After the process groups (their threads belong to the baseline), before the model is built.
    if (default_alloc_conf && mesh.rank() == 0) {
      std::cout << "ulysses-train: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the default;"
                   " set the variable to choose another)" << std::endl;
    }
    const memory::MemoryLimit limit = memory::apply_memory_limit(config.memory.limit_gib, device);
    if (limit.limit_bytes > 0) std::cout << "ulysses-train: " << limit.describe() << std::endl;
    const int status = config.train.steps == 0 && config.eval.source.empty()
                           ? kExitOk
                           : train::run_training(config, mesh, device);
    mesh.finish();  // the final barrier; then the backends (NCCL communicators) shut down
    return status;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ulysses-train: one rank of a Ulysses sequence-parallel training job"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "run config YAML (see experiments/runs/)")
      ->required();
  app.add_option("--set", overrides, "override a key: --set memory.tiled_mlp=4 (repeatable)");
  app.set_version_flag("--version", ulysses::build_info("ulysses-train"),
                       "Print the version, LibTorch version and compiled-in backends");
  app.add_flag_callback(
      "--print-config-reference",
      [] {
        std::cout << ulysses::config::config_reference_markdown();
        throw CLI::Success();
      },
      "Print every run-config key with its type, default and meaning (docs/run-config.md)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? ulysses::kExitOk : ulysses::kExitUsage;
  }
  return ulysses::comm::run_with_exit_status([&] { return run(config_path, overrides); });
}
