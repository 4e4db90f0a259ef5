// The data an experiment's trials train on (its base.data.source): synthetic tokens, a flat token
// file or a Megatron indexed dataset, such as the ones prepare/prepare_data.py writes. With packed
// documents a trial's attention cost depends on the real document lengths, so the sweep records
// which data it measured (its environment's "data"), refuses to resume on changed data, and the
// report and recommend name it.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "config/options.h"

namespace ulysses::experiment {

struct TrainingData {
  std::string source = "synthetic";  // as the trials read it: synthetic | tokens:PATH | megatron:PREFIX
  std::string kind = "synthetic";    // synthetic | tokens | megatron
  std::string path;                  // the file or prefix ("" for synthetic)
  int64_t sequences = 0;             // megatron: documents in the index
  int64_t tokens = 0;                // megatron: tokens in the index
  bool loss_mask = false;            // megatron: PREFIX_loss_mask.{bin,idx} beside it, read
                                     // (data.loss_mask not ignore)
  std::string manifest_path;         // the prepared directory's manifest.json naming this prefix
  nlohmann::ordered_json manifest;   // from it: mode, tokenizer path and sha256, document-length
                                     // histogram (empty when there is no manifest)
  std::string digest;                // digest_of the indexes, and the data files' sizes, first
                                     // and last MiB ("" for synthetic)
  uint64_t seed = 0;                 // synthetic: data.seed
  bool packed = false;               // data.pack: documents packed with their own positions
  std::string packing = "windows";   // data.packing: windows of the stream | whole documents
};

// Reads what `data.source` names (an absolute or working-directory-relative path). Throws
// UserError("<key>: <what>") when its files are missing or its index is broken, or when a
// manifest.json beside it cannot be parsed.
TrainingData read_training_data(const config::DataOptions& data, const std::string& key);

// What a sweep stores of it: source, kind, packing, packed, and for files sequences, tokens, loss_mask,
// digest and the manifest's path, mode, tokenizer (path, sha256) and document-length histogram;
// synthetic data also its seed.
nlohmann::ordered_json training_data_json(const TrainingData& data);

// One sentence naming the data of a stored training_data_json ("synthetic tokens (seed 0)" when
// the JSON is missing or empty: sweeps recorded before data was stored ran synthetic tokens
// unless their experiment said otherwise).
std::string training_data_sentence(const nlohmann::ordered_json& stored);

}  // namespace ulysses::experiment
