// Launch options checks, per-rank argv/environment, and torchrun/srun command lines.
#include "tuner/launch/launch_plan.h"

#include <unistd.h>

#include <c10/util/Exception.h>

#include "common/error.h"
#include "config/run_config.h"

extern char** environ;

namespace ulysses::launch {
namespace {

std::string join_quoted(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& word : words) {
    if (!line.empty()) line += ' ';
    line += shell_quote(word);
  }
  return line;
}

std::vector<std::string> trainer_command(const LaunchOptions& options,
                                         const std::string& trainer_path) {
  std::vector<std::string> words{trainer_path};
  for (auto& arg : trainer_arguments(options)) words.push_back(std::move(arg));
  return words;
}

}  // namespace

void check_launch_options(const LaunchOptions& options) {
  if (options.config_path.empty()) throw UserError("RUN.yaml: no run config given");
  if (options.nproc < 1) {
    throw UserError("--nproc: must be at least 1, got " + std::to_string(options.nproc));
  }
  if (options.nnodes < 1) {
    throw UserError("--nnodes: must be at least 1, got " + std::to_string(options.nnodes));
  }
  if (options.node_rank < -1 || options.node_rank >= options.nnodes) {
    throw UserError("--node-rank: " + std::to_string(options.node_rank) +
                    " is outside [0, " + std::to_string(options.nnodes) + ") for --nnodes " +
                    std::to_string(options.nnodes));
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    throw UserError("--master-port: " + std::to_string(options.master_port) +
                    " is outside [1, 65535]");
  }
  if (options.nnodes > 1 && options.master_port == 0 && options.print.empty()) {
    throw UserError("--master-port: required when --nnodes > 1 (every node must use the same port)");
  }
  if (options.master_addr.empty()) throw UserError("--master-addr: must not be empty");
  for (const auto& override_text : options.overrides) {
    if (override_text.find('=') == std::string::npos || override_text.front() == '=') {
      throw UserError("--set: expected key.path=value, got '" + override_text + "'");
    }
  }
  if (!options.print.empty() && options.print != "torchrun" && options.print != "srun") {
    throw UserError("--print: expected torchrun or srun, got '" + options.print + "'");
  }
  if (options.grace_s < 0) throw UserError("grace period: must not be negative");
}

int world_size(const LaunchOptions& options) { return options.nnodes * options.nproc; }

std::string mesh_fix(const config::RunConfig& config, int world) {
  if (config.mesh.dp * config.mesh.sp == world || world < 1) return "";
  const auto fits = [&](int64_t dp, int64_t sp) {
    config::RunConfig candidate = config;
    candidate.mesh.dp = dp;
    candidate.mesh.sp = sp;
    try {
      config::validate(candidate, world);
      return true;
    } catch (const UserError&) {
      return false;
    }
  };
  const int64_t sp = config.mesh.sp;
  if (sp >= 1 && world % sp == 0 && fits(world / sp, sp)) {
    return "--set mesh.dp=" + std::to_string(world / sp);
  }
  for (int64_t other_sp = world; other_sp >= 1; --other_sp) {
    if (world % other_sp == 0 && fits(world / other_sp, other_sp)) {
      return "--set mesh.dp=" + std::to_string(world / other_sp) +
             " --set mesh.sp=" + std::to_string(other_sp);
    }
  }
  return "";
}

void validate_for_launch(config::RunConfig& config, const LaunchOptions& options) {
  const int world = world_size(options);
  if (config.mesh.dp >= 1 && config.mesh.sp >= 1 && config.mesh.dp * config.mesh.sp != world) {
    const std::string fix = mesh_fix(config, world);
    std::string message = "mesh: dp*sp = " + std::to_string(config.mesh.dp * config.mesh.sp) +
                          " does not match the world size " + std::to_string(world) + " (";
    if (options.nnodes > 1) message += "--nnodes " + std::to_string(options.nnodes) + " x ";
    message += "--nproc " + std::to_string(options.nproc) + ")";
    if (fix.empty()) {
      message += "; no mesh.dp x mesh.sp of " + std::to_string(world) + " ranks fits this model";
    } else if (fix.find("mesh.sp") == std::string::npos) {
      message += "; add " + fix + " (keeps mesh.sp=" + std::to_string(config.mesh.sp) + ")";
    } else {
      message += "; add " + fix;
    }
    throw UserError(message);
  }
  config::validate(config, world);
}

int effective_node_rank(const LaunchOptions& options) {
  return options.node_rank < 0 ? 0 : options.node_rank;
}

std::vector<std::string> trainer_arguments(const LaunchOptions& options) {
  std::vector<std::string> args{"--config", options.config_path};
  for (const auto& override_text : options.overrides) {
    args.push_back("--set");
    args.push_back(override_text);
  }
  return args;
}

std::vector<std::pair<std::string, std::string>> rank_variables(
    const LaunchOptions& options, int local_rank, int master_port,
    const std::vector<std::string>& base) {
  TORCH_CHECK(local_rank >= 0 && local_rank < options.nproc, "local rank ", local_rank,
              " outside [0, ", options.nproc, ")");
  TORCH_CHECK(master_port >= 1 && master_port <= 65535, "bad master port ", master_port);
  const int node_rank = effective_node_rank(options);
  std::vector<std::pair<std::string, std::string>> variables{
      {"RANK", std::to_string(node_rank * options.nproc + local_rank)},
      {"WORLD_SIZE", std::to_string(world_size(options))},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
      {"GROUP_RANK", std::to_string(node_rank)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
  };
  bool has_omp = false;
  for (const auto& entry : base) has_omp = has_omp || entry.rfind("OMP_NUM_THREADS=", 0) == 0;
  if (options.nproc > 1 && !has_omp) variables.emplace_back("OMP_NUM_THREADS", "1");
  return variables;
}

std::vector<std::string> merge_environment(
    std::vector<std::string> base,
    const std::vector<std::pair<std::string, std::string>>& variables) {
  for (const auto& [key, value] : variables) {
    const std::string prefix = key + "=";
    bool replaced = false;
    for (auto& entry : base) {
      if (entry.rfind(prefix, 0) == 0) {
        entry = prefix + value;
        replaced = true;
      }
    }
    if (!replaced) base.push_back(prefix + value);
  }
  return base;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    entries.emplace_back(*entry);
  }
  return entries;
}

std::vector<std::string> cluster_command_lines(const LaunchOptions& options,
                                               const std::string& trainer_path) {
  const int port = options.master_port > 0 ? options.master_port : kDefaultPrintPort;
  const std::vector<std::string> trainer = trainer_command(options, trainer_path);
  std::vector<std::string> lines;
  if (options.print == "srun") {
    std::vector<std::string> words{"srun", "--nodes", std::to_string(options.nnodes),
                                   "--ntasks-per-node", std::to_string(options.nproc),
                                   "--kill-on-bad-exit=1"};
    words.insert(words.end(), trainer.begin(), trainer.end());
    std::string line;
    if (options.master_addr != kLocalMasterAddr) {
      line += "MASTER_ADDR=" + shell_quote(options.master_addr) + " ";
    }
    if (options.master_port > 0) line += "MASTER_PORT=" + std::to_string(options.master_port) + " ";
    lines.push_back(line + join_quoted(words));
    return lines;
  }
  TORCH_CHECK(options.print == "torchrun", "unknown cluster tool ", options.print);
  if (options.nnodes == 1 && options.master_port == 0) {
    std::vector<std::string> words{"torchrun", "--standalone", "--nproc-per-node",
                                   std::to_string(options.nproc), "--no-python"};
    words.insert(words.end(), trainer.begin(), trainer.end());
    lines.push_back(join_quoted(words));
    return lines;
  }
  const int first = options.node_rank < 0 ? 0 : options.node_rank;
  const int last = options.node_rank < 0 ? options.nnodes - 1 : options.node_rank;
  for (int node = first; node <= last; ++node) {
    std::vector<std::string> words{"torchrun",       "--nnodes",      std::to_string(options.nnodes),
                                   "--nproc-per-node", std::to_string(options.nproc),
                                   "--node-rank",    std::to_string(node),
                                   "--master-addr",  options.master_addr,
                                   "--master-port",  std::to_string(port),
                                   "--no-python"};
    words.insert(words.end(), trainer.begin(), trainer.end());
    if (options.nnodes > 1) lines.push_back("# node " + std::to_string(node));
    lines.push_back(join_quoted(words));
  }
  return lines;
}


}  // namespace ulysses::launch
