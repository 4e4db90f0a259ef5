// The inputs of a run that can be checked before any rank starts or meets its peers: the device,
// the data files, the checkpoint to resume from. `ulysses-tune launch` runs these checks before it
// starts ranks, and ulysses-train before its rendezvous, so a bad input is one line, not one per
// rank.
#pragma once
#include "config/options.h"

namespace ulysses::train {

// Checks, in this order: train.device is available (select_device's error); model.load's weight
// files (model::check_hf_weight_files: .bin-only weights, a missing shard, a corrupt header;
// "model.load: <file>: ..."); checkpoint.resume names an existing checkpoint
// (resolve_resume_dir's error; "latest" with none written yet is fine: the run starts fresh);
// data.source and eval.source open as the trainer opens them (missing, short or corrupt files:
// the data loader's errors, naming the key and the file) and every token of the samples the run
// will read from a file (the first 2^28 tokens of them) lies inside the vocabulary;
// output.dir and checkpoint.dir can be created and written (a file is created and removed);
// no checkpoint this run will save replaces another run's (check_checkpoint_targets).
// Throws UserError "<key>: <what>" for the first failing check. Creates output.dir and
// checkpoint.dir when missing; writes nothing else; starts nothing.
// REQUIRES: config validated.
void check_run_inputs(const config::RunConfig& config);

}  // namespace ulysses::train
