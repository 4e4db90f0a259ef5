// ulysses-train's command line: bad model/mesh combinations and bad input fail before training
// with exit status 2 and one line naming the key; a good config runs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/paths.h"
#include "common/remove_tree.h"

namespace {

struct Result {
  int status = -1;
  std::string output;  // stdout + stderr
};

std::string trainer() { return ulysses::sibling_binary("ulysses-train"); }

std::string example() { return ulysses::project_home() + "/experiments/runs/tiny-cpu.yaml"; }

Result run(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + trainer() + " " + args + " 2>&1";
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

// Exactly one line of output, starting with "error: " and naming `key`.
void expect_one_line_error(const Result& r, const std::string& key) {
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "more than one line: " << r.output;
  EXPECT_NE(r.output.find(key), std::string::npos) << r.output;
}

TEST(TrainCli, MeshNotMatchingWorldFailsBeforeAnyRankStarts) {
  // world 1 from the environment, mesh 2 x 2 in the file
  expect_one_line_error(run("--config " + example()), "mesh");
}

TEST(TrainCli, QueryHeadsNotDivisibleBySpFails) {
  expect_one_line_error(
      run("--config " + example() + " --set mesh.dp=1 --set mesh.sp=3 --set model.num_heads=8",
          "WORLD_SIZE=3 RANK=0"),
      "model.num_heads");
}

TEST(TrainCli, KvHeadsIncompatibleWithSpFails) {
  // hkv 3 with sp 2: neither divides the other
  expect_one_line_error(run("--config " + example() +
                                " --set mesh.dp=1 --set mesh.sp=2 --set model.num_heads=6 "
                                "--set model.num_kv_heads=3 --set model.head_dim=32 --set model.hidden_size=192",
                            "WORLD_SIZE=2 RANK=0"),
                        "model.num_kv_heads");
}

TEST(TrainCli, UnknownKeyAndMissingFileFail) {
  expect_one_line_error(run("--config " + example() + " --set memory.tiled_mpl=2"),
                        "memory.tiled_mpl");
  expect_one_line_error(run("--config /nonexistent/run.yaml"), "/nonexistent/run.yaml");
}

TEST(TrainCli, SingleRankRunWritesMetrics) {
  const auto out = std::filesystem::temp_directory_path() / "ulysses-cli-test-run";
  ulysses::remove_tree(out);
  Result r = run("--config " + example() +
                 " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=2 --set sequence.length=64"
                 " --set output.dir=" + out.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out / "metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(out / "summary.json"));
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;
  ulysses::remove_tree(out);
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(TrainCli, RunEchoesItsEffectiveConfigAndWritesARunYamlThatRunsAgain) {
  const auto out = std::filesystem::temp_directory_path() / "ulysses-cli-test-echo";
  ulysses::remove_tree(out);
  Result r = run("--config " + example() +
                 " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=1 --set sequence.length=60"
                 " --set memory.tiled_mlp=auto --set output.dir=" + (out / "a").string() +
                 " --set checkpoint.dir=" + (out / "ckpt").string());
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* fragment :
       {"effective config", "sequence 60 tokens (padded 60", "tiled_mlp auto -> 1 tiles",
        "offload_optimizer off", "defaults taken:", "data.seed=0", "saved checkpoint",
        "done: outputs in"}) {
    EXPECT_NE(r.output.find(fragment), std::string::npos) << fragment << "\n" << r.output;
  }
  const std::string summary = read_text(out / "a" / "summary.json");
  EXPECT_NE(summary.find("\"tiled_mlp_tiles\": 1"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"padded_length\": 60"), std::string::npos) << summary;
  // run.yaml loads back as a run config: the same run again from it.
  Result again = run("--config " + (out / "a" / "run.yaml").string() +
                     " --set output.dir=" + (out / "b").string());
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(read_text(out / "a" / "run.yaml").find("output:\n  dir: " + (out / "a").string()) ==
                std::string::npos,
            false);
  ulysses::remove_tree(out);
}

TEST(TrainCli, ResumeLatestWithoutACheckpointSaysSo) {
  const auto out = std::filesystem::temp_directory_path() / "ulysses-cli-test-latest";
  ulysses::remove_tree(out);
  std::filesystem::create_directories(out / "ckpt");
  Result r = run("--config " + example() +
                 " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=1 --set sequence.length=32"
                 " --set checkpoint.resume=latest --set checkpoint.dir=" + (out / "ckpt").string() +
                 " --set output.dir=" + (out / "a").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint.resume: latest found no step-<N> checkpoint"),
            std::string::npos)
      << r.output;
  ulysses::remove_tree(out);
}

}  // namespace
