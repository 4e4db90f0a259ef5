// Writes the three export formats of one run config side by side in a directory: the DeepSpeed
// JSON, the ArcticTraining recipe and the Accelerate config (which names the JSON by its relative
// file name, so `cd DIR && accelerate launch --config_file accelerate_config.yaml ...` works).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::exports {

inline constexpr char kDeepSpeedConfigFile[] = "ds_config.json";
inline constexpr char kArcticRecipeFile[] = "arctic_training.yaml";
inline constexpr char kAccelerateConfigFile[] = "accelerate_config.yaml";

// Where write_exports put the files, and the warnings of all three exports.
struct ExportFiles {
  // Empty when the run has no such export (ring attention or an uneven head split:
  // unsupported_mesh's line is the one warning instead).
  std::string deepspeed_path;   // DIR/ds_config.json
  std::string arctic_path;      // DIR/arctic_training.yaml
  std::string accelerate_path;  // DIR/accelerate_config.yaml
  // The warnings of deepspeed_config, arctic_recipe and accelerate_config, in that order, each
  // distinct line once (the PyTorch-version warning is shared by all three).
  std::vector<std::string> warnings;
};

// Creates `dir` (and parents) when missing and writes the three files (none for a run with ring
// attention or an uneven head split, which none of those stacks runs: then one warning,
// unsupported_mesh's line, says so): ds_config.json (indent 2,
// trailing newline), arctic_training.yaml, accelerate_config.yaml (deepspeed_config_file:
// ds_config.json). Each file is written to a temporary name in `dir` and renamed, so no reader
// ever sees a half-written file; existing files of these names are replaced.
// Throws UserError "<path>: cannot write (<reason>)" when a directory or file cannot be written.
// `nodes`: the machines the run spans (accelerate_config's num_machines).
// REQUIRES: `run` passed config::validate; nodes >= 1 divides its world.
ExportFiles write_exports(const config::RunConfig& run, const std::string& dir,
                          int64_t nodes = 1);

}  // namespace ulysses::exports
