// Checks of a run's inputs before any rank meets its peers (see preflight.h).
#include "train/preflight.h"

#include "comm/dist_env.h"
#include "common/error.h"
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
  resolve_resume_dir(config.checkpoint);  // throws when a named checkpoint does not exist
}

}  // namespace ulysses::train
