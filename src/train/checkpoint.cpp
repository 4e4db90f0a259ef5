// Atomic, fsynced HF-compatible checkpoints with the optimizer state written by every rank (see
// checkpoint.h).
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

#include "common/error.h"
#include "common/input_file.h"
#include "config/hf_config.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"
#include "zero/grad_buffers.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses::train {
namespace {

const std::regex& step_dir_pattern() {
  static const std::regex pattern("step-([0-9]+)");
  return pattern;
}

// Flushes `path` (a file or a directory) to stable storage. Throws UserError when it cannot.
void sync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw UserError(path.string() + ": cannot fsync");
  }
  ::close(fd);
}

void write_text(const fs::path& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw UserError(path.string() + ": cannot write");
  }
  sync_path(path);
}

nlohmann::json read_json(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UserError(path.string() + ": missing");
  const std::string text = read_input_file(path.string(), "a JSON file");
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw UserError(path.string() + ": not valid JSON");
  }
}

std::vector<std::pair<std::string, at::Tensor>> to_cpu(
    std::vector<std::pair<std::string, at::Tensor>> tensors) {
  for (auto& [name, t] : tensors) t = t.detach().to(at::kCPU).contiguous();
  return tensors;
}

int64_t tensor_bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// "<param>.exp_avg" -> "<param>".
std::string parameter_of(const std::string& entry) { return entry.substr(0, entry.rfind('.')); }

std::string optimizer_file(int rank, int world) {
  if (world == 1) return "optimizer.safetensors";
  return "optimizer-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

// The rank that writes each parameter's optimizer entries: largest parameter first to the least
// loaded rank, rank 0 starting with the `weight_bytes` it writes anyway. The same on every rank
// (same entries, same order).
std::map<std::string, int> assign_writers(const NamedTensors& entries, int64_t weight_bytes,
                                          int world) {
  std::vector<std::pair<std::string, int64_t>> params;  // in entry order
  for (const auto& [name, t] : entries) {
    const std::string param = parameter_of(name);
    if (params.empty() || params.back().first != param) params.emplace_back(param, 0);
    params.back().second += tensor_bytes(t);
  }
  std::stable_sort(params.begin(), params.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<int64_t> load(world, 0);
  load[0] = weight_bytes;
  std::map<std::string, int> writer;
  for (const auto& [param, bytes] : params) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    writer[param] = rank;
    load[rank] += bytes;
  }
  return writer;
}

// The per-parameter AdamW entries (AdamW::state_tensors() names) of the ZeRO shards in `files`
// (one per rank, in rank order). Flat layout (stage 1, and stage 2 before it had its own):
// each flat's shards concatenated in rank order, then cut at the parameters' offsets
// (plan_flat_layout, as the run that wrote them laid them out). Parameter layout: see above. ".master"
// entries only for bf16/fp16 parameters (AdamW keeps no separate master for the others).
// The parameter layout (zero.stage 2/3, "zero.param<i>" entries): parameter i's shards placed
// by ZeroPartition's layout with the part sizes `parts` (trainer_state.json's zero_part_numel;
// empty: one part per parameter, each rank's shard a contiguous range in rank order).
NamedTensors unshard_param_layout(const std::vector<std::map<std::string, at::Tensor>>& shards,
                                  const std::vector<fs::path>& files,
                                  const std::vector<std::string>& names,
                                  const std::vector<at::Tensor>& params,
                                  const std::vector<int64_t>& parts, const std::string& source) {
  if (!parts.empty() && parts.size() != params.size()) {
    throw UserError(source + ": trainer_state.json's zero_part_numel has " +
                    std::to_string(parts.size()) + " entries, the model " +
                    std::to_string(params.size()) + " parameters (another model?)");
  }
  const int64_t world = static_cast<int64_t>(shards.size());
  NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = "zero.param" + std::to_string(i);
    const int64_t numel = params[i].numel();
    auto full = [&](const std::string& what) {  // [param shape]
      at::Tensor flat;
      for (int64_t r = 0; r < world; ++r) {
        auto it = shards[r].find(key + what);
        if (it == shards[r].end()) {
          throw UserError(files[r].string() + ": optimizer entry " + key + what + " is missing");
        }
        const at::Tensor shard = it->second.reshape({-1});  // [S_i]
        const int64_t part = parts.empty() ? shard.numel() : parts[i];
        if (shard.numel() * world < numel || part < 1 || shard.numel() % part != 0) {
          throw UserError(source + ": ZeRO optimizer shard of " + key + what + " in " +
                          files[r].string() + " holds " + std::to_string(shard.numel()) +
                          " elements in parts of " + std::to_string(part) + ", " + names[i] +
                          " has " + std::to_string(numel) + " (another model?)");
        }
        if (!flat.defined()) flat = at::empty({numel}, shard.options());
        const auto pieces = ZeroPartition::shard_pieces(numel, shard.numel(), part, world, r);
        for (const auto& piece : pieces) {
          flat.narrow(0, piece.param_offset, piece.length)
              .copy_(shard.narrow(0, piece.shard_offset, piece.length));
        }
      }
      return flat.view(params[i].sizes());
    };
    out.emplace_back(names[i] + ".exp_avg", full(".exp_avg"));
    out.emplace_back(names[i] + ".exp_avg_sq", full(".exp_avg_sq"));
    auto step = shards[0].find(key + ".step");
    if (step == shards[0].end()) {
      throw UserError(files[0].string() + ": optimizer entry " + key + ".step is missing");
    }
    out.emplace_back(names[i] + ".step", step->second.reshape({-1})[0].clone());
    const at::ScalarType dtype = params[i].scalar_type();
    if (dtype == at::kBFloat16 || dtype == at::kHalf) out.emplace_back(names[i] + ".master", full(".master"));
  }
  return out;
}

// `params`: the parameters, or descriptions of them (shape and dtype; parameter_descriptions).
NamedTensors unshard_state(const std::vector<fs::path>& files, model::LlamaForCausalLM& model,
                           const std::vector<at::Tensor>& params, const std::string& saved_layout,
                           const std::vector<int64_t>& saved_parts, const std::string& source) {
  std::vector<std::map<std::string, at::Tensor>> shards;
  for (const auto& file : files) shards.push_back(model::load_safetensors(file.string()));
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  if (saved_layout == "param") {
    return unshard_param_layout(shards, files, names, params, saved_parts, source);
  }
  const FlatLayout layout = plan_flat_layout(params, static_cast<int64_t>(files.size()));
  auto full_flat = [&](size_t f, const std::string& what) {  // [flat_numel[f]]
    const std::string key = "zero.flat" + std::to_string(f) + what;
    std::vector<at::Tensor> parts;
    for (size_t r = 0; r < shards.size(); ++r) {
      auto it = shards[r].find(key);
      if (it == shards[r].end()) {
        throw UserError(files[r].string() + ": optimizer entry " + key + " is missing");
      }
      parts.push_back(it->second.reshape({-1}));
    }
    at::Tensor flat = at::cat(parts);
    if (what != ".step" && flat.numel() != layout.flat_numel[f]) {
      throw UserError(source + ": ZeRO optimizer shards of " + key + " hold " +
                      std::to_string(flat.numel()) + " elements, this model needs " +
                      std::to_string(layout.flat_numel[f]) + " (another model?)");
    }
    return flat;
  };
  std::vector<at::Tensor> exp_avg, exp_avg_sq, master;
  for (size_t f = 0; f < layout.flat_numel.size(); ++f) {
    exp_avg.push_back(full_flat(f, ".exp_avg"));
    exp_avg_sq.push_back(full_flat(f, ".exp_avg_sq"));
    master.push_back(full_flat(f, ".master"));
  }
  const at::Tensor step = full_flat(0, ".step").reshape({-1})[0].clone();  // [] int64
  NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) {
    const int f = layout.flat_index[i];
    if (f < 0) continue;
    auto cut = [&](const at::Tensor& flat) {
      return flat.narrow(0, layout.flat_offset[i], params[i].numel()).view(params[i].sizes()).clone();
    };
    out.emplace_back(names[i] + ".exp_avg", cut(exp_avg[f]));
    out.emplace_back(names[i] + ".exp_avg_sq", cut(exp_avg_sq[f]));
    out.emplace_back(names[i] + ".step", step);
    const at::ScalarType dtype = params[i].scalar_type();
    if (dtype == at::kBFloat16 || dtype == at::kHalf) out.emplace_back(names[i] + ".master", cut(master[f]));
  }
  return out;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files of an HF model directory that describe how to use the model rather than hold it:
// tokenizer (fast and slow, sentencepiece, tiktoken, Mistral's tekken), generation config, chat
// templates.
bool is_tokenizer_or_generation_file(const std::string& name) {
  static const std::set<std::string> names = {
      "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
      "added_tokens.json",   "vocab.json",            "vocab.txt",
      "merges.txt",          "spiece.model",          "sentencepiece.bpe.model",
      "tekken.json",         "generation_config.json", "chat_template.json",
      "chat_template.jinja"};
  return names.count(name) > 0 || starts_with(name, "tokenizer.model") ||
         ends_with(name, ".tiktoken");
}

// A regular file (or a link to one, as in the HF cache) copied and fsynced.
void copy_synced(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    throw UserError(to.string() + ": cannot copy from " + from.string() + " (" + ec.message() + ")");
  }
  sync_path(to);
}

// What a checkpoint of a model loaded from an HF directory (model.load) keeps of it: the tokenizer,
// generation config and chat template files that exist there (and additional_chat_templates/),
// copied into `dir`; and config.json's bos/eos/pad token ids as the source's config.json has them
// (config::keep_source_token_ids). A source that is gone by now leaves `config` as it is.
void keep_source_files(const config::ModelOptions& model, const fs::path& dir,
                       nlohmann::json& config) {
  std::error_code ec;
  if (model.load.empty()) return;
  const fs::path source(model.load);
  if (!fs::is_directory(source, ec)) return;
  for (const auto& entry : fs::directory_iterator(source, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_tokenizer_or_generation_file(name) && fs::is_regular_file(entry.path(), ec)) {
      copy_synced(entry.path(), dir / name);
    }
  }
  const fs::path templates = source / "additional_chat_templates";
  if (fs::is_directory(templates, ec)) {
    fs::create_directories(dir / templates.filename(), ec);
    for (const auto& entry : fs::directory_iterator(templates, ec)) {
      if (fs::is_regular_file(entry.path(), ec)) {
        copy_synced(entry.path(), dir / templates.filename() / entry.path().filename());
      }
    }
    sync_path(dir / templates.filename());
  }
  const fs::path source_config = source / "config.json";
  if (fs::is_regular_file(source_config, ec)) {
    config::keep_source_token_ids(read_json(source_config), source_config.string(), model,
                                  config);
  }
}

}  // namespace

std::string new_run_id() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                        static_cast<uint64_t>(
                            std::chrono::steady_clock::now().time_since_epoch().count());
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

std::optional<std::string> foreign_checkpoint(const std::string& path, const std::string& run_id) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  const fs::path state_path = fs::path(path) / "trainer_state.json";
  nlohmann::json state;
  if (fs::is_regular_file(state_path, ec)) {
    state = nlohmann::json::parse(read_input_file(state_path.string(), "a JSON file"), nullptr,
                                  /*allow_exceptions=*/false);
  }
  if (!fs::is_directory(path, ec) || !state.is_object()) {
    return path + " exists and is not a checkpoint";
  }
  const std::string owner = state.value("run_id", std::string());
  if (!run_id.empty() && owner == run_id) return std::nullopt;
  char text[200];
  std::snprintf(text, sizeof text, " (step %lld, dp %lld x sp %lld, %lld samples seen)",
                static_cast<long long>(state.value("step", int64_t{0})),
                static_cast<long long>(state.value("dp", int64_t{0})),
                static_cast<long long>(state.value("sp", int64_t{0})),
                static_cast<long long>(state.value("samples_seen", int64_t{0})));
  return path + " holds a checkpoint of " +
         (owner.empty() ? std::string("an earlier run") : "run " + owner) + text;
}

void check_checkpoint_targets(const config::CheckpointOptions& options, int64_t start_step,
                              int64_t total_steps, const std::string& run_id) {
  if (options.dir.empty()) return;
  std::vector<std::string> targets;
  if (options.save_initial && start_step == 0) targets.push_back("initial");
  for (int64_t step = start_step + 1; step <= total_steps; ++step) {
    if (step == total_steps || (options.every > 0 && step % options.every == 0)) {
      targets.push_back("step-" + std::to_string(step));
    }
  }
  for (const std::string& name : targets) {
    const std::string path = (fs::path(options.dir) / name).string();
    const std::optional<std::string> other = foreign_checkpoint(path, run_id);
    if (!other) continue;
    if (other->find("is not a checkpoint") != std::string::npos) {
      throw UserError("checkpoint.dir: " + *other + "; this run would save " + name +
                      " there: choose another checkpoint.dir");
    }
    if (!options.overwrite) {
      throw UserError("checkpoint.dir: " + *other + ", which this run would replace; choose "
                      "another checkpoint.dir, resume that run, or set checkpoint.overwrite: true");
    }
  }
}

std::vector<std::string> remove_stale_checkpoint_temps(const std::string& checkpoint_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (checkpoint_dir.empty() || !fs::is_directory(checkpoint_dir, ec)) return removed;
  static const std::regex temp("\\.(step-[0-9]+|initial)\\.(tmp|old)(-[0-9]+)?");
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && std::regex_match(name, temp)) {
      ulysses::remove_tree(entry.path());
      removed.push_back(name);
    }
  }
  return removed;
}

namespace {

std::atomic<int64_t> streamed_host_bytes{0};  // streamed_save_host_bytes()

// Collective over `partition`'s world: writes the stage-3 weights to `path` (rank 0) part by
// part, in HF order (the partition's parameter order), each part all-gathered from the shards.
void write_sharded_weights(const fs::path& path, ZeroPartition& partition, bool is_rank0) {
  std::unique_ptr<model::SafetensorsWriter> writer;
  const size_t count = partition.params().size();
  if (is_rank0) {
    std::vector<model::SafetensorsTensor> tensors;
    for (size_t i = 0; i < count; ++i) {
      tensors.push_back({partition.names()[i], partition.weight_dtype(i), partition.shape(i), 0});
    }
    const std::map<std::string, std::string> metadata = {{"format", "pt"}};
    writer = std::make_unique<model::SafetensorsWriter>(path.string(), tensors, metadata);
  }
  for (size_t i = 0; i < count; ++i) {
    const int64_t numel = partition.param_numel(i);
    for (int64_t k = 0; k < partition.part_count(i); ++k) {
      // Every rank takes part in the gather; only the writer copies the part to the host.
      const at::Tensor gathered = partition.gather_part(i, k);  // [world * P_i]
      const int64_t begin = k * gathered.numel();
      const int64_t valid = std::min(gathered.numel(), numel - begin);  // past numel: padding
      if (writer && valid > 0) {
        const at::Tensor on_host = gathered.narrow(0, 0, valid).cpu();
        streamed_host_bytes += tensor_bytes(on_host);
        writer->write(i, begin, on_host);
      }
    }
  }
  if (writer) writer->close();
}

// The parameters as shape-and-dtype descriptions (meta tensors that require grad, as the
// parameters do): from `partition` when it holds them (stage 3 with released weights), else the
// model's own.
std::vector<at::Tensor> parameter_descriptions(model::LlamaForCausalLM& model,
                                               const ZeroPartition* partition) {
  std::vector<at::Tensor> out;
  if (partition != nullptr && partition->stage() == 3 && partition->all_released()) {
    for (size_t i = 0; i < partition->params().size(); ++i) {
      at::Tensor described = at::empty(
          partition->shape(i), at::TensorOptions(at::kMeta).dtype(partition->weight_dtype(i)));
      out.push_back(described.set_requires_grad(true));
    }
    return out;
  }
  for (const auto& p : model->parameters()) out.push_back(p);
  return out;
}

}  // namespace

int64_t streamed_save_host_bytes() { return streamed_host_bytes.load(); }

void save_checkpoint(const std::string& final_dir, model::LlamaForCausalLM& model,
                     const config::ModelOptions& model_options, const AdamW* optimizer,
                     const TrainerState& state, comm::Group& world, const ZeroOptimizer* zero,
                     bool overwrite, ZeroPartition* sharded_weights) {
  const fs::path final_path(final_dir);
  const fs::path parent = final_path.parent_path();
  const fs::path tmp_path = parent / (std::string(".") + final_path.filename().string() + ".tmp");
  const bool is_rank0 = world.rank() == 0;
  std::error_code ec;
  fs::create_directories(tmp_path, ec);  // every rank; concurrent creation is fine
  if (!fs::is_directory(tmp_path)) {
    throw UserError(tmp_path.string() + ": cannot create (" + ec.message() + ")");
  }

  std::vector<std::string> optimizer_files;
  if (optimizer != nullptr) {
    const NamedTensors entries = optimizer->state_tensors();
    int64_t weight_bytes = 0;
    for (const auto& p : model->parameters()) weight_bytes += tensor_bytes(p);
    const std::map<std::string, int> writer = assign_writers(entries, weight_bytes, world.size());
    NamedTensors mine;
    for (const auto& [name, t] : entries)
      if (writer.at(parameter_of(name)) == world.rank()) mine.emplace_back(name, t);
    for (int r = 0; r < world.size(); ++r) optimizer_files.push_back(optimizer_file(r, world.size()));
    const fs::path file = tmp_path / optimizer_files[world.rank()];
    model::save_safetensors(file.string(), to_cpu(std::move(mine)),
                            {{"step", std::to_string(optimizer->step_count())}});
    sync_path(file);
  } else if (zero != nullptr) {  // every rank writes its whole shard
    for (int r = 0; r < world.size(); ++r) optimizer_files.push_back(optimizer_file(r, world.size()));
    const fs::path file = tmp_path / optimizer_files[world.rank()];
    model::save_safetensors(file.string(), to_cpu(zero->state_tensors()),
                            {{"step", std::to_string(zero->step_count())}});
    sync_path(file);
  }
  const int64_t optimizer_step =
      optimizer ? optimizer->step_count() : (zero ? zero->step_count() : 0);
  // Stage 3 holds shards only: the weights are streamed part by part, never whole.
  ZeroPartition* partition = zero != nullptr ? zero->partition() : sharded_weights;
  const bool streamed = partition != nullptr && partition->stage() == 3;
  const fs::path weights = tmp_path / "model.safetensors";
  if (streamed) write_sharded_weights(weights, *partition, is_rank0);
  if (is_rank0) {
    if (!streamed) {
      model::save_safetensors(weights.string(), to_cpu(model::hf_state(model)), {{"format", "pt"}});
    }
    sync_path(weights);
    nlohmann::json hf_config = config::to_hf_config_json(model_options);
    keep_source_files(model_options, tmp_path, hf_config);
    write_text(tmp_path / "config.json", hf_config.dump(2) + "\n");
    nlohmann::json trainer = {{"step", state.step},
                              {"samples_seen", state.samples_seen},
                              {"data_seed", state.data_seed},
                              {"train_seed", state.train_seed},
                              {"global_batch", state.global_batch},
                              {"dp", state.dp},
                              {"sp", state.sp},
                              {"skipped_steps", state.skipped_steps},
                              {"optimizer_step", optimizer_step},
                              {"zero_stage", zero ? zero->stage() : 0},
                              {"zero_layout", zero ? zero->layout() : ""},
                              {"optimizer_files", optimizer_files},
                              {"run_id", state.run_id}};
    if (zero != nullptr && zero->partition() != nullptr) {
      trainer["zero_part_numel"] = zero->partition()->part_numels();
    }
    write_text(tmp_path / "trainer_state.json", trainer.dump(2) + "\n");
  }
  world.barrier();  // every share is on disk
  if (!is_rank0) return;

  // Replace an older checkpoint of the same name (this run's, or another's when asked), then
  // publish with one rename.
  if (!overwrite) {
    if (const auto other = foreign_checkpoint(final_path.string(), state.run_id)) {
      ulysses::remove_tree(tmp_path);
      throw UserError("checkpoint.dir: " + *other +
                      "; not replaced (set checkpoint.overwrite: true to replace it)");
    }
  }
  sync_path(tmp_path);
  const fs::path old_path = parent / (std::string(".") + final_path.filename().string() + ".old");
  ulysses::remove_tree(old_path);
  if (fs::exists(final_path)) fs::rename(final_path, old_path, ec);
  ec.clear();
  fs::rename(tmp_path, final_path, ec);
  if (ec) throw UserError(final_path.string() + ": cannot publish checkpoint (" + ec.message() + ")");
  sync_path(parent);
  ulysses::remove_tree(old_path);
}

TrainerState read_trainer_state(const std::string& dir) {
  const fs::path path(dir);
  if (!fs::is_directory(path)) throw UserError(dir + ": checkpoint directory does not exist");
  const nlohmann::json trainer = read_json(path / "trainer_state.json");
  TrainerState state;
  state.step = trainer.value("step", int64_t{0});
  state.samples_seen = trainer.value("samples_seen", int64_t{0});
  state.data_seed = trainer.value("data_seed", uint64_t{0});
  state.train_seed = trainer.value("train_seed", uint64_t{0});
  state.global_batch = trainer.value("global_batch", int64_t{0});
  state.dp = trainer.value("dp", int64_t{0});
  state.sp = trainer.value("sp", int64_t{0});
  state.skipped_steps = trainer.value("skipped_steps", int64_t{0});
  state.run_id = trainer.value("run_id", std::string());
  return state;
}

TrainerState load_checkpoint(const std::string& dir, model::LlamaForCausalLM& model,
                             AdamW* optimizer, ZeroOptimizer* zero) {
  const fs::path path(dir);
  const TrainerState state = read_trainer_state(dir);
  nlohmann::json trainer = read_json(path / "trainer_state.json");

  std::vector<std::string> files = trainer.value("optimizer_files", std::vector<std::string>{});
  if (files.empty() && fs::exists(path / "optimizer.safetensors")) files = {"optimizer.safetensors"};
  const int64_t saved_stage = trainer.value("zero_stage", int64_t{0});
  if (zero != nullptr && files.empty() && state.step > 0) {
    throw UserError((path / "trainer_state.json").string() +
                    ": no optimizer state, so resuming would restart AdamW from zero moments (a "
                    "weights-only checkpoint: start from it with model.load instead)");
  }
  if (optimizer != nullptr && files.empty() && state.step > 0) {
    throw UserError((path / "optimizer.safetensors").string() +
                    ": missing, so resuming would restart AdamW from zero moments (a weights-only "
                    "checkpoint: start from it with model.load instead)");
  }
  for (const auto& file : files) {  // all present before anything is loaded
    if (!fs::exists(path / file)) throw UserError((path / file).string() + ": missing");
  }
  ZeroPartition* partition = zero != nullptr ? zero->partition() : nullptr;
  if (partition != nullptr && partition->stage() == 3 && partition->all_released()) {
    // The sharded build: this rank reads its shards' bytes only.
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (size_t i = 0; i < partition->params().size(); ++i) {
      shapes.emplace_back(partition->names()[i], partition->shape(i));
    }
    const model::HfWeightIndex index(dir, shapes, model->options().tie_embeddings);
    partition->fill_shards([&index](size_t, const std::string& name, at::IntArrayRef,
                                    int64_t begin, at::Tensor out) {
      index.read(name, begin, out);
    });
  } else {
    model::load_hf_weights(model, dir);
  }
  const int64_t optimizer_step = trainer.value("optimizer_step", int64_t{0});
  // Stage 1 wrote the flat layout, stages 2/3 the parameter layout (stage 2 wrote flat before
  // zero_layout was recorded).
  const std::string saved_layout =
      trainer.value("zero_layout", std::string(saved_stage > 0 ? "flat" : ""));
  // The parameter layout's part sizes (ZeroPartition); a checkpoint written before parts existed
  // has one part per parameter: ceil(n / world) elements, its world being the files' count.
  const std::vector<int64_t> saved_parts =
      trainer.value("zero_part_numel", std::vector<int64_t>{});
  bool same_parts = partition == nullptr || saved_parts == partition->part_numels();
  if (partition != nullptr && saved_parts.empty() && !files.empty()) {
    const int64_t saved_world = static_cast<int64_t>(files.size());
    same_parts = true;
    for (size_t i = 0; i < partition->params().size(); ++i) {
      const int64_t n = partition->param_numel(i);
      const int64_t one_part = std::max<int64_t>((n + saved_world - 1) / saved_world, 1);
      same_parts = same_parts && partition->part_numels()[i] == one_part;
    }
  }
  const bool same_shards = zero != nullptr && saved_stage > 0 && saved_layout == zero->layout() &&
                           same_parts && static_cast<int>(files.size()) == zero->world().size();
  if (zero != nullptr) zero->reload_parameters();  // masters from the loaded weights
  if (same_shards) {  // this rank's own file: bit-exact
    const std::string file = (path / files[zero->world().rank()]).string();
    NamedTensors named;
    for (auto& entry : model::load_safetensors(file)) named.push_back(entry);
    zero->load_state(named, optimizer_step, file);
  } else if ((optimizer != nullptr || zero != nullptr) && !files.empty()) {
    NamedTensors named;
    if (saved_stage > 0) {  // shards of another stage or world: per-parameter entries first
      std::vector<fs::path> paths;
      for (const auto& file : files) paths.push_back(path / file);
      named = unshard_state(paths, model, parameter_descriptions(model, partition), saved_layout,
                            saved_parts, dir);
    } else {
      for (const auto& file : files) {
        for (auto& entry : model::load_safetensors((path / file).string())) named.push_back(entry);
      }
    }
    if (optimizer != nullptr) {
      optimizer->load_state(named, optimizer_step, dir);
    } else {
      std::vector<std::string> names;
      for (const auto& item : model->named_parameters()) names.push_back(item.key());
      zero->load_full_state(named, names, optimizer_step, dir);
    }
  }
  return state;
}

std::string resolve_resume_dir(const config::CheckpointOptions& options, std::string* note) {
  if (options.resume.empty()) return "";
  std::error_code ec;
  if (options.resume != "latest") {
    const fs::path given(options.resume);
    if (given.is_relative() && !options.dir.empty()) {
      const fs::path under_dir = fs::path(options.dir) / given;
      if (fs::is_directory(under_dir, ec)) return under_dir.string();
    }
    if (fs::is_directory(given, ec)) return given.string();
    throw UserError("checkpoint.resume: " + options.resume + " not found" +
                    (given.is_relative() && !options.dir.empty()
                         ? " (looked in " + options.dir + "/ and the working directory)"
                         : ""));
  }
  int64_t best = -1;
  std::string best_path;
  if (!options.dir.empty() && fs::is_directory(options.dir, ec)) {
    for (const auto& entry : fs::directory_iterator(options.dir, ec)) {
      std::smatch match;
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && std::regex_match(name, match, step_dir_pattern())) {
        const int64_t step = std::stoll(match[1]);
        if (step > best) best = step, best_path = entry.path().string();
      }
    }
  }
  if (best_path.empty() && note != nullptr) {
    *note = "checkpoint.resume: latest found no step-<N> checkpoint in '" + options.dir +
            "'; starting from step 0";
  }
  return best_path;
}

}  // namespace ulysses::train
