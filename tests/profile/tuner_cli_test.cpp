// `ulysses-tune calibrate` and `ulysses-tune profile` end to end through the ulysses-tune
// binary (with the real ulysses-bench and ulysses-train), plus their pure parts: hardware
// profiles, benchmark JSON -> calibration rows. `profile` runs under a fake nsys script that
// runs the command it is given and "exports" the hand-built SQLite of nsys_fixture.h, so the
// whole pipeline is checked without Nsight Systems.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"
#include "common/paths.h"
#include "nsys_fixture.h"
#include "tuner/calibrate/bench_results.h"
#include "tuner/calibrate/hardware_profile.h"
#include "tuner/store/store.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses {
namespace {

std::string home() {
  const char* h = std::getenv("ULYSSES_HOME");
  return h ? h : ULYSSES_SOURCE_DIR;
}

// The binaries sit beside this test in build/bin (ctest also sets ULYSSES_BIN_DIR).
std::string bin(const std::string& name) {
  const char* dir = std::getenv("ULYSSES_BIN_DIR");
  return (fs::path(dir && *dir ? dir : executable_dir()) / name).string();
}

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

class TunerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tuner-cli-test-" + std::to_string(getpid()));
    ulysses::remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { ulysses::remove_tree(dir_); }
  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------
// Hardware profiles and benchmark JSON

TEST(HardwareProfiles, BundledProfilesLoad) {
  for (const char* name : {"cpu-local", "h100-sxm", "h200", "dgx-h100-8"}) {
    const auto p =
        calibrate::load_hardware_profile(home() + "/profiles/hardware/" + name + ".yaml");
    EXPECT_EQ(p.name, name);
    EXPECT_GT(p.peak_tflops("fp32"), 0.0) << name;
    EXPECT_GT(p.device_memory_gib, 0.0) << name;
  }
  const auto dgx = calibrate::load_hardware_profile(home() + "/profiles/hardware/dgx-h100-8.yaml");
  EXPECT_EQ(dgx.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(dgx.peak_tflops("bf16"), 989.4);
  EXPECT_EQ(dgx.launcher, "torchrun");
}

TEST_F(TunerCli, BadHardwareProfileNamesTheKey) {
  const std::string path = (dir_ / "bad.yaml").string();
  std::ofstream(path) << "device: {type: tpu}\n";
  try {
    calibrate::load_hardware_profile(path);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": device.type: expected cpu or cuda, got 'tpu'");
  }
  std::ofstream(path) << "peak_tflops: {fp16: 1}\n";
  EXPECT_THROW(calibrate::load_hardware_profile(path), UserError);
  std::filesystem::resize_file(path, kMaxInputFileBytes + 1);  // sparse: refused before parsing
  try {
    calibrate::load_hardware_profile(path);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": 16.0 MiB is over the 16 MiB limit of a YAML document");
  }
}

TEST(BenchResults, IterationRunsBecomeRowsWithParams) {
  const std::string json = R"({
    "context": {"date": "x"},
    "benchmarks": [
      {"name": "AllToAll/bytes:1024/ranks:2/manual_time", "run_type": "iteration",
       "real_time": 2.5, "time_unit": "ms", "algbw_GBps": 4.0, "busbw_GBps": 2.0},
      {"name": "Gemm/op:q_proj/tokens:8/in:4/out:4/manual_time", "run_type": "iteration",
       "real_time": 1500.0, "time_unit": "us", "tflops": 0.25},
      {"name": "Gemm/op:q_proj/manual_time_mean", "run_type": "aggregate", "real_time": 1.0,
       "time_unit": "ms", "tflops": 9.0},
      {"name": "Attention/backend:flash/sl:8", "run_type": "iteration", "error_occurred": true,
       "error_message": "needs CUDA", "real_time": 0, "time_unit": "ms"}
    ]})";
  const auto rows = calibrate::calibrations_from_bench_json(json, "test");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].benchmark, "AllToAll/bytes:1024/ranks:2");
  EXPECT_EQ(rows[0].metric, "time_ms");
  EXPECT_DOUBLE_EQ(rows[0].value, 2.5);
  EXPECT_EQ(rows[1].metric, "algbw_GBps");
  EXPECT_EQ(rows[2].metric, "busbw_GBps");
  EXPECT_EQ(rows[2].unit, "GB/s");
  EXPECT_EQ(nlohmann::json::parse(rows[0].params),
            nlohmann::json({{"bytes", "1024"}, {"ranks", "2"}}));
  EXPECT_DOUBLE_EQ(rows[3].value, 1.5);  // 1500 us
  EXPECT_EQ(rows[4].metric, "tflops");
  EXPECT_EQ(rows[4].unit, "TFLOP/s");
  EXPECT_EQ(calibrate::benchmark_family(rows[4].benchmark), "Gemm");
  EXPECT_THROW(calibrate::calibrations_from_bench_json("{}", "x"), UserError);
  EXPECT_THROW(calibrate::calibrations_from_bench_json("not json", "x"), UserError);
}

// ---------------------------------------------------------------------------------------------
// ulysses-tune calibrate

TEST_F(TunerCli, CalibrateStoresRowsFromASmallBenchRun) {
  const std::string db = (dir_ / "results.db").string();
  const Result r = run_shell(bin("ulysses-tune") + " calibrate --hardware " + home() +
                             "/profiles/hardware/cpu-local.yaml --db " + db +
                             " --filter 'AllToAll/bytes:65536/|Gemm/op:q_proj' --min-time 0.01");
  ASSERT_EQ(r.status, 0) << r.output;
  store::Store store = store::Store::open(db);
  const auto runs = store.calibration_runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].hardware, "cpu-local");
  EXPECT_EQ(runs[0].world_size, 2);  // the profile's devices_per_node
  EXPECT_EQ(runs[0].device, "cpu");
  double algbw = 0, busbw = 0, tflops = 0;
  for (const auto& row : store.calibrations(runs[0].id)) {
    if (row.metric == "algbw_GBps") algbw = row.value;
    if (row.metric == "busbw_GBps") {
      busbw = row.value;
      EXPECT_EQ(nlohmann::json::parse(row.params).at("ranks"), "2");
    }
    if (row.metric == "tflops" && calibrate::benchmark_family(row.benchmark) == "Gemm")
      tflops = row.value;
  }
  EXPECT_GT(algbw, 0.0) << r.output;
  EXPECT_NEAR(busbw, algbw / 2, 1e-9 * algbw);  // all-to-all busbw = algbw * (n-1)/n, n = 2
  EXPECT_GT(tflops, 0.0) << r.output;
}

TEST_F(TunerCli, CalibrateWithAMissingProfileIsAOneLineUsageError) {
  const Result r = run_shell(bin("ulysses-tune") + " calibrate --hardware " +
                             (dir_ / "nope.yaml").string() + " --db " + (dir_ / "r.db").string());
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_EQ(r.output, "error: " + (dir_ / "nope.yaml").string() + ": no such file\n");
  EXPECT_FALSE(fs::exists(dir_ / "r.db"));
}

// ---------------------------------------------------------------------------------------------
// ulysses-tune profile

// Without Nsight Systems the command says so in one line, runs the trainer alone and stores the
// step's split from the trainer's own timers (summary.json's medians); an --nsys that is not an
// executable is still a usage error before anything is written.
TEST_F(TunerCli, ProfileWithoutNsysSaysSoInOneLineAndStoresTheTrainersSplit) {
  const std::string db = (dir_ / "r.db").string();
  const std::string args = " profile --db " + db + " --config " + home() +
                           "/experiments/runs/tiny-cpu.yaml --set mesh.dp=1 --set mesh.sp=1" +
                           " --set train.steps=3 --out " + (dir_ / "out").string();
  const Result bad = run_shell(bin("ulysses-tune") + args + " --nsys " + (dir_ / "nope").string());
  EXPECT_EQ(bad.status, kExitUsage) << bad.output;
  EXPECT_EQ(bad.output, "error: --nsys: " + (dir_ / "nope").string() + ": not an executable file\n");
  EXPECT_FALSE(fs::exists(db));
  EXPECT_FALSE(fs::exists(dir_ / "out"));

  const Result r = run_shell("env -u NSYS PATH=/usr/bin:/bin " + bin("ulysses-tune") + args);
  ASSERT_EQ(r.status, 0) << r.output;
  // The first line of the output, whole.
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')),
            "profile: nsys: Nsight Systems not found ($NSYS unset, no nsys on PATH); the split "
            "below is from the trainer's own timers (install nsys or pass --nsys PATH for the "
            "kernel-level split)")
      << r.output;
  EXPECT_NE(r.output.find("the trainer's timers): compute "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("phases (inclusive, ms): "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" backward "), std::string::npos) << r.output;

  const nlohmann::json summary =
      nlohmann::json::parse(std::ifstream(dir_ / "out" / "run" / "summary.json"));
  store::Store store = store::Store::open(db);
  const auto profiles = store.profiles();
  ASSERT_EQ(profiles.size(), 1u);
  const store::ProfileRecord& p = profiles[0];
  EXPECT_EQ(p.steps, summary["measured_steps"].get<int64_t>());
  EXPECT_GT(p.steps, 0);
  EXPECT_EQ(p.window_ms, summary["step_ms_median"].get<double>());
  EXPECT_EQ(p.compute_ms, summary["compute_ms_median"].get<double>());
  EXPECT_EQ(p.comm_ms, summary["comm_ms_median"].get<double>());
  EXPECT_GT(p.window_ms, 0.0);
  EXPECT_EQ(p.report_path, "");
  EXPECT_EQ(p.comm_kernels + p.compute_kernels, 0);
  const nlohmann::json details = nlohmann::json::parse(p.details);
  EXPECT_EQ(details["source"], "trainer timers");
  EXPECT_EQ(details["phases_ms"], summary["phases_ms_median"]);
}

TEST_F(TunerCli, ProfileOfAnUnknownTrialPointsToConfig) {
  const Result missing =
      run_shell(bin("ulysses-tune") + " profile --db " + (dir_ / "r.db").string() + " --trial 3");
  EXPECT_EQ(missing.status, kExitUsage) << missing.output;
  EXPECT_EQ(missing.output, "error: --db: " + (dir_ / "r.db").string() +
                                ": no such file (it holds the trials of a sweep)\n");
  { store::Store::open((dir_ / "r.db").string()); }  // a store without trials
  const Result r = run_shell(bin("ulysses-tune") + " profile --db " + (dir_ / "r.db").string() +
                             " --trial 3 --out " + (dir_ / "out").string());
  EXPECT_EQ(r.status, kExitUsage) << r.output;
  EXPECT_NE(r.output.find("--trial: no trial 3 in"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--config RUN.yaml"), std::string::npos) << r.output;
}

TEST_F(TunerCli, ProfileHelpMentionsConfig) {
  const Result r = run_shell(bin("ulysses-tune") + " profile --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--config"), std::string::npos);
  EXPECT_NE(r.output.find("--trial"), std::string::npos);
}

TEST_F(TunerCli, ProfileRunsUnderNsysAndStoresTheKernelSplit) {
  const std::string fixture = (dir_ / "fixture.sqlite").string();
  testing::write_nsys_fixture(fixture);
  const fs::path fake = dir_ / "nsys";
  std::ofstream(fake) << R"(#!/bin/sh
# fake nsys: `profile [opts] -o OUT CMD...` runs CMD and writes OUT.nsys-rep;
# `export [opts] --output FILE REPORT` copies $FAKE_NSYS_SQLITE to FILE.
echo "nsys $*" >> "$(dirname "$0")/nsys.log"
cmd="$1"; shift
if [ "$cmd" = profile ]; then
  out=""
  while [ $# -gt 0 ]; do
    case "$1" in
      -o|-t) [ "$1" = -o ] && out="$2"; shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  "$@" || exit $?
  echo report > "$out.nsys-rep"
elif [ "$cmd" = export ]; then
  while [ $# -gt 0 ]; do
    if [ "$1" = --output ]; then cp "$FAKE_NSYS_SQLITE" "$2"; fi
    shift
  done
fi
)";
  fs::permissions(fake, fs::perms::owner_all);
  const std::string db = (dir_ / "results.db").string();
  const Result r = run_shell(
      "FAKE_NSYS_SQLITE=" + fixture + " " + bin("ulysses-tune") + " profile --db " + db +
      " --config " + home() + "/experiments/runs/tiny-cpu.yaml --set mesh.dp=1 --set mesh.sp=1" +
      " --set train.steps=2 --nsys " + fake.string() + " --out " + (dir_ / "out").string());
  ASSERT_EQ(r.status, 0) << r.output;
  // The trainer really ran under the fake nsys, with the capture range on the step range.
  EXPECT_TRUE(fs::exists(dir_ / "out" / "run" / "metrics.jsonl")) << r.output;
  std::ifstream log(dir_ / "nsys.log");
  std::string first;
  std::getline(log, first);
  EXPECT_NE(first.find("--capture-range=nvtx --nvtx-capture=step@ulysses"), std::string::npos);
  EXPECT_NE(first.find("-t cuda,nvtx"), std::string::npos);

  store::Store store = store::Store::open(db);
  const auto profiles = store.profiles();
  ASSERT_EQ(profiles.size(), 1u);
  const store::ProfileRecord& p = profiles[0];
  EXPECT_FALSE(p.trial_id.has_value());
  EXPECT_EQ(p.devices, 2);
  EXPECT_EQ(p.steps, 4);  // profile.warmup_steps = 1 skipped per thread
  EXPECT_NEAR(p.comm_ms, 17.0, 1e-9);
  EXPECT_NEAR(p.compute_ms, 27.0, 1e-9);
  EXPECT_NEAR(p.overlap_ms, 4.0, 1e-9);
  EXPECT_NEAR(p.exposed_comm_ms, 13.0, 1e-9);
  EXPECT_EQ(nlohmann::json::parse(p.details).size(), 2u);
  EXPECT_NE(p.config_yaml.find("sp: 1"), std::string::npos);
  EXPECT_NE(r.output.find("profile 1 stored in"), std::string::npos) << r.output;
}

// ---------------------------------------------------------------------------------------------
// ulysses-bench: a filter that selects nothing, and the default sizes calibrate runs

TEST_F(TunerCli, BenchFilterThatMatchesNothingIsAOneLineUsageError) {
  const Result r = run_shell(bin("ulysses-bench") + " --benchmark_filter=NoSuchBenchmark");
  EXPECT_EQ(r.status, kExitUsage) << r.output;
  EXPECT_EQ(r.output,
            "error: --benchmark_filter: 'NoSuchBenchmark' matches no benchmark (the names are in "
            "ulysses-bench --help)\n");
}

// An attention length whose math scores [heads, sl, sl] cannot fit is a row that says so, and the
// run goes on to the next benchmark (the old code aborted on the c10 out-of-memory error). The
// fused kernel at the same length is checked on a 2048-token prefix of math, so it fits; a short
// time budget keeps it to one iteration.
TEST_F(TunerCli, BenchAttentionOutOfMemoryIsARowNotAnAbort) {
  const Result r = run_shell("ulimit -v 4000000; " + bin("ulysses-bench") +
                             " --benchmark_filter='Attention/backend:math' --seqlens 32768,256 "
                             "--benchmark_min_time=0.01");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Attention/backend:math/sl:32768"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("out of memory at sl 32768"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Attention/backend:math/sl:256/heads"), std::string::npos) << r.output;
}

// The text after `label` up to the next ';' or ')' in `help`, "" when absent.
std::string default_after(const std::string& help, const std::string& label) {
  const size_t at = help.find(label);
  if (at == std::string::npos) return "";
  const size_t begin = at + label.size();
  return help.substr(begin, help.find_first_of(";)", begin) - begin);
}

// calibrate runs ulysses-bench without size flags: what it measures on a CPU profile is exactly
// what `ulysses-bench --help` names as the CPU defaults.
TEST_F(TunerCli, CalibrateMeasuresTheDefaultSizesBenchHelpNames) {
  const Result help = run_shell(bin("ulysses-bench") + " --help");
  ASSERT_EQ(help.status, 0) << help.output;
  const std::string a2a = default_after(help.output, "sizes per rank (default cpu ");
  const std::string seqlens = default_after(help.output, "sequence lengths (default cpu ");
  const std::string tokens = default_after(help.output, "per GEMM/MLP call (default cpu ");
  ASSERT_FALSE(a2a.empty() || seqlens.empty() || tokens.empty()) << help.output;

  const std::string db = (dir_ / "results.db").string();
  const Result r = run_shell(bin("ulysses-tune") + " calibrate --hardware " + home() +
                             "/profiles/hardware/cpu-local.yaml --nproc 1 --db " + db +
                             " --filter 'AllToAll|Attention|Mlp/impl:plain' --min-time 0.01");
  ASSERT_EQ(r.status, 0) << r.output;
  store::Store store = store::Store::open(db);
  const auto runs = store.calibration_runs();
  ASSERT_EQ(runs.size(), 1u);
  std::set<std::string> bytes, sls, token_counts;
  for (const auto& row : store.calibrations(runs[0].id)) {
    const auto params = nlohmann::json::parse(row.params);
    if (params.contains("bytes")) bytes.insert(params["bytes"].get<std::string>());
    if (params.contains("sl")) sls.insert(params["sl"].get<std::string>());
    if (params.contains("tokens")) token_counts.insert(params["tokens"].get<std::string>());
  }
  auto list = [](const std::set<std::string>& values) {
    std::vector<long long> numbers;
    for (const auto& v : values) numbers.push_back(std::stoll(v));
    std::sort(numbers.begin(), numbers.end());
    std::string out;
    for (long long n : numbers) {  // piece by piece: GCC 12 warns (falsely) on "" + string&&
      if (!out.empty()) out += ',';
      out += std::to_string(n);
    }
    return out;
  };
  EXPECT_EQ(list(bytes), a2a);
  EXPECT_EQ(list(sls), seqlens);
  EXPECT_EQ(list(token_counts), tokens);
}

// ---------------------------------------------------------------------------------------------
// ulysses-tune --help: what exists, and what does not yet

TEST_F(TunerCli, HelpListsTheCommandsAndTheRunners) {
  const Result r = run_shell(bin("ulysses-tune") + " --help");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* command : {"sweep", "recommend", "export", "report", "list", "show", "launch",
                              "calibrate", "profile", "plan"}) {
    EXPECT_NE(r.output.find("\n  " + std::string(command) + " "), std::string::npos) << command;
  }
  EXPECT_NE(r.output.find("`runner: srun`"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Not built yet"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ulysses
