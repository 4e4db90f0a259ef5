// What a run actually runs, as the trainer resolved it (tiles, padded length, memory features,
// the defaults it took): echoed by rank 0 at start and recorded in summary.json, so a run started
// from a minimal config says what it does before it spends a minute doing it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::train {

// Values the trainer derives from the config at start.
struct ResolvedRun {
  int64_t world_size = 1;
  int64_t dp = 1;
  int64_t sp = 1;
  int64_t padded_length = 0;  // sl: sequence.length padded to a multiple of sp
  int64_t local_length = 0;   // sl/sp, per rank
  int64_t global_batch = 0;   // G = dp * micro_batch * grad_accum samples per step
  int64_t mlp_tiles = 1;      // memory.tiled_mlp resolved (auto is a MAX over ranks); 1 = plain
  int64_t loss_tiles = 1;     // memory.tiled_loss resolved for one micro-batch; 1 = plain
  int64_t parameters = 0;     // model parameters (elements)
  std::string device;         // "cpu", "cuda:0"
  std::string attention;      // the attention core's name
  int64_t host_threads = 0;   // threads of the host optimizer pass (optimizer offload), else 0
};

// "section.key=value" for every key outside model.* whose value equals the options.h default,
// in field-table order (values written as in YAML).
std::vector<std::string> settings_at_default(const config::RunConfig& config);

// The start-of-run echo: a few lines, each starting with "ulysses-train: ", naming the model,
// mesh, sequence (configured and padded), data, memory features with resolved tiles, steps, where
// outputs go (`run_yaml_path` among them) and the defaults taken. Ends with a newline.
std::string describe_run(const config::RunConfig& config, const ResolvedRun& run,
                         const std::string& run_yaml_path);

// The memory features and resolved values, for summary.json: {"memory": {...}, "resolved": {...}}.
nlohmann::json resolved_run_json(const config::RunConfig& config, const ResolvedRun& run);

}  // namespace ulysses::train
