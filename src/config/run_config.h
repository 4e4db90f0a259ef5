// The run config of ulysses-train: YAML file + `--set` overrides -> validated RunConfig,
// and RunConfig -> YAML. This is the one entry point the trainer, the launcher and the tuner use.
//
// Resolution order, later wins: options.h defaults; the model preset (`model.preset: NAME`, from
// profiles/models/NAME.yaml) or the HF config (`model.load: DIR`, DIR/config.json); the fields
// written in the file; the overrides. Then head_dim 0 is resolved and everything is validated.
//
// Every error is a ulysses::UserError whose what() is one line, "<key.path>: <what is wrong>"
// (e.g. "memory.tiled_mpl: unknown key (did you mean memory.tiled_mlp?)",
// "sequence.length: expected an integer, got 'abc'"), or "<file>: <what>" for a file that is
// missing or not valid YAML/JSON (with line and column when the parser gives them).
#pragma once
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::config {

// Reads the YAML run config at `path`, applies `overrides` ("key.path=value" as given after
// --set; the value is parsed as YAML, so optim.betas=[0.9,0.99] and memory.tiled_mlp=auto work),
// resolves the model, and validates with an unknown world size.
// Throws UserError as described above.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});

// load_run_config on YAML text instead of a file (errors name the text "run config").
RunConfig parse_run_config_yaml(const std::string& text,
                                const std::vector<std::string>& overrides = {});

// Every key of `config` as a YAML document, sections in the documented order, block style. Reading
// it back with parse_run_config_yaml gives a RunConfig equal field by field (the model preset/load
// name is kept, and the resolved model fields are written inline so they win over the preset).
std::string to_yaml(const RunConfig& config);

// Resolves model.head_dim 0 to hidden_size / num_heads, then checks every rule (ranges, allowed
// values, head counts vs mesh.sp, precision vs device, ...). world_size is the number
// of ranks when known (then mesh.dp * mesh.sp must equal it), or -1 when unknown.
// Throws UserError naming the first offending key. REQUIRES: world_size == -1 or >= 1.
void validate(RunConfig& config, int world_size = -1);

}  // namespace ulysses::config
