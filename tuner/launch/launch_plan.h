// What `ulysses-tune launch` does, as plain data: the options, the checks between them, each
// local rank's argv and environment, and the equivalent torchrun/srun command lines. No process
// is started here (see supervisor.h), so all of it is testable in-process.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "common/shell_quote.h"

namespace ulysses::config {
struct RunConfig;
}

namespace ulysses::launch {

// The options of `ulysses-tune launch` (CLI names in the comments).
// The rendezvous address when --master-addr is not given (ranks on this machine).
inline constexpr const char* kLocalMasterAddr = "127.0.0.1";

struct LaunchOptions {
  std::string config_path;             // RUN.yaml (positional)
  std::vector<std::string> overrides;  // --set key.path=value, in order
  int nproc = 1;                       // --nproc: ranks on this node
  int nnodes = 1;                      // --nnodes
  int node_rank = -1;                  // --node-rank; -1 = not given (0 when launching)
  std::string master_addr = kLocalMasterAddr;  // --master-addr
  int master_port = 0;                 // --master-port; 0 = not given
  std::string trainer;                 // --trainer; "" = ulysses-train beside ulysses-tune
  std::string print;                   // --print: "" (run), "torchrun" or "srun"
  double grace_s = 5.0;                // seconds between SIGTERM and SIGKILL when stopping ranks
};

// The port of the printed lines for several nodes without --master-port (torchrun's default).
inline constexpr int kDefaultPrintPort = 29500;

// Throws UserError naming the option when options are inconsistent: nproc/nnodes < 1, node rank
// outside [0, nnodes), a port outside [1, 65535], --master-port missing with nnodes > 1, an
// override without '=', an unknown --print tool, an empty master address.
void check_launch_options(const LaunchOptions& options);

// World size = nnodes * nproc. REQUIRES: check_launch_options passed.
int world_size(const LaunchOptions& options);

// The node rank used when launching: node_rank, or 0 when not given.
int effective_node_rank(const LaunchOptions& options);

// config::validate(config, world_size(options)), except that a mesh that does not fit the world
// is reported with what to set: UserError("mesh: dp*sp = 4 does not match the world size 16
// (--nnodes 2 x --nproc 8); add --set mesh.dp=4 (keeps mesh.sp=4)"), or, when keeping sp cannot
// work, the valid dp/sp pair with the largest sp. Other validation errors propagate unchanged.
void validate_for_launch(config::RunConfig& config, const LaunchOptions& options);

// The `--set mesh.dp=D [--set mesh.sp=S]` that makes `config`'s mesh fit `world` and pass
// config::validate (keeping mesh.sp when it can, else the largest sp that validates), or "" when
// the mesh already fits or nothing fits. Pure.
std::string mesh_fix(const config::RunConfig& config, int world);

// The trainer's arguments after its path: --config RUN.yaml [--set k=v]... (one --set per
// override).
std::vector<std::string> trainer_arguments(const LaunchOptions& options);

// The variables torchrun would set for local rank `local_rank` of this node: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT (= master_port), in that
// order, plus OMP_NUM_THREADS=1 when nproc > 1 and `base` does not set it (as torchrun does).
// REQUIRES: 0 <= local_rank < nproc; 1 <= master_port <= 65535.
std::vector<std::pair<std::string, std::string>> rank_variables(
    const LaunchOptions& options, int local_rank, int master_port,
    const std::vector<std::string>& base);

// base ("KEY=VALUE" entries) with every variable of `variables` set: replaced in place when
// present, appended otherwise.
std::vector<std::string> merge_environment(
    std::vector<std::string> base, const std::vector<std::pair<std::string, std::string>>& variables);

// The current process's environment as "KEY=VALUE" entries.
std::vector<std::string> current_environment();

// The equivalent cluster command lines, each ready to paste into a shell (arguments quoted when
// needed). "torchrun", one node without --master-port: `torchrun --standalone --nproc-per-node N
// --no-python TRAINER --config ...` (torchrun picks a free port and serves the store itself).
// Else one line per node (only node_rank's line when --node-rank was given), each
// `torchrun --nnodes M --nproc-per-node N --node-rank R --master-addr A --master-port P
// --no-python TRAINER --config ...`, preceded by a `# node R` comment line when nnodes > 1.
// "srun": one line, `[MASTER_ADDR=A] [MASTER_PORT=P] srun --nodes M --ntasks-per-node N
// --kill-on-bad-exit=1 TRAINER --config ...`. MASTER_ADDR only when --master-addr was given (not
// kLocalMasterAddr) and MASTER_PORT only when --master-port was: otherwise each rank takes the
// first host of SLURM_JOB_NODELIST and a port derived from SLURM_JOB_ID (comm/dist_env.h), which
// is right on every node of the allocation, where 127.0.0.1 is not.
// REQUIRES: check_launch_options passed and options.print is "torchrun" or "srun".
std::vector<std::string> cluster_command_lines(const LaunchOptions& options,
                                               const std::string& trainer_path);

}  // namespace ulysses::launch
