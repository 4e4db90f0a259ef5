// Experiment files: what a sweep explores, as data. A YAML file names the hardware and
// model profiles, the ranks per trial, a base run config, the space (run-config key paths ->
// value lists, plus the sequence length as a list or a max-length search), the objective, the
// budget and the trial length. load_experiment checks every key before anything runs.
//
//   name: quickstart-cpu
//   hardware: cpu-local            # profiles/hardware/<name>.yaml, or a path to one
//   model: tiny                    # profiles/models/<name>.yaml (model.preset), or omit and
//                                  # give base.model inline
//   world_size: 4                  # ranks per trial (alias: nproc); default: the hardware's
//   memory_limit_gib: 1.5          # per-rank limit of every trial; default: the smaller of
//                                  # the profile's memory_gib and what the device reports
//   base: {train: {device: cpu}}   # any run-config keys; the space overrides them
//   space:
//     mesh.sp: auto                # every sp that divides world_size and fits the heads
//                                  # for some choice of the space's mesh keys (with
//                                  # mesh.uneven_heads: true in base or [.., true] in the
//                                  # space, also the sp that split them unevenly; with
//                                  # mesh.sp_ring values, also those that need a ring); its
//                                  # points with the other choices are `invalid`
//     memory.tiled_mlp: [1, auto]
//     memory.offload: [none, activations, optimizer, both]   # shorthand for the two offloads
//     sequence.length: {search: max, from: 512, to: 8192, step: 512, curve: 3}   # or a list
//       (curve, optional: once a configuration's longest length is found, also measure it at
//       this many shorter lengths, 0 to 16)
//   objective: max-seqlen          # or throughput (tokens/s per rank at target_length)
//   target_length: 4096            # throughput only; default: the longest length listed
//   headroom: 0.1                  # recommend: peak memory <= (1 - headroom) * limit
//   budget: {max_trials: 60, wall_clock_s: 1800, trial_timeout_s: 300}
//   trial: {warmup_steps: 1, steps: 3}   # steps = measured steps after warmup
//   search: {method: smart, probe: true, prune: true}   # method: smart | grid
//   runner: local                  # or srun: each trial one SLURM job step inside the sweep's
//                                  # allocation (trial/srun_runner.h); default: the hardware's
//   nodes: 1                       # nodes per trial (srun); default: the hardware's nodes,
//                                  # at most ceil(world_size / devices_per_node)
//   slots: 1                       # trials run side by side, each on its own part of what the
//                                  # sweep has: local on CPU, a set of cores (each rank gets
//                                  # cores / world_size threads); local on a GPU node,
//                                  # world_size devices (CUDA_VISIBLE_DEVICES) and a share of
//                                  # the cores; srun, `nodes` nodes of the allocation. auto: as
//                                  # many as fit (devices / world_size, allocation nodes /
//                                  # nodes; 1 on CPU). Default 1; `sweep --slots N` overrides
//   isolation: offload_alone       # offload_alone: a trial that offloads the optimizer or
//                                  # activations to the host runs with no other trial on its
//                                  # node (they share its host memory, PCIe and cores);
//                                  # shared: no such rule; all_alone: every trial runs alone
//                                  # on its node. Node slots (srun) share nothing anyway
//   backend: native                # who trains each trial: native (ulysses-train), deepspeed
//                                  # (transformers + DeepSpeed, backends/deepspeed/), or a list
//                                  # of both: every configuration then runs on each (one
//                                  # the deepspeed backend cannot run, such as ring attention
//                                  # or an uneven head split, is `invalid` there, with the
//                                  # line its export refuses with)
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tuner/experiment/training_data.h"

namespace ulysses::experiment {

// One axis of the space as written: a run-config key path (or a shorthand such as
// memory.offload) and its values as YAML scalars in text form ("auto" for mesh.sp: auto).
struct AxisSpec {
  std::string key;
  std::vector<std::string> values;
};

// The sequence length: a list, or the longest fitting length on the lattice
// from, from + step, ..., <= to.
struct LengthSpec {
  bool search_max = false;
  std::vector<int64_t> values;  // the list, or the lattice when search_max
  int64_t curve = 0;  // search_max: also measure each configuration at this many shorter lengths
};

struct Budget {
  int64_t max_trials = 0;         // runs of ulysses-train (probes included); 0 = no limit
  double wall_clock_s = 0.0;      // 0 = no limit
  double trial_timeout_s = 600.0; // per trial
};

struct Experiment {
  std::string path;  // the file it was read from
  std::string yaml;  // its text
  std::string name;
  std::string description;
  std::string hardware;       // profile name or path, as written
  std::string hardware_path;  // resolved file
  std::string model;          // preset name, "" = base.model inline
  int64_t world_size = 0;     // resolved: written, or the hardware's
  double memory_limit_gib = 0.0;  // resolved: written, else the profile's device memory (the
                                  // sweep lowers it to what the machine reports)
  bool memory_limit_given = false;  // memory_limit_gib was written in the file
  std::string base_yaml;      // the base run config as a YAML document ("{}" when absent)
  std::vector<AxisSpec> axes; // in file order, sequence.length excluded
  LengthSpec lengths;
  std::string objective = "throughput";  // throughput | max-seqlen
  int64_t target_length = 0;  // throughput: resolved (written, or the longest listed)
  double headroom = 0.1;
  Budget budget;
  int64_t warmup_steps = 1;
  int64_t measured_steps = 2;
  std::string method = "smart";  // smart | grid
  bool probe = true;   // max-length search probes with attention.skip_all_but_last first
  bool prune = true;   // skip what the memory model says cannot fit
  std::string runner = "local";  // local | srun (trial/runner.h); default: the hardware's runner
  int64_t nodes = 1;             // nodes per trial; world_size is a multiple; 1 for local
  int64_t slots = 1;             // trials side by side (sweep/slots.h); 0 = auto
  std::string isolation = "offload_alone";  // offload_alone | shared | all_alone
  std::string device = "cpu";  // base.train.device: cpu | cuda
  // What base.data.source names, read once at parse (training_data.h): its digest goes with the
  // sweep, its description into the sweep's environment.
  TrainingData data;
  // native | deepspeed, in file order; more than {native} makes `backend` an axis of the space.
  std::vector<std::string> backends = {"native"};
};

// profiles/ of the project home (common/paths.h), where profile names are looked up.
std::string default_profiles_dir();

// Reads and checks an experiment file. Profiles are looked up under `profiles_dir`
// (profiles/hardware/<name>.yaml, profiles/models/<name>.yaml) unless given as paths.
// Throws UserError "<file>: <key>: <what is wrong>" for a missing file, a file over the YAML size
// limit (config/yaml_reader.h), invalid YAML, a name check_sweep_name refuses, an unknown
// or duplicate key, a wrong type, an empty space or empty value list, a missing profile, a bad
// length spec (from > to, step < 1), an unknown objective, method, runner or backend, a budget
// below zero, nodes < 1, not dividing world_size, or > 1 with runner: local, slots neither a
// whole number >= 1 nor auto, an unknown isolation, memory probes
// (search.probe with a max-length search) with backend deepspeed, or a base.data.source /
// base.eval.source whose files are missing or unreadable. Relative paths in those two are looked
// up in the working directory, then beside the experiment, and written into base_yaml as
// absolute paths (trials run in their own directories).
Experiment load_experiment(const std::string& path, const std::string& profiles_dir);

// load_experiment on text; `source` names it in errors.
Experiment parse_experiment(const std::string& text, const std::string& source,
                            const std::string& profiles_dir);

// The slots key's value (experiment `slots:`, `sweep --slots`): a whole number >= 1, or auto
// (returned as 0). Throws UserError "<field>: expected a whole number >= 1 or auto, got '...'".
int64_t parse_slots(const std::string& field, const std::string& text);

// Sweep names (an experiment's `name`, `sweep --name`) become paths (runs/<name>) and go into
// generated scripts, so they are one or more of A-Z a-z 0-9 . _ - and neither "." nor "..".
// Throws UserError "<field>: ..." otherwise (one line: the value is shown with its control
// characters escaped).
void check_sweep_name(const std::string& field, const std::string& name);

}  // namespace ulysses::experiment
