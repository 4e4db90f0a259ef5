// The newcomer's view, through the real binaries: the reference in docs/ matches what the code
// writes (every run-config key, every metrics/summary/eval field), and errors found before ranks
// start are one line (launch checks the inputs before starting ranks; a trainer rank other than
// a node's first stays quiet about bad input); small messages: --nproc bounds, model.load's log.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/paths.h"
#include "config/field_docs.h"
#include "support/test_files.h"

namespace fs = std::filesystem;

namespace ulysses {
namespace {

using testing::read_text;

std::string bin(const std::string& name) {
  const char* dir = std::getenv("ULYSSES_BIN_DIR");
  return (fs::path(dir && *dir ? dir : executable_dir()) / name).string();
}

std::string tiny_cpu() { return project_home() + "/experiments/runs/tiny-cpu.yaml"; }

struct Result {
  int status = -1;
  std::string output;  // stdout + stderr
};

Result run_shell(const std::string& command) {
  Result r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) r.output.append(buffer, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return r;
}

int64_t line_count(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// ---------------------------------------------------------------------------------------------
// docs/

TEST(DocsPages, PrintConfigReferenceEqualsTheCommittedPage) {
  const Result r = run_shell(bin("ulysses-train") + " --print-config-reference");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, read_text(project_home() + "/docs/run-config.md"))
      << "regenerate: build/bin/ulysses-train --print-config-reference > docs/run-config.md";
}

// Adds "prefix.key" for every key of `object`, and recurses into objects and lists of objects
// ("eval.buckets[].loss"); `phases` maps name -> ms and is checked separately.
void collect_fields(const nlohmann::json& object, const std::string& prefix,
                    std::set<std::string>* out) {
  for (const auto& [key, value] : object.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    out->insert(path);
    if (key == "phases" || key == "phases_ms_median") continue;
    if (value.is_object()) collect_fields(value, path, out);
    if (value.is_array() && !value.empty() && value[0].is_object()) {
      collect_fields(value[0], path + "[]", out);
    }
  }
}

// A short run with evaluation, a known peak (so MFU fields appear) and the optimizer offloaded (so
// its fields appear): every field of metrics.jsonl (steps and eval records) and summary.json is in
// docs/outputs.md as `field`.
TEST(DocsOutputs, EveryFieldARunWritesIsDocumented) {
  testing::TempDir dir("docs-outputs");
  const Result r = run_shell(
      "cd " + dir.path().string() + " && " + bin("ulysses-train") + " --config " + tiny_cpu() +
      " --set mesh.dp=1 --set mesh.sp=1 --set train.steps=2 --set sequence.length=64" +
      " --set eval.source=synthetic --set profile.peak_tflops=1 --set output.dir=out" +
      " --set memory.offload_optimizer=true");
  ASSERT_EQ(r.status, 0) << r.output;
  std::set<std::string> fields, phases;
  std::ifstream metrics(dir.path() / "out" / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line); ++records) {
    const auto record = nlohmann::json::parse(line);
    collect_fields(record, "", &fields);
    if (record.contains("phases")) {
      for (const auto& [name, ms] : record["phases"].items()) phases.insert(name);
    }
  }
  EXPECT_EQ(records, 3);  // two steps, one evaluation
  collect_fields(nlohmann::json::parse(read_text(dir.path() / "out" / "summary.json")), "",
                 &fields);
  const std::string doc = read_text(project_home() + "/docs/outputs.md");
  for (const auto& field : fields) {
    EXPECT_NE(doc.find("`" + field + "`"), std::string::npos)
        << field << " is written but not documented in docs/outputs.md";
  }
  EXPECT_TRUE(fields.count("offload.last_step_uploads.blocking"));
  EXPECT_FALSE(phases.empty());
  for (const auto& phase : phases) {
    EXPECT_NE(doc.find("`" + phase + "`"), std::string::npos) << "phase " << phase;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input found before ranks start: one line, exit 2

struct BadInput {
  std::string set;             // --set for tiny-cpu.yaml
  std::string message_prefix;  // the one line printed
};

std::vector<BadInput> bad_inputs(const fs::path& dir) {
  return {{"data.source=tokens:" + (dir / "missing.bin").string(),
           "error: data.source: " + (dir / "missing.bin").string() + ": cannot open"},
          {"eval.source=megatron:" + (dir / "nothing").string(), "error: eval.source: "},
          {"checkpoint.resume=" + (dir / "step-7").string(),
           "error: checkpoint.resume: " + (dir / "step-7").string() + " not found"},
          {"train.device=cuda", "error: train.device: cuda requested but"}};
}

TEST(LaunchChecksInputs, BadInputIsOneLineBeforeAnyRankStarts) {
  testing::TempDir dir("docs-launch");
  // A trainer that leaves a mark when a rank starts: none may start.
  const fs::path trainer = dir.path() / "trainer.sh";
  testing::write_executable(trainer, "#!/bin/sh\ntouch " + (dir.path() / "started").string() +
                                         "\nexit 0\n");
  for (const BadInput& bad : bad_inputs(dir.path())) {
    const Result r = run_shell(bin("ulysses-tune") + " launch " + tiny_cpu() +
                               " --nproc 4 --trainer " + trainer.string() + " --set " + bad.set);
    EXPECT_EQ(r.status, kExitUsage) << bad.set << "\n" << r.output;
    EXPECT_EQ(r.output.rfind(bad.message_prefix, 0), 0u) << bad.set << "\n" << r.output;
    EXPECT_EQ(line_count(r.output), 1) << bad.set << "\n" << r.output;
    EXPECT_FALSE(fs::exists(dir.path() / "started")) << bad.set;
  }
  // --print lines are for a cluster whose files and devices are not these: not checked.
  const Result print = run_shell(bin("ulysses-tune") + " launch " + tiny_cpu() +
                                 " --nproc 4 --print torchrun --set train.device=cuda");
  EXPECT_EQ(print.status, 0) << print.output;
}

// Weights and tokens that would fail only once the ranks run: a model directory with PyTorch .bin
// weights only, an index naming a shard that is missing, a token outside the vocabulary in a
// sample of the run's third step. Each is one line before any rank starts, and the run's output
// directory is not created.
TEST(LaunchChecksInputs, WeightsAndTokensAreCheckedBeforeAnyRankStartsAndLeaveNoFiles) {
  testing::TempDir dir("docs-inputs");
  const fs::path trainer = dir.path() / "trainer.sh";
  testing::write_executable(trainer, "#!/bin/sh\ntouch " + (dir.path() / "started").string() +
                                         "\nexit 0\n");
  // An HF model directory: the weights a one-rank run saves before its first step.
  const Result save = run_shell("cd " + dir.path().string() + " && " + bin("ulysses-train") +
                                " --config " + tiny_cpu() +
                                " --set mesh.dp=1 --set mesh.sp=1 --set sequence.length=32"
                                " --set train.steps=1 --set checkpoint.dir=ckpt"
                                " --set checkpoint.save_initial=true --set output.dir=saved");
  ASSERT_EQ(save.status, 0) << save.output;
  const fs::path initial = dir.path() / "ckpt" / "initial";
  ASSERT_TRUE(fs::exists(initial / "model.safetensors")) << save.output;

  const fs::path bin_only = dir.path() / "bin-only";
  fs::create_directories(bin_only);
  fs::copy_file(initial / "config.json", bin_only / "config.json");
  std::ofstream(bin_only / "pytorch_model.bin") << "pickled";

  const fs::path sharded = dir.path() / "sharded";
  fs::create_directories(sharded);
  fs::copy_file(initial / "config.json", sharded / "config.json");
  fs::copy_file(initial / "model.safetensors", sharded / "model-00001-of-00002.safetensors");
  std::ofstream(sharded / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"model.embed_tokens.weight": )"
      << R"("model-00001-of-00002.safetensors", "lm_head.weight": )"
      << R"("model-00002-of-00002.safetensors"}})";

  // 4096 uint16 tokens in the vocabulary (1024) but one: sample 5 (step 3 of a 2 x 2 mesh at
  // 256 tokens, global batch 2) holds 1024 at its token 10.
  std::vector<uint16_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 1000);
  tokens[5 * 256 + 10] = 1024;
  const fs::path token_file = dir.path() / "tokens.bin";
  std::ofstream(token_file, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));

  const std::vector<BadInput> cases = {
      {"model.preset= --set model.load=" + bin_only.string(),
       "error: model.load: " + bin_only.string() + ": holds PyTorch .bin weights"},
      {"model.preset= --set model.load=" + sharded.string(),
       "error: model.load: " + (sharded / "model-00002-of-00002.safetensors").string() +
           ": is missing (model.safetensors.index.json lists it)"},
      {"data.source=tokens:" + token_file.string(),
       "error: data.source: " + token_file.string() + ": token 1024"}};
  int index = 0;
  for (const BadInput& bad : cases) {
    const fs::path out = dir.path() / ("out-" + std::to_string(index++));
    const Result r = run_shell(bin("ulysses-tune") + " launch " + tiny_cpu() +
                               " --nproc 4 --trainer " + trainer.string() + " --set " + bad.set +
                               " --set output.dir=" + out.string());
    EXPECT_EQ(r.status, kExitUsage) << bad.set << "\n" << r.output;
    EXPECT_EQ(r.output.rfind(bad.message_prefix, 0), 0u) << bad.set << "\n" << r.output;
    EXPECT_EQ(line_count(r.output), 1) << bad.set << "\n" << r.output;
    EXPECT_FALSE(fs::exists(dir.path() / "started")) << bad.set;
    EXPECT_FALSE(fs::exists(out)) << bad.set << ": the run's output directory was created";
  }
}

// A trainer rank meeting bad input before its rendezvous: the node's first rank prints the one
// line, the others exit 2 in silence (they would all print the same line otherwise). The peers
// never start, so a check done after the rendezvous would hang here until comm.timeout_s.
TEST(TrainerRanks, OnlyTheFirstRankOfANodeReportsBadInput) {
  testing::TempDir dir("docs-ranks");
  for (const BadInput& bad : bad_inputs(dir.path())) {
    for (int rank : {0, 1, 3}) {
      const std::string env = "RANK=" + std::to_string(rank) + " LOCAL_RANK=" +
                              std::to_string(rank) + " WORLD_SIZE=4 LOCAL_WORLD_SIZE=4" +
                              " MASTER_ADDR=127.0.0.1 MASTER_PORT=1 ";
      const Result r = run_shell(env + bin("ulysses-train") + " --config " + tiny_cpu() +
                                 " --set comm.timeout_s=20 --set " + bad.set);
      EXPECT_EQ(r.status, kExitUsage) << "rank " << rank << " " << bad.set << "\n" << r.output;
      if (rank == 0) {
        EXPECT_EQ(r.output.rfind(bad.message_prefix, 0), 0u) << bad.set << "\n" << r.output;
        EXPECT_EQ(line_count(r.output), 1) << r.output;
      } else {
        EXPECT_EQ(r.output, "") << "rank " << rank << " " << bad.set;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Small messages

TEST(LaunchOptions, NprocZeroNamesARealBound) {
  for (const char* value : {"0", "-3", "many"}) {
    const Result r =
        run_shell(bin("ulysses-tune") + " launch " + tiny_cpu() + " --nproc " + value);
    EXPECT_EQ(r.status, kExitUsage) << r.output;
    EXPECT_NE(r.output.find("--nproc: must be an integer >= 1, got '" + std::string(value) + "'"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("e+308"), std::string::npos) << r.output;
  }
  const Result nodes = run_shell(bin("ulysses-tune") + " launch " + tiny_cpu() +
                                 " --nproc 1 --nnodes 0");
  EXPECT_NE(nodes.output.find("--nnodes: must be an integer >= 1, got '0'"), std::string::npos)
      << nodes.output;
}

// A model.load run names the model directory it loaded in its startup line, not "model inline".
TEST(TrainerLog, ModelLoadRunNamesTheDirectory) {
  testing::TempDir dir("docs-load");
  const std::string common = " --set mesh.dp=1 --set mesh.sp=1 --set sequence.length=32";
  // An HF model directory: the weights a run saves before its first step.
  const Result save = run_shell("cd " + dir.path().string() + " && " + bin("ulysses-train") +
                                " --config " + tiny_cpu() + common +
                                " --set train.steps=1 --set checkpoint.dir=ckpt"
                                " --set checkpoint.save_initial=true --set output.dir=out1");
  ASSERT_EQ(save.status, 0) << save.output;
  const std::string model_dir = (dir.path() / "ckpt" / "initial").string();
  const Result r = run_shell("cd " + dir.path().string() + " && " + bin("ulysses-train") +
                             " --config " + tiny_cpu() + common + " --set model.preset= " +
                             " --set model.load=" + model_dir +
                             " --set train.steps=1 --set output.dir=out2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("model inline"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(model_dir), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ulysses
