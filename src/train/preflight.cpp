// Checks of a run's inputs before any rank meets its peers (see preflight.h).
#include "train/preflight.h"

#include "comm/dist_env.h"
#include "common/error.h"
#include "common/output_dir.h"
#include "data/token_source.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace ulysses::train {

void check_run_inputs(const config::RunConfig& config) {
  select_device(config, comm::DistEnv{});
  data::open_token_source(config.data, config.sequence.length, config.model.vocab_size);
  if (!config.eval.source.empty()) {
    config::DataOptions eval_data = config.data;
    eval_data.source = config.eval.source;
    eval_data.seed = config.eval.seed;
    data::open_token_source(eval_data, config.sequence.length, config.model.vocab_size,
                            "eval.source");
  }
  // throws when a named checkpoint does not exist
  const std::string resume_dir = resolve_resume_dir(config.checkpoint);
  check_writable_dir(config.output.dir, "output.dir");
  if (!config.checkpoint.dir.empty()) check_writable_dir(config.checkpoint.dir, "checkpoint.dir");
  const TrainerState resumed = resume_dir.empty() ? TrainerState{} : read_trainer_state(resume_dir);
  check_checkpoint_targets(config.checkpoint, resumed.step, config.train.steps, resumed.run_id);
}

}  // namespace ulysses::train
