// A run config as a Hugging Face Accelerate config file (accelerate 1.15, `accelerate launch
// --config_file FILE train.py`): DeepSpeed with our ds_config.json plus the ParallelismConfig of
// DeepSpeed's Ulysses SP.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::exports {

// An Accelerate config and what it cannot say.
struct AccelerateExport {
  std::string yaml;                   // the config file, a YAML document with comments
  std::vector<std::string> warnings;  // one line each, "<run config key(s)>: <what>"
};

// The Accelerate config of `run`, keys as accelerate's ClusterConfig and its launcher read them
// (accelerate/commands/config/config_args.py, commands/launch.py, parallelism_config.py):
//   compute_environment: LOCAL_MACHINE, distributed_type: DEEPSPEED, debug: false,
//   use_cpu: false, machine_rank: 0, num_machines = nodes, num_processes = world (the total
//   over all machines; Accelerate starts world / nodes per machine),
//   deepspeed_config: {deepspeed_config_file: `deepspeed_config_file`} and nothing else: with a
//     config file, Accelerate rejects the other deepspeed_config keys and also `mixed_precision`
//     (DeepSpeedPlugin._deepspeed_config_checks), so precision comes from the file's bf16 block
//     (AcceleratorState.mixed_precision reads it) and no mixed_precision key is written;
//   parallelism_config: parallelism_config_dp_replicate_size: 1,
//     parallelism_config_dp_shard_size = dp (Accelerate's rule for SP:
//     dp_replicate * dp_shard * sp = num_processes; ZeRO drives the data parallelism),
//     parallelism_config_sp_size = sp, parallelism_config_sp_backend: deepspeed,
//     parallelism_config_sp_seq_length_is_variable: true (ulysses-train pads each sequence to a
//     multiple of sp), parallelism_config_sp_attn_implementation: sdpa.
// The header comment names the model family (model_family_text): Accelerate has no model key, the
// training script loads the model.
// `deepspeed_config_file` is written as given; a relative path resolves against the directory
// `accelerate launch` runs in.
// `nodes`: the machines the run spans (the experiment's nodes; a run config does not say).
// Throws UserError(unsupported_mesh(run, ...)) for ring attention or an uneven head split
// (export_common.h).
// Warnings, in this order: ulysses_torch_version_warning(run);
// alst_switches_warning(run, "An Accelerate config"); deepspeed_zero_warnings(run) (the file
// runs the DeepSpeed config); "nodes=N: ..." when nodes > 1 (each machine's machine_rank and
// the main process address are for the user to set).
// REQUIRES: `run` passed config::validate; deepspeed_config_file is not empty; nodes >= 1
// divides the world (TORCH_CHECK).
AccelerateExport accelerate_config(const config::RunConfig& run,
                                   const std::string& deepspeed_config_file = "ds_config.json",
                                   int64_t nodes = 1);

}  // namespace ulysses::exports
