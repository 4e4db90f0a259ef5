// Checkpoints: <dir>/step-<N>/ holds model.safetensors with HF Llama names, config.json
// (HF LlamaConfig), the AdamW state and trainer_state.json (step, seeds, data position, mesh), so
// that resume continues bit-for-bit. A model loaded from an HF directory (model.load) keeps that
// directory's tokenizer, generation config and chat template files, and its config.json's token
// ids, so the checkpoint loads in transformers as the source did. A checkpoint is written under a
// temporary name, fsynced and renamed, so a crash never leaves a half checkpoint that looks whole.
//
// Every rank writes a share of the optimizer state (optimizer-<r>-of-<W>.safetensors; one file,
// optimizer.safetensors, in a world of 1), balanced by bytes with rank 0's model weights, so no
// rank waits at the closing barrier for one writer to write everything.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "config/options.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "zero/zero_optimizer.h"

namespace ulysses::train {

struct TrainerState {
  int64_t step = 0;            // last completed step
  int64_t samples_seen = 0;    // global samples consumed (data position)
  uint64_t data_seed = 0;
  uint64_t train_seed = 0;
  int64_t global_batch = 0;    // G of the run that wrote it; 0 = unknown (older checkpoints)
  int64_t dp = 0;              // mesh of the run that wrote it; 0 = unknown
  int64_t sp = 0;
  int64_t skipped_steps = 0;   // optimizer steps skipped for a non-finite grad_norm, in total
  std::string run_id;          // made at a fresh start, kept across resumes; "" = older checkpoint
};

// A new run id: 16 hex digits from the clock and std::random_device.
std::string new_run_id();

// When `path` exists and saving a checkpoint of run `run_id` there would replace what another run
// wrote (or something that is not a checkpoint), one line describing it ("<path> holds a
// checkpoint of run X (step 4, dp 1 x sp 1, 8 samples seen)"); else nullopt. `run_id` "" (a
// fresh run that has no id yet) matches nothing. Reads only.
std::optional<std::string> foreign_checkpoint(const std::string& path, const std::string& run_id);

// Before step 1: throws UserError "checkpoint.dir: ..." when one of the checkpoints this run will
// save (DIR/initial, DIR/step-N for the steps after `start_step` that `options.every` and
// `total_steps` select) would replace another run's (foreign_checkpoint) and options.overwrite is
// false; a name held by something that is not a checkpoint is refused always.
void check_checkpoint_targets(const config::CheckpointOptions& options, int64_t start_step,
                              int64_t total_steps, const std::string& run_id);

// Removes what an interrupted save left in `checkpoint_dir`: ".step-<N>.tmp", ".initial.tmp" and
// their ".old" twins, also with an older "-<pid>" suffix (nothing else: the directory may hold
// the user's files). Returns their names. A missing directory is not an error. Call it on one rank,
// before any rank saves (the caller puts a barrier after it).
std::vector<std::string> remove_stale_checkpoint_temps(const std::string& checkpoint_dir);

// Collective over `world` (every rank calls it with the same arguments): writes a complete
// checkpoint to `final_dir` (e.g. ".../step-20" or ".../initial"). Each rank writes its share of
// `optimizer`'s state (may be null: weights only, e.g. initial) into ".<name>.tmp" next to
// final_dir; rank 0 also writes the weights, config.json and trainer_state.json, and when
// model_options.load names an HF directory copies the tokenizer files, generation_config.json and
// chat templates that exist there (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// added_tokens.json, tokenizer.model*, *.tiktoken, vocab/merges files, chat_template.{jinja,json},
// additional_chat_templates/), and writes its config.json's bos/eos/pad token ids as they are
// there (config::keep_source_token_ids). Every file is
// fsynced by its writer; after a barrier rank 0 fsyncs the directory, replaces an older
// checkpoint of the same name with one rename, and fsyncs the parent. An older checkpoint of
// another run (foreign_checkpoint) is replaced only when `overwrite` is true, else UserError. Throws UserError when a
// file cannot be written, comm::CommError when a peer fails. On return on rank 0 `final_dir`
// exists and is complete.
// With `zero` (a ZeRO-1/2/3 run; `optimizer` is then null) every rank writes all of its own
// shard's state into optimizer-<r>-of-<W>.safetensors, and trainer_state.json records zero_stage.
// ZeRO-3 (zero's partition, or `sharded_weights` for a weights-only save such as initial/): the
// weights are streamed, never gathered whole: each parameter is all-gathered one bucket
// (zero.bucket_mb) at a time and rank 0 writes each part at its place in model.safetensors, so
// no rank holds more than one bucket of a parameter beyond its own shard.
void save_checkpoint(const std::string& final_dir, model::LlamaForCausalLM& model,
                     const config::ModelOptions& model_options, const AdamW* optimizer,
                     const TrainerState& state, comm::Group& world,
                     const ZeroOptimizer* zero = nullptr, bool overwrite = false,
                     ZeroPartition* sharded_weights = nullptr);

// Bytes of gathered ZeRO-3 weights this process has copied to the host for streamed saves since
// it started: on the rank that writes model.safetensors, the weights' bytes per save; on the
// others, which take part in the gathers only, 0.
int64_t streamed_save_host_bytes();

// Loads weights, optimizer state (when `optimizer` is non-null) and trainer state from `dir`.
// Throws UserError naming the file when something is missing or does not match the model; in
// particular when `optimizer` is non-null and a checkpoint past step 0 holds no optimizer state
// (a weights-only checkpoint: start from it with model.load instead).
// With `zero` (optimizer null) a checkpoint of a ZeRO-1/2/3 run on the same world size loads this
// rank's own optimizer-<r>-of-<W> file (bit-exact resume). A ZeRO-3 partition whose parameters
// are released (the sharded build) reads only its shards' bytes of model.safetensors. Any other
// combination converts: a zero.stage 0 state is sliced into this rank's shard; ZeRO shards of
// another world (or into a stage 0 run) are concatenated and cut back into per-parameter entries
// first (the same values: AdamW is elementwise).
TrainerState load_checkpoint(const std::string& dir, model::LlamaForCausalLM& model,
                             AdamW* optimizer, ZeroOptimizer* zero = nullptr);

// The trainer state of the checkpoint in `dir` (its trainer_state.json) without loading anything
// else. Throws UserError naming the directory or file when it is missing or unreadable.
TrainerState read_trainer_state(const std::string& dir);

// Resolves checkpoint.resume: "" -> ""; "latest" -> the highest <checkpoint.dir>/step-<N>, or ""
// when there is none yet (then `*note` says so); a relative name such as "step-2" ->
// <checkpoint.dir>/step-2 when that exists, else the path as given. Throws
// UserError("checkpoint.resume: ...") when a named checkpoint exists in neither place.
std::string resolve_resume_dir(const config::CheckpointOptions& options, std::string* note = nullptr);

}  // namespace ulysses::train
