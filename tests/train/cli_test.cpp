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
#include "support/test_files.h"

namespace {

struct Result {
  int status = -1;
  std::string output;  // stdout + stderr
};

std::string trainer() { return ulysses::sibling_binary("ulysses-train"); }

std::string example() { return ulysses::project_home() + "/experiments/runs/tiny-cpu.yaml"; }

// Runs a shell command line, stdout and stderr together.
Result run_command(const std::string& line) {
  const std::string cmd = line + " 2>&1";
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

Result run(const std::string& args, const std::string& env = "") {
  return run_command(env + " " + trainer() + " " + args);
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
  const Result r =
      run("--config " + example() + " --set mesh.dp=1 --set mesh.sp=3 --set model.num_heads=8",
          "WORLD_SIZE=3 RANK=0");
  expect_one_line_error(r, "model.num_heads");
  // The line names the key that allows the split, and the key it is about.
  EXPECT_EQ(r.output.rfind("error: mesh.sp: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("mesh.uneven_heads: true"), std::string::npos) << r.output;
}

TEST(TrainCli, UnevenHeadsStillNeedAQueryHeadPerRank) {
  expect_one_line_error(run("--config " + example() +
                                " --set mesh.dp=1 --set mesh.sp=4 --set model.num_heads=2 "
                                "--set model.num_kv_heads=1 --set mesh.uneven_heads=true",
                            "WORLD_SIZE=4 RANK=0"),
                        "mesh.uneven_heads");
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

// summary.json names the start-up baseline the peak counts from, measured on CPU too: the
// resident set before the model was built, below the run's peak; and the peak address space above
// the start-up address space, which a limit caps.
TEST(TrainCli, SummaryRecordsTheMeasuredStartupBaseline) {
  const auto out = std::filesystem::temp_directory_path() / "ulysses-cli-test-baseline";
  for (const std::string limit : {"0", "2"}) {
    SCOPED_TRACE("memory.limit_gib=" + limit);
    ulysses::remove_tree(out);
    Result r = run("--config " + example() +
                   " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=1 --set sequence.length=64"
                   " --set memory.limit_gib=" + limit + " --set output.dir=" + out.string());
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string summary = read_text(out / "summary.json");
    const auto at = summary.find("\"memory_baseline_bytes\": ");
    ASSERT_NE(at, std::string::npos) << summary;
    const long long baseline = std::stoll(summary.substr(at + 25));
    const auto peak_at = summary.find("\"peak_mem_bytes\": ");
    ASSERT_NE(peak_at, std::string::npos) << summary;
    const long long peak = std::stoll(summary.substr(peak_at + 18));
    EXPECT_GT(baseline, 10ll << 20) << summary;  // LibTorch alone is more than 10 MiB resident
    EXPECT_LT(baseline, peak) << summary;
    // And the address space above the start-up size, what the limit caps on CPU: within it.
    const auto space_at = summary.find("\"max_rank_peak_address_space_bytes\": ");
    ASSERT_NE(space_at, std::string::npos) << summary;
    const long long space = std::stoll(summary.substr(space_at + 37));
    EXPECT_GT(space, 0) << summary;  // the model, its gradients and AdamW's moments at least
    if (limit != "0") {
      EXPECT_LE(space, std::stoll(limit) << 30) << summary;
    }
  }
  ulysses::remove_tree(out);
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
                     " --set output.dir=" + (out / "b").string() +
                     " --set checkpoint.dir=" + (out / "ckpt-b").string());
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

// Saves of one run never replace another run's checkpoints unless checkpoint.overwrite says so:
// a fresh start into a used directory, and a resume of run A into run B's directory (which would
// have replaced B's step-4) stop before step 1 with B's files byte-identical; a resume of A into
// A's own directory rewrites its later checkpoints.
TEST(TrainCli, CheckpointsOfAnotherRunAreNeverReplacedUnlessAsked) {
  const auto out = std::filesystem::temp_directory_path() / "ulysses-cli-test-ckpt-owner";
  ulysses::remove_tree(out);
  const std::string common = "--config " + example() +
                             " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=4 "
                             "--set sequence.length=32 --set checkpoint.every=2";
  auto train = [&](const std::string& ckpt, const std::string& extra) {
    return run(common + " --set checkpoint.dir=" + (out / ckpt).string() +
               " --set output.dir=" + (out / ("out-" + ckpt)).string() + " " + extra);
  };
  ASSERT_EQ(train("a", "").status, 0);
  ASSERT_EQ(train("b", "--set data.seed=7").status, 0);
  const auto b_before = ulysses::testing::snapshot_files(out / "b");
  ASSERT_TRUE(b_before.count("step-4/model.safetensors"));

  Result into_b = train("b", "--set checkpoint.resume=" + (out / "a/step-2").string());
  expect_one_line_error(into_b, "checkpoint.dir: " + (out / "b/step-4").string() +
                                    " holds a checkpoint of run ");
  EXPECT_NE(into_b.output.find("checkpoint.overwrite: true"), std::string::npos) << into_b.output;
  EXPECT_EQ(ulysses::testing::snapshot_files(out / "b"), b_before);
  expect_one_line_error(train("b", ""), "step-2 holds a checkpoint of run");  // a fresh start
  EXPECT_EQ(ulysses::testing::snapshot_files(out / "b"), b_before);

  // A's own resume rewrites A's step-4; with overwrite, B's are replaced.
  EXPECT_EQ(train("a", "--set checkpoint.resume=step-2").status, 0);
  Result forced = train("b", "--set checkpoint.resume=" + (out / "a/step-2").string() +
                                 " --set checkpoint.overwrite=true");
  EXPECT_EQ(forced.status, 0) << forced.output;
  EXPECT_NE(ulysses::testing::snapshot_files(out / "b"), b_before);
  ulysses::remove_tree(out);
}

// An output.dir or checkpoint.dir that cannot be written is found before step 1 (by the trainer
// and by the launcher's check before any rank starts), not at the first save.
TEST(TrainCli, UnwritableOutputOrCheckpointDirectoryStopsBeforeStepOne) {
  const auto out = std::filesystem::temp_directory_path() / "ulysses-cli-test-unwritable";
  ulysses::remove_tree(out);
  std::filesystem::create_directories(out);
  std::ofstream(out / "a-file") << "x";  // nothing can be created under a regular file
  const std::string common = "--config " + example() +
                             " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=3 "
                             "--set sequence.length=32";
  expect_one_line_error(run(common + " --set output.dir=" + (out / "ok").string() +
                            " --set checkpoint.dir=" + (out / "a-file/ckpt").string()),
                        "checkpoint.dir: " + (out / "a-file/ckpt").string() + ": not writable");
  EXPECT_FALSE(std::filesystem::exists(out / "ok/metrics.jsonl"));
  expect_one_line_error(run(common + " --set output.dir=" + (out / "a-file/out").string()),
                        "output.dir: " + (out / "a-file/out").string() + ": not writable");
  Result launched = run_command(ulysses::sibling_binary("ulysses-tune") + " launch " + example() +
                                " --nproc 1 --set mesh.dp=1 --set mesh.sp=1 --set checkpoint.dir=" +
                                (out / "a-file/ckpt").string());
  expect_one_line_error(launched, "checkpoint.dir: ");
  ulysses::remove_tree(out);
}

}  // namespace
