// HF safetensors weights <-> LlamaForCausalLM (see hf_weights.h).
#include "model/hf_weights.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "model/safetensors.h"

namespace ulysses::model {
namespace {

namespace fs = std::filesystem;

std::string shape_string(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// The weight files of an HF directory: those the index lists, else model.safetensors, else all.
std::vector<std::string> weight_files(const std::string& dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    const std::string text = read_input_file(index_path.string(), "a JSON file");
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(index_path.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw UserError(index_path.string() + ": has no \"weight_map\" object");
    }
    std::set<std::string> unique;
    for (const auto& file : index["weight_map"]) {
      if (!file.is_string()) {
        throw UserError(index_path.string() + ": weight_map value not a string");
      }
      const fs::path name(file.get<std::string>());
      // A shard is a file of this directory or below: never absolute, never through "..".
      const bool escapes = name.empty() || name.is_absolute() ||
                           std::any_of(name.begin(), name.end(),
                                       [](const fs::path& part) { return part == ".."; });
      if (escapes) {
        throw UserError(index_path.string() + ": weight_map file '" + name.string() +
                        "' is not a path inside the model directory");
      }
      unique.insert(name.string());
    }
    for (const auto& file : unique) files.push_back((fs::path(dir) / file).string());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    files.push_back((fs::path(dir) / "model.safetensors").string());
  } else {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    }
    if (ec) throw UserError(dir + ": cannot list the model directory: " + ec.message());
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) throw UserError(dir + ": no *.safetensors weight files");
  return files;
}

// The PyTorch pickle weight files of `dir` (pytorch_model*.bin and their index), sorted.
std::vector<std::string> bin_weight_files(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("pytorch_model", 0) == 0 &&
        (entry.path().extension() == ".bin" || name == "pytorch_model.bin.index.json")) {
      found.push_back(name);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

bool ignored(const std::string& name, bool tied) {
  const std::string rotary_suffix = "rotary_emb.inv_freq";
  return (tied && name == "lm_head.weight") ||
         (name.size() >= rotary_suffix.size() &&
          name.compare(name.size() - rotary_suffix.size(), rotary_suffix.size(), rotary_suffix) ==
              0);
}

}  // namespace

void check_hf_weight_files(const std::string& dir) {
  const bool has_index = fs::exists(fs::path(dir) / "model.safetensors.index.json");
  bool has_safetensors = has_index;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    has_safetensors = has_safetensors || entry.path().extension() == ".safetensors";
  }
  if (!has_safetensors) {
    const std::vector<std::string> bins = bin_weight_files(dir);
    if (!bins.empty()) {
      throw UserError(dir + ": holds PyTorch .bin weights (" + bins.front() +
                      (bins.size() > 1 ? ", ..." : "") +
                      ") and no *.safetensors; ulysses-train reads safetensors: save the model "
                      "with transformers' save_pretrained (safetensors by default) first");
    }
  }
  for (const std::string& file : weight_files(dir)) {
    if (!fs::exists(file)) {
      throw UserError(file + ": is missing" +
                      (has_index ? " (model.safetensors.index.json lists it)" : std::string()));
    }
    load_safetensors_metadata(file);  // the header parses and its offsets fit the file
  }
}

void load_hf_weights(LlamaForCausalLM& model, const std::string& dir) {
  std::map<std::string, at::Tensor> params;
  for (auto& item : model->named_parameters(/*recurse=*/true)) params[item.key()] = item.value();
  const bool tied = model->options().tie_embeddings;
  std::set<std::string> loaded;

  torch::NoGradGuard no_grad;
  for (const std::string& file : weight_files(dir)) {
    for (auto& [name, tensor] : load_safetensors(file)) {
      if (ignored(name, tied)) continue;
      auto param = params.find(name);
      if (param == params.end()) {
        throw UserError(file + ": tensor '" + name + "' is not a parameter of this model " +
                        "(check model.num_layers / tie_embeddings)");
      }
      if (!loaded.insert(name).second) {
        throw UserError(file + ": tensor '" + name + "' appears in more than one file");
      }
      if (tensor.sizes() != param->second.sizes()) {
        throw UserError(file + ": tensor '" + name + "' has shape " + shape_string(tensor.sizes()) +
                        ", the model expects " + shape_string(param->second.sizes()));
      }
      param->second.copy_(tensor);
    }
  }
  for (const auto& item : params) {
    if (!loaded.count(item.first)) {
      throw UserError(dir + ": tensor '" + item.first + "' is missing from the weight files");
    }
  }
}

HfWeightIndex::HfWeightIndex(
    const std::string& dir, const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
    bool tied) {
  std::map<std::string, std::vector<int64_t>> expected(params.begin(), params.end());
  for (const std::string& file : weight_files(dir)) {
    for (SafetensorsTensor& tensor : read_safetensors_tensors(file)) {
      if (ignored(tensor.name, tied)) continue;
      auto param = expected.find(tensor.name);
      if (param == expected.end()) {
        throw UserError(file + ": tensor '" + tensor.name + "' is not a parameter of this model " +
                        "(check model.num_layers / tie_embeddings)");
      }
      if (tensors_.count(tensor.name)) {
        throw UserError(file + ": tensor '" + tensor.name + "' appears in more than one file");
      }
      if (tensor.shape != param->second) {
        throw UserError(file + ": tensor '" + tensor.name + "' has shape " +
                        shape_string(tensor.shape) + ", the model expects " +
                        shape_string(param->second));
      }
      const std::string name = tensor.name;
      tensors_.emplace(name, Located{file, std::move(tensor)});
    }
  }
  for (const auto& [name, shape] : params) {
    if (!tensors_.count(name)) {
      throw UserError(dir + ": tensor '" + name + "' is missing from the weight files");
    }
  }
}

void HfWeightIndex::read(const std::string& name, int64_t begin, at::Tensor out) const {
  constexpr int64_t kReadBytes = int64_t{4} << 20;
  const Located& located = tensors_.at(name);
  const auto element = static_cast<int64_t>(c10::elementSize(located.tensor.dtype));
  const int64_t step = std::max<int64_t>(kReadBytes / element, 1);
  at::NoGradGuard no_grad;
  for (int64_t done = 0; done < out.numel(); done += step) {
    const int64_t count = std::min(step, out.numel() - done);
    at::Tensor stored = at::empty({count}, at::TensorOptions().dtype(located.tensor.dtype));
    read_safetensors_range(located.file, located.tensor, begin + done, stored);
    out.narrow(0, done, count).copy_(stored);
  }
}

std::vector<std::pair<std::string, at::Tensor>> hf_state(LlamaForCausalLM& model) {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    state.emplace_back(item.key(), item.value().detach());
  }
  return state;
}

}  // namespace ulysses::model
