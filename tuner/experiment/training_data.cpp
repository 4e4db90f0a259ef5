// The data an experiment's trials train on (see training_data.h).
#include "tuner/experiment/training_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "data/loss_mask.h"
#include "data/megatron_index.h"
#include "data/source_spec.h"
#include "tuner/experiment/result_inputs.h"

namespace ulysses::experiment {
namespace {

namespace fs = std::filesystem;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A file's size, or a UserError naming `key` when it is missing or not a regular file.
uint64_t required_file_size(const std::string& path, const std::string& key) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw UserError(key + ": " + path + ": no such file");
  return fs::file_size(path, ec);
}

// A data file as digested: its size and its first and last MiB, enough to notice a file rewritten
// since a sweep started without reading gigabytes at every start (an index is read whole).
std::string data_file_sample(const std::string& path, const std::string& key) {
  constexpr uint64_t kEdge = 1 << 20;
  const uint64_t size = required_file_size(path, key);
  std::ifstream in(path, std::ios::binary);
  std::string head(std::min(size, kEdge), '\0'), tail(std::min(size, kEdge), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  in.seekg(static_cast<std::streamoff>(size - tail.size()));
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  return std::to_string(size) + '\0' + head + '\0' + tail + '\0';
}

// The manifest.json of a prepared directory when it names `prefix` among its outputs.
void read_manifest(const std::string& prefix, const std::string& key, TrainingData* data) {
  const fs::path manifest = fs::path(prefix).parent_path() / "manifest.json";
  std::error_code ec;
  if (!fs::is_regular_file(manifest, ec)) return;
  const auto m = nlohmann::ordered_json::parse(file_bytes(manifest.string()), nullptr, false);
  if (!m.is_object()) throw UserError(key + ": " + manifest.string() + ": not a JSON object");
  const std::string name = fs::path(prefix).filename().string();
  bool names_prefix = false;
  if (m.contains("outputs") && m["outputs"].is_object()) {
    for (const auto& [output, file] : m["outputs"].items()) {
      names_prefix = names_prefix || (file.is_string() && file.get<std::string>() == name);
    }
  }
  if (!names_prefix) return;  // a manifest of something else in the same directory
  data->manifest_path = manifest.string();
  nlohmann::ordered_json kept;
  for (const char* field : {"tool", "version", "mode"}) {
    if (m.contains(field)) kept[field] = m[field];
  }
  if (m.contains("tokenizer") && m["tokenizer"].is_object()) {
    for (const char* field : {"path", "sha256"}) {
      if (m["tokenizer"].contains(field)) kept["tokenizer"][field] = m["tokenizer"][field];
    }
  }
  if (m.contains("document_length_histogram")) {
    kept["document_length_histogram"] = m["document_length_histogram"];
  }
  data->manifest = kept;
}

// "1,234,567".
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

TrainingData read_training_data(const config::DataOptions& options, const std::string& key) {
  TrainingData data;
  data.seed = options.seed;
  data.packing = options.packing;
  data.packed = options.pack || options.packing == "documents";
  const data::SourceSpec spec = data::parse_source(options.source, key);
  data.source = options.source;
  data.kind = data::source_kind_name(spec.kind);
  data.path = spec.path;
  if (spec.kind == data::SourceKind::kTokens) {
    data.digest = digest_of(data_file_sample(spec.path, key));
  } else if (spec.kind == data::SourceKind::kMegatron) {
    std::string digested = data_file_sample(spec.path + ".bin", key);
    required_file_size(spec.path + ".idx", key);
    const data::MegatronIndex index = data::read_megatron_index(spec.path + ".idx", key);
    data.sequences = static_cast<int64_t>(index.sequence_lengths.size());
    for (int32_t length : index.sequence_lengths) data.tokens += length;
    digested += file_bytes(spec.path + ".idx");
    const std::string mask = data::find_loss_mask(spec.path, options.loss_mask, key);
    data.loss_mask = !mask.empty();
    if (data.loss_mask) {
      digested += '\0' + data_file_sample(mask + ".bin", key);
      required_file_size(mask + ".idx", key);
      digested += file_bytes(mask + ".idx");
    }
    data.digest = digest_of(digested);
    read_manifest(spec.path, key, &data);
  }
  return data;
}

nlohmann::ordered_json training_data_json(const TrainingData& data) {
  nlohmann::ordered_json j;
  j["source"] = data.source;
  j["kind"] = data.kind;
  j["packing"] = data.packing;
  j["packed"] = data.packed;
  if (data.kind == "synthetic") {
    j["seed"] = data.seed;
    return j;
  }
  if (data.kind == "megatron") {
    j["sequences"] = data.sequences;
    j["tokens"] = data.tokens;
    j["loss_mask"] = data.loss_mask;
  }
  j["digest"] = data.digest;
  if (!data.manifest_path.empty()) {
    j["manifest"] = data.manifest;
    j["manifest"]["path"] = data.manifest_path;
  }
  return j;
}

std::string training_data_sentence(const nlohmann::ordered_json& stored) {
  if (!stored.is_object() || !stored.contains("source")) {
    return "not recorded with this sweep (trials read their run config's data.source)";
  }
  const auto text = [&](const nlohmann::ordered_json& j, const char* field) {
    return j.contains(field) && j[field].is_string() ? j[field].get<std::string>() : std::string();
  };
  const auto number = [&](const char* field) {
    return stored.contains(field) && stored[field].is_number_integer() ? stored[field].get<int64_t>()
                                                                       : int64_t{0};
  };
  const bool packed = stored.value("packed", false);
  const std::string kind = text(stored, "kind");
  if (kind == "synthetic") {
    return "synthetic tokens (seed " + std::to_string(number("seed")) +
           (packed ? "), packed documents" : ")") +
           ": real document lengths (and their attention cost) were not measured";
  }
  std::string s = "`" + text(stored, "source") + "`";
  if (kind == "megatron") {
    s += ": " + grouped(number("tokens")) + " tokens in " + grouped(number("sequences")) +
         " documents";
    if (stored.value("loss_mask", false)) s += ", with a loss mask";
  }
  if (stored.contains("manifest") && stored["manifest"].is_object()) {
    const nlohmann::ordered_json& m = stored["manifest"];
    s += "; prepared";
    if (!text(m, "tool").empty()) s += " by " + text(m, "tool");
    if (!text(m, "mode").empty()) s += " in " + text(m, "mode") + " mode";
    if (m.contains("tokenizer") && m["tokenizer"].is_object()) {
      const std::string sha = text(m["tokenizer"], "sha256");
      s += " with the tokenizer " + text(m["tokenizer"], "path") +
           (sha.empty() ? "" : " (sha256 " + sha.substr(0, 12) + ")");
    }
    s += " (" + text(m, "path") + ")";
  }
  s += text(stored, "packing") == "documents"
           ? "; whole documents packed into each sequence"
           : packed ? "; windows of the stream, documents with their own positions"
                    : "; windows of the stream";
  return s;
}

}  // namespace ulysses::experiment
