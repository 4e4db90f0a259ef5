// Files in tests: a temporary directory removed with its contents, reading a file whole, writing
// an executable script.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include "common/remove_tree.h"

namespace ulysses::testing {

// A fresh directory <tmp>/<prefix>-XXXXXX, removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ulysses-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    ulysses::remove_tree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The whole file, "" when it cannot be read.
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every regular file under `dir`: its path relative to `dir` ('/'-separated) -> its bytes. Two
// snapshots compare equal when nothing under `dir` was added, removed or changed.
inline std::map<std::string, std::string> snapshot_files(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[entry.path().lexically_relative(dir).generic_string()] = read_text(entry.path());
    }
  }
  return files;
}

// Writes `text` to `path` and makes it executable by its owner.
inline void write_executable(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
}

}  // namespace ulysses::testing
