// Trial slots: the disjoint parts of what a sweep has (core sets of this machine, device sets of
// this node, node sets of a SLURM allocation) on which it runs independent trials at once. The
// split is a pure function of what the sweep has (tested without SLURM or GPUs); the probes of
// the machine are separate.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ulysses::trial {

// One slot. A one-slot sweep's only slot is empty: trials run as they always did (no pinning,
// no device or node list, the environment's threads).
struct Slot {
  std::string label;               // "cores 0-1", "cuda 2,3", "nodes n1,n2"; "" for one slot
  std::vector<int> cores;          // local: the CPUs its ranks are pinned to; empty = not pinned
  std::string cuda_devices;        // local on a GPU node: CUDA_VISIBLE_DEVICES; "" = not set
  std::vector<std::string> nodes;  // srun: the step's node list; empty = SLURM chooses
  int64_t threads_per_rank = 0;    // OMP_NUM_THREADS of each rank; 0 = not set
};

// What the sweep has to split.
struct SlotResources {
  std::vector<int> cores;                 // CPUs this process may run on (sched_getaffinity)
  std::vector<std::string> cuda_devices;  // local GPU ids (CUDA_VISIBLE_DEVICES, or nvidia-smi's)
  std::vector<std::string> nodes;         // srun: the allocation's hosts
};

// What a trial needs.
struct SlotNeeds {
  std::string runner = "local";  // local | srun
  std::string device = "cpu";    // cpu | cuda
  int64_t world_size = 1;        // ranks per trial
  int64_t nodes = 1;             // srun: nodes per trial
};

// The number of slots `requested` (0 = auto) resolves to: auto is allocation nodes / nodes for
// srun, devices / world_size on a GPU node (at least 1), and 1 on CPU (a trial gets every core).
int64_t resolve_slot_count(int64_t requested, const SlotNeeds& needs, const SlotResources& have);

// Splits `have` into `count` slots (resolve_slot_count's): srun, consecutive runs of `nodes`
// allocation nodes; local GPU, consecutive runs of world_size devices, each with an even share of
// the cores; CPU, the cores in `count` consecutive sets as even as they go (the larger first).
// threads_per_rank = the set's cores / world_size. count 1 gives the one empty slot.
// Throws UserError "slots: ..." when a slot cannot hold a trial: fewer nodes than `nodes`, fewer
// devices than world_size, fewer cores than ranks (and when count < 1).
std::vector<Slot> split_slots(int64_t count, const SlotNeeds& needs, const SlotResources& have);

// "cores 0-3" for a consecutive run, "cores 0,2,5" otherwise.
std::string cores_label(const std::vector<int>& cores);

// The host names of `scontrol show hostnames` output (one per line; blanks dropped).
std::vector<std::string> parse_hostnames(const std::string& scontrol_output);

// The CPUs this process may run on (sched_getaffinity), ascending; {0 .. online - 1} when it
// cannot be read.
std::vector<int> affinity_cores();

// This node's GPU ids: CUDA_VISIBLE_DEVICES's entries when set, else 0 .. n-1 for the n GPUs
// `nvidia-smi -L` lists; empty without either.
std::vector<std::string> local_cuda_devices();

// The allocation's hosts: `scontrol show hostnames $SLURM_JOB_NODELIST`; empty outside one.
std::vector<std::string> allocation_nodes();

}  // namespace ulysses::trial
