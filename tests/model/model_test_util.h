// Helpers shared by the model tests: a tiny model config and a self-removing temp directory.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config/options.h"
#include "common/remove_tree.h"

namespace ulysses::model::testing {

// h=16, L=2, hq=4, hkv=2, hd=4, ffn=24, V=37.
inline config::ModelOptions tiny_options(bool tied = false, uint64_t seed = 1234) {
  config::ModelOptions o;
  o.hidden_size = 16;
  o.num_layers = 2;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 4;
  o.intermediate_size = 24;
  o.vocab_size = 37;
  o.tie_embeddings = tied;
  o.init_seed = seed;
  o.init_std = 0.2;  // large enough that attention is far from uniform
  return o;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "ulysses-model-test-XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    path_ = mkdtemp(buf.data());
  }
  ~TempDir() {
    std::error_code ec;
    ulysses::remove_tree(path_);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ulysses::model::testing
