// Atomic HF-compatible checkpoints (see checkpoint.h).
#include "train/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/error.h"
#include "config/hf_config.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace ulysses::train {
namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) throw UserError(path.string() + ": cannot write");
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UserError(path.string() + ": missing");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UserError(path.string() + ": not valid JSON");
  }
}

std::vector<std::pair<std::string, at::Tensor>> to_cpu(
    std::vector<std::pair<std::string, at::Tensor>> tensors) {
  for (auto& [name, t] : tensors) t = t.detach().to(at::kCPU).contiguous();
  return tensors;
}

}  // namespace

void save_checkpoint(const std::string& final_dir, model::LlamaForCausalLM& model,
                     const config::ModelOptions& model_options, const AdamW* optimizer,
                     const TrainerState& state) {
  const fs::path final_path(final_dir);
  const fs::path tmp_path = final_path.parent_path() /
                            ("." + final_path.filename().string() + ".tmp-" +
                             std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp_path, ec);
  fs::create_directories(tmp_path, ec);
  if (ec) throw UserError(tmp_path.string() + ": cannot create (" + ec.message() + ")");

  model::save_safetensors((tmp_path / "model.safetensors").string(),
                          to_cpu(model::hf_state(model)), {{"format", "pt"}});
  write_text(tmp_path / "config.json", config::to_hf_config_json(model_options).dump(2) + "\n");
  if (optimizer != nullptr) {
    model::save_safetensors((tmp_path / "optimizer.safetensors").string(),
                            to_cpu(optimizer->state_tensors()),
                            {{"step", std::to_string(optimizer->step_count())}});
  }
  nlohmann::json trainer = {{"step", state.step},
                            {"samples_seen", state.samples_seen},
                            {"data_seed", state.data_seed},
                            {"train_seed", state.train_seed},
                            {"optimizer_step", optimizer ? optimizer->step_count() : 0}};
  write_text(tmp_path / "trainer_state.json", trainer.dump(2) + "\n");

  // Replace any older checkpoint of the same name, then publish with one rename.
  fs::path old_path = final_path.parent_path() / ("." + final_path.filename().string() + ".old");
  fs::remove_all(old_path, ec);
  if (fs::exists(final_path)) fs::rename(final_path, old_path, ec);
  fs::rename(tmp_path, final_path, ec);
  if (ec) throw UserError(final_path.string() + ": cannot publish checkpoint (" + ec.message() + ")");
  fs::remove_all(old_path, ec);
}

TrainerState load_checkpoint(const std::string& dir, model::LlamaForCausalLM& model,
                             AdamW* optimizer) {
  const fs::path path(dir);
  if (!fs::is_directory(path)) throw UserError(dir + ": checkpoint directory does not exist");
  model::load_hf_weights(model, dir);
  nlohmann::json trainer = read_json(path / "trainer_state.json");
  TrainerState state;
  state.step = trainer.value("step", int64_t{0});
  state.samples_seen = trainer.value("samples_seen", int64_t{0});
  state.data_seed = trainer.value("data_seed", uint64_t{0});
  state.train_seed = trainer.value("train_seed", uint64_t{0});
  if (optimizer != nullptr && fs::exists(path / "optimizer.safetensors")) {
    auto tensors = model::load_safetensors((path / "optimizer.safetensors").string());
    std::vector<std::pair<std::string, at::Tensor>> named(tensors.begin(), tensors.end());
    optimizer->load_state(named, trainer.value("optimizer_step", int64_t{0}));
  }
  return state;
}

std::string resolve_resume_dir(const config::CheckpointOptions& options) {
  if (options.resume != "latest") return options.resume;
  std::error_code ec;
  if (options.dir.empty() || !fs::is_directory(options.dir, ec)) return "";
  static const std::regex step_dir("step-([0-9]+)");
  int64_t best = -1;
  std::string best_path;
  for (const auto& entry : fs::directory_iterator(options.dir, ec)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, match, step_dir)) {
      const int64_t step = std::stoll(match[1]);
      if (step > best) best = step, best_path = entry.path().string();
    }
  }
  return best_path;
}

}  // namespace ulysses::train
