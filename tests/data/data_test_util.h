// Helpers for the data tests: a temporary directory removed on scope exit, and an expectation that
// a call throws UserError whose message holds given fragments.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/remove_tree.h"

namespace ulysses::data::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "ulysses-data-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    ulysses::remove_tree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// EXPECTs that `call` throws ulysses::UserError, one line, containing every fragment.
inline void expect_user_error(const std::function<void()>& call,
                              const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "expected UserError containing '" << fragments.front() << "'";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "'" << message << "' lacks '" << fragment << "'";
    }
  }
}

}  // namespace ulysses::data::test
