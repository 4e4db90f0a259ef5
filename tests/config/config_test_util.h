// Helpers shared by the config tests: exact UserError matching, a field-by-field RunConfig
// comparison written out by hand (independent of src/config/field_table.h), and temp dirs.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "common/error.h"
#include "config/options.h"
#include "common/remove_tree.h"

namespace ulysses::config::testing {

// EXPECTs that fn throws UserError whose what() is exactly `expected`, on one line.
inline void expect_user_error(const std::function<void()>& fn, const std::string& expected) {
  try {
    fn();
    ADD_FAILURE() << "no UserError; expected: " << expected;
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message, expected);
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
  }
}

// EXPECTs a UserError whose what() starts with `prefix` (for messages naming temp paths or
// yaml-cpp's wording), on one line.
inline void expect_user_error_prefix(const std::function<void()>& fn, const std::string& prefix) {
  try {
    fn();
    ADD_FAILURE() << "no UserError; expected a message starting with: " << prefix;
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << "message: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
  }
}

// Every ModelOptions field except preset, load and init_seed, which HF config.json does not hold.
inline void expect_same_shapes(const ModelOptions& a, const ModelOptions& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling_type, b.rope_scaling_type);
  EXPECT_EQ(a.rope_scaling_factor, b.rope_scaling_factor);
  EXPECT_EQ(a.rope_low_freq_factor, b.rope_low_freq_factor);
  EXPECT_EQ(a.rope_high_freq_factor, b.rope_high_freq_factor);
  EXPECT_EQ(a.rope_original_max_position, b.rope_original_max_position);
  EXPECT_EQ(a.rope_attention_factor, b.rope_attention_factor);
  EXPECT_EQ(a.rope_beta_fast, b.rope_beta_fast);
  EXPECT_EQ(a.rope_beta_slow, b.rope_beta_slow);
  EXPECT_EQ(a.rope_mscale, b.rope_mscale);
  EXPECT_EQ(a.rope_mscale_all_dim, b.rope_mscale_all_dim);
  EXPECT_EQ(a.rope_truncate, b.rope_truncate);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.fused_kernels, b.fused_kernels);
  EXPECT_EQ(a.init_std, b.init_std);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

// Every field of RunConfig, compared exactly (doubles too: writing must be lossless).
inline void expect_same_config(const RunConfig& a, const RunConfig& b) {
  EXPECT_EQ(a.model.preset, b.model.preset);
  EXPECT_EQ(a.model.load, b.model.load);
  EXPECT_EQ(a.model.init_seed, b.model.init_seed);
  expect_same_shapes(a.model, b.model);
  EXPECT_EQ(a.mesh.sp, b.mesh.sp);
  EXPECT_EQ(a.mesh.dp, b.mesh.dp);
  EXPECT_EQ(a.sequence.length, b.sequence.length);
  EXPECT_EQ(a.sequence.micro_batch, b.sequence.micro_batch);
  EXPECT_EQ(a.sequence.grad_accum, b.sequence.grad_accum);
  EXPECT_EQ(a.data.source, b.data.source);
  EXPECT_EQ(a.data.seed, b.data.seed);
  EXPECT_EQ(a.data.token_dtype, b.data.token_dtype);
  EXPECT_EQ(a.data.pack, b.data.pack);
  EXPECT_EQ(a.data.eod_token, b.data.eod_token);
  EXPECT_EQ(a.data.packing, b.data.packing);
  EXPECT_EQ(a.data.overlong, b.data.overlong);
  EXPECT_EQ(a.data.loss_mask, b.data.loss_mask);
  EXPECT_EQ(a.memory.tiled_mlp.value, b.memory.tiled_mlp.value);
  EXPECT_EQ(a.memory.tiled_loss.value, b.memory.tiled_loss.value);
  EXPECT_EQ(a.memory.checkpointing, b.memory.checkpointing);
  EXPECT_EQ(a.memory.offload_activations, b.memory.offload_activations);
  EXPECT_EQ(a.memory.offload_optimizer, b.memory.offload_optimizer);
  EXPECT_EQ(a.memory.precision, b.memory.precision);
  EXPECT_EQ(a.memory.limit_gib, b.memory.limit_gib);
  EXPECT_EQ(a.attention.backend, b.attention.backend);
  EXPECT_EQ(a.attention.skip_all_but_last, b.attention.skip_all_but_last);
  EXPECT_EQ(a.attention.disable_in_eval, b.attention.disable_in_eval);
  EXPECT_EQ(a.optim.lr, b.optim.lr);
  EXPECT_EQ(a.optim.betas[0], b.optim.betas[0]);
  EXPECT_EQ(a.optim.betas[1], b.optim.betas[1]);
  EXPECT_EQ(a.optim.eps, b.optim.eps);
  EXPECT_EQ(a.optim.weight_decay, b.optim.weight_decay);
  EXPECT_EQ(a.optim.grad_clip, b.optim.grad_clip);
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_EQ(a.optim.schedule, b.optim.schedule);
  EXPECT_EQ(a.optim.min_lr, b.optim.min_lr);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.device, b.train.device);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.checkpoint.save_initial, b.checkpoint.save_initial);
  EXPECT_EQ(a.checkpoint.resume, b.checkpoint.resume);
  EXPECT_EQ(a.profile.warmup_steps, b.profile.warmup_steps);
  EXPECT_EQ(a.profile.nvtx, b.profile.nvtx);
  EXPECT_EQ(a.output.dir, b.output.dir);
  EXPECT_EQ(a.eval.source, b.eval.source);
  EXPECT_EQ(a.eval.seed, b.eval.seed);
  EXPECT_EQ(a.eval.every, b.eval.every);
  EXPECT_EQ(a.eval.steps, b.eval.steps);
  EXPECT_EQ(a.comm.timeout_s, b.comm.timeout_s);
  EXPECT_EQ(a.comm.collective_timeout_s, b.comm.collective_timeout_s);
  EXPECT_EQ(a.comm.store, b.comm.store);
  EXPECT_EQ(a.comm.backend, b.comm.backend);
}

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("ulysses-config-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    ulysses::remove_tree(path_);
  }
  std::string path() const { return path_.string(); }
  // Writes `text` to <dir>/<name> and returns that path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path file = path_ / name;
    std::ofstream(file) << text;
    return file.string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace ulysses::config::testing
