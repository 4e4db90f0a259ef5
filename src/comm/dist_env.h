// Where this process sits in a distributed job: rank, world, local rank and the rendezvous
// address, read from the launcher's environment (torchrun, SLURM srun, Open MPI mpirun).
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace ulysses::comm {

struct DistEnv {
  int rank = 0;  // 0 <= rank < world_size
  int world_size = 1;
  int local_rank = 0;                     // index on this node; picks cuda:<local_rank>
  int local_world_size = 1;               // ranks on this node
  std::string master_addr = "127.0.0.1";  // host of rank 0's TCPStore
  int master_port = 29500;
  std::string source = "single";  // torchrun | slurm | openmpi | single | test
  // torchrun's agent already serves the TCPStore at master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 included, joins it as a client.
  bool agent_store = false;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: keys of each attempt are kept apart
};

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (std::getenv).
std::optional<std::string> process_env(const std::string& name);

// An environment made of `vars` only (for tests and for launchers building a child's view).
EnvLookup env_from_map(std::map<std::string, std::string> vars);

// Reads, in order of precedence:
//   torchrun  RANK, WORLD_SIZE (both required when either is set), LOCAL_RANK, LOCAL_WORLD_SIZE,
//             MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE ("True" sets agent_store),
//             TORCHELASTIC_RESTART_COUNT
//   SLURM     SLURM_PROCID (selects SLURM), SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//             SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE ("4", "4(x2)", "4(x2),3");
//             master: MASTER_ADDR, else the first host of SLURM_JOB_NODELIST / SLURM_NODELIST
//             ("node7", "node[07-10,12]", "a[1-2],b3"); port: MASTER_PORT, else
//             20000 + SLURM_JOB_ID % 10000, else 29500
//   Open MPI  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//             OMPI_COMM_WORLD_LOCAL_SIZE; master from MASTER_ADDR / MASTER_PORT or the defaults
//   else      a world of 1 (source "single").
// Missing local values default to local_world_size = world_size, local_rank = rank %
// local_world_size.
// Throws ulysses::UserError("<VARIABLE>: <what is wrong>") on a malformed value: not an integer,
// rank < 0 or >= world, world < 1, local rank outside the local world, port outside 1..65535,
// empty MASTER_ADDR, an unparsable SLURM task or node list.
DistEnv detect_dist_env(const EnvLookup& lookup = process_env);

// One line, e.g. "rank 3 of 4 (local 1 of 2, torchrun), master 10.0.0.1:29500" (with
// " (agent store)" appended when agent_store).
std::string describe(const DistEnv& env);

}  // namespace ulysses::comm
