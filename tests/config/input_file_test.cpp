// The size cap on YAML and JSON inputs (common/input_file.h): a file over 16 MiB is refused in one
// line naming it and the cap before anything parses it, whether it says its size (a sparse file)
// or not (/dev/zero); HF config.json and run configs go through it.
#include "common/input_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "config/hf_config.h"
#include "config/run_config.h"
#include "config_test_util.h"

namespace ulysses::config {
namespace {

using testing::expect_user_error;
using testing::expect_user_error_prefix;
using testing::TempDir;

// A file of `bytes` zero bytes that takes no disk space.
std::string sparse_file(const TempDir& dir, const std::string& name, int64_t bytes) {
  const std::string path = dir.write(name, "");
  std::filesystem::resize_file(path, static_cast<uintmax_t>(bytes));
  return path;
}

constexpr int64_t kOver = kMaxInputFileBytes + (int64_t{1} << 20);  // 17 MiB

TEST(InputFile, OverTheCapIsOneLineNamingTheFileAndTheCap) {
  TempDir dir;
  const std::string big = sparse_file(dir, "big.json", kOver);
  expect_user_error([&] { read_input_file(big, "a JSON file"); },
                    big + ": 17.0 MiB is over the 16 MiB limit of a JSON file");
  // A file that does not say its size is read up to the cap and no further.
  expect_user_error_prefix([&] { read_input_file("/dev/zero", "a JSON file"); }, "/dev/zero: 16.");
  expect_user_error([&] { read_input_file(dir.path() + "/missing.json", "a JSON file"); },
                    dir.path() + "/missing.json: cannot read file");
}

TEST(InputFile, AtTheCapIsReadWhole) {
  TempDir dir;
  EXPECT_EQ(read_input_file(dir.write("small.yaml", "a: 1\n"), "a YAML document"), "a: 1\n");
  const std::string full = sparse_file(dir, "full.json", kMaxInputFileBytes);
  EXPECT_EQ(read_input_file(full, "a JSON file").size(), static_cast<size_t>(kMaxInputFileBytes));
  const std::string tiny = dir.write("tiny.json", "12345");
  expect_user_error([&] { read_input_file(tiny, "a JSON file", 4); },
                    tiny + ": 5 bytes is over the 4 bytes limit of a JSON file");
}

TEST(InputFile, HfConfigAndRunConfigAreCapped) {
  TempDir dir;
  const std::string config_json = sparse_file(dir, "config.json", kOver);
  expect_user_error([&] { read_hf_config(dir.path()); },
                    config_json + ": 17.0 MiB is over the 16 MiB limit of a JSON file");
  const std::string run_yaml = sparse_file(dir, "run.yaml", kOver);
  expect_user_error([&] { load_run_config(run_yaml); },
                    run_yaml + ": 17.0 MiB is over the 16 MiB limit of a YAML document");
}

}  // namespace
}  // namespace ulysses::config
