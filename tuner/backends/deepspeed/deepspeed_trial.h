// The deepspeed trial backend: a sweep trial run by Hugging Face transformers under DeepSpeed's
// own Ulysses sequence parallelism, ZeRO and offloads (ds_trial.py beside this file, one process
// per rank) instead of by ulysses-train, on the same model, tokens and lengths. Its ranks are
// started and supervised like ulysses-train's (trial/trial_runner.h) and write the same
// metrics.jsonl and summary.json (docs/outputs.md), so a sweep stores, ranks and reports both
// backends alike.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::backends {

inline constexpr const char* kNativeBackend = "native";
inline constexpr const char* kDeepSpeedBackend = "deepspeed";

// What a deepspeed trial runs: the rank program and its arguments, and the run config it reads.
struct DeepSpeedTrial {
  std::string program;                 // the Python interpreter
  std::vector<std::string> arguments;  // ds_trial.py --config RUN/run.yaml --ds-config RUN/...
  std::string config_yaml;             // run.yaml: `run` reading the tokens file below
  std::vector<std::string> warnings;   // what the ds_config.json cannot say (exports::...)
};

// The rank program: <project home>/tuner/backends/deepspeed/ds_trial.py.
std::string deepspeed_trial_script();

// Why the deepspeed backend cannot run `run`, as one line naming the key, or nullopt when it can:
// the mesh DeepSpeed's Ulysses cannot run (exports::unsupported_mesh: ring attention, an uneven
// head split; the same line `export --format deepspeed` refuses with), then what ds_trial.py
// refuses of a run config: data.pack, model.preset, an attention.backend other than auto or math.
// A sweep calls such a point `invalid` with this line, and prepare_deepspeed_trial throws it.
// REQUIRES: `run` passed config::validate.
std::optional<std::string> deepspeed_refusal(const config::RunConfig& run);

// Prepares a deepspeed trial of `run` in `run_dir` (created): writes run_dir/ds_config.json, the
// DeepSpeed config `ulysses-tune export --format deepspeed` writes for `run`, and
// run_dir/tokens.bin, the samples the run trains on read from its data.source (synthetic,
// tokens:PATH, megatron:PREFIX) into one flat file, so that both backends see the same tokens
// (sample i = tokens [i*L, (i+1)*L), as tokens:PATH is read). The returned config reads that
// file. Throws UserError(deepspeed_refusal(run)) for what the backend cannot run and UserError
// naming the file when one cannot be written.
// REQUIRES: `run` passed config::validate; python non-empty.
DeepSpeedTrial prepare_deepspeed_trial(const config::RunConfig& run, const std::string& run_dir,
                                       const std::string& python);

}  // namespace ulysses::backends
