// Checks of a run's inputs before any rank meets its peers (see preflight.h).
#include "train/preflight.h"

#include <algorithm>

#include "comm/dist_env.h"
#include "common/error.h"
#include "common/output_dir.h"
#include "data/token_source.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace ulysses::train {
namespace {

// Reads samples [first, first + count) of `source` (wrapping as the trainer does), at most
// kMaxCheckedTokens tokens, so that a token outside the vocabulary is one line here; the
// trainer checks every batch it reads as well.
constexpr int64_t kMaxCheckedTokens = int64_t{1} << 28;

void check_samples(const data::TokenSource& source, const std::string& source_spec,
                   int64_t first, int64_t count) {
  if (source_spec == "synthetic") return;  // drawn inside the vocabulary
  const int64_t limit = std::max<int64_t>(1, kMaxCheckedTokens / source.sample_length());
  for (int64_t i = 0; i < std::min(count, limit); ++i) source.tokens(first + i);
}

}  // namespace

void check_run_inputs(const config::RunConfig& config) {
  select_device(config, comm::DistEnv{});
  if (!config.model.load.empty()) {
    try {
      model::check_hf_weight_files(config.model.load);
    } catch (const UserError& e) {
      throw UserError(std::string("model.load: ") + e.what());
    }
  }
  // throws when a named checkpoint does not exist
  const std::string resume_dir = resolve_resume_dir(config.checkpoint);
  const TrainerState resumed = resume_dir.empty() ? TrainerState{} : read_trainer_state(resume_dir);
  const int64_t global_batch =
      config.mesh.dp * config.sequence.micro_batch * config.sequence.grad_accum;
  const auto source =
      data::open_token_source(config.data, config.sequence.length, config.model.vocab_size);
  check_samples(*source, config.data.source, resumed.samples_seen,
                std::max<int64_t>(0, config.train.steps - resumed.step) * global_batch);
  if (!config.eval.source.empty()) {
    config::DataOptions eval_data = config.data;
    eval_data.source = config.eval.source;
    eval_data.seed = config.eval.seed;
    const auto eval_source = data::open_token_source(
        eval_data, config.sequence.length, config.model.vocab_size, "eval.source");
    check_samples(*eval_source, eval_data.source, 0, config.eval.steps * global_batch);
  }
  check_writable_dir(config.output.dir, "output.dir");
  if (!config.checkpoint.dir.empty()) check_writable_dir(config.checkpoint.dir, "checkpoint.dir");
  check_checkpoint_targets(config.checkpoint, resumed.step, config.train.steps, resumed.run_id);
}

}  // namespace ulysses::train
