// The tuner end to end through the ulysses-tune binary, with a fake trainer (fake_trainer.sh:
// a synthetic memory function, exit 12 when over the limit) so that it is fast and exact:
// sweep (smart and grid) -> recommend -> export -> report; SIGKILL in the middle of a sweep and
// --resume; a hanging trial classified `timeout`; bad input as one line with a non-zero exit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "config/run_config.h"
#include "data/dataset_writer.h"
#include "tuner/sweep_cli_fixture.h"

namespace ulysses::sweep {
namespace {

TEST_F(SweepCliTest, SmartSearchMatchesTheGridWithAThirdOfItsTrials) {
  Result smart = tune(sweep_args());
  ASSERT_EQ(smart.status, 0) << smart.out << smart.err;
  EXPECT_NE(smart.out.find("the exhaustive grid would run 384"), std::string::npos) << smart.out;
  Result grid = tune(sweep_args("--search grid"));
  ASSERT_EQ(grid.status, 0) << grid.err;

  const auto smart_trials = trials("fake"), grid_trials = trials("fake-grid");
  int64_t smart_runs = 0, grid_runs = 0;
  for (const auto& t : smart_trials) smart_runs += t.ran();
  for (const auto& t : grid_trials) grid_runs += t.ran();
  EXPECT_EQ(grid_runs, 12 * 32);
  EXPECT_LE(3 * smart_runs, grid_runs) << smart_runs;
  EXPECT_GT(count(smart_trials, "oom"), 0);
  EXPECT_GT(count(smart_trials, "skipped"), 0);
  for (const auto& t : smart_trials) EXPECT_NE(t.status, "running");

  // Both recommend the same length and configuration: sp 4, tiled loss, offload.
  for (const std::string name : {"fake", "fake-grid"}) {
    const fs::path out = dir_ / ("rec-" + name);
    Result rec = tune("recommend --db '" + db_ + "' --sweep " + name + " --out '" + out.string() + "'");
    ASSERT_EQ(rec.status, 0) << rec.err;
    for (const char* file : {"recommended.yaml", "ds_config.json", "arctic_training.yaml",
                             "accelerate_config.yaml",
                             "launch.sh", "WHY.md"}) {
      EXPECT_TRUE(fs::exists(out / file)) << file;
    }
    const config::RunConfig c = config::load_run_config((out / "recommended.yaml").string());
    EXPECT_EQ(c.mesh.sp, 4);
    EXPECT_EQ(c.mesh.dp, 1);
    EXPECT_EQ(c.memory.tiled_loss.value, 8);
    EXPECT_TRUE(c.memory.offload_activations);
    EXPECT_EQ(c.sequence.length, 32768);  // 100 + 32768/4/4*0.3 = 714 MiB < 921 MiB
    EXPECT_EQ(c.train.steps, 5);           // the base's length of training, not the trial's
    EXPECT_FALSE(c.attention.skip_all_but_last);
    EXPECT_NE(read_text(out / "WHY.md").find("out of memory at"), std::string::npos);
  }

  // export of the best trial in every format; report of the sweep.
  int64_t best = 0;
  for (const auto& t : smart_trials) {
    if (t.status == "ok" && !t.probe && t.seqlen == 32768 && t.sp == 4) best = t.id;
  }
  ASSERT_GT(best, 0);
  for (const char* format : {"native", "deepspeed", "arctic", "accelerate"}) {
    Result ex = tune("export --db '" + db_ + "' --trial " + std::to_string(best) + " --format " + format);
    EXPECT_EQ(ex.status, 0) << format << ": " << ex.err;
    EXPECT_FALSE(ex.out.empty()) << format;
  }
  Result report = tune("report --db '" + db_ + "' --sweep fake --out '" + (dir_ / "report").string() + "'");
  EXPECT_EQ(report.status, 0) << report.err;
  EXPECT_TRUE(fs::exists(dir_ / "report" / "README.md"));
  EXPECT_TRUE(fs::exists(dir_ / "report" / "trials.csv"));
}

TEST_F(SweepCliTest, SigkillLeavesAValidDatabaseAndResumeKeepsFinishedTrials) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("FAKE_SLEEP", "0.3", 1);
    const std::string out = (dir_ / "killed.out").string();
    freopen(out.c_str(), "w", stdout);
    freopen(out.c_str(), "a", stderr);
    execl(tune_.c_str(), tune_.c_str(), "sweep", experiment_.c_str(), "--db", db_.c_str(),
          "--trainer", fake_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill it once a few trials are stored, while the next one runs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int64_t done = 0;
  while (done < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!fs::exists(db_)) continue;
    try {
      store::Store store = store::Store::open(db_);
      store::SweepStore sweeps(store.db());
      if (auto s = sweeps.find_sweep("fake")) {
        done = 0;
        for (const auto& t : sweeps.trials(s->id)) done += t.ran() && t.status != "running";
      }
    } catch (const UserError&) {
    }
  }
  ASSERT_GE(done, 4) << read_text(dir_ / "killed.out");
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);

  std::map<int64_t, std::string> finished;  // id -> finished_at
  {
    store::Store store = store::Store::open(db_);
    store::Statement check = store.db().prepare("PRAGMA integrity_check");
    ASSERT_TRUE(check.step());
    EXPECT_EQ(check.column_text(0), "ok");
  }
  for (const auto& t : trials("fake")) {
    if (t.ran() && t.status != "running") finished[t.id] = t.finished_at;
  }
  ASSERT_GE(finished.size(), 4u);

  EXPECT_EQ(tune(sweep_args()).status, 2);  // exists: needs --resume
  Result resumed = tune(sweep_args("--resume"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("not re-run"), std::string::npos);
  const auto after = trials("fake");
  for (const auto& t : after) EXPECT_NE(t.status, "running") << t.key;
  for (const auto& [id, finished_at] : finished) {
    bool kept = false;
    for (const auto& t : after) kept |= t.id == id && t.finished_at == finished_at;
    EXPECT_TRUE(kept) << "trial " << id << " was re-run or lost";
  }
  // The resumed sweep reaches the same answer as one that was never killed.
  Result rec = tune("recommend --db '" + db_ + "' --out '" + (dir_ / "rec").string() + "'");
  ASSERT_EQ(rec.status, 0) << rec.err;
  EXPECT_EQ(config::load_run_config((dir_ / "rec/recommended.yaml").string()).sequence.length,
            32768);
}

// SIGTERM during the 7th trial: the sweep stops that trial, ends `interrupted` with exit status
// 130, and its summary counts the 6 trials it ran (the line it prints and the one it stores).
TEST_F(SweepCliTest, SigtermAfterSixTrialsCountsTheSixTrialsRun) {
  const fs::path starts = dir_ / "starts";
  fs::create_directories(starts);
  const std::string out = (dir_ / "terminated.out").string();
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("FAKE_TERM_AT", "7", 1);
    setenv("FAKE_TERM_PID", std::to_string(getpid()).c_str(), 1);
    setenv("FAKE_COUNT_DIR", starts.c_str(), 1);
    freopen(out.c_str(), "w", stdout);
    freopen(out.c_str(), "a", stderr);
    execl(tune_.c_str(), tune_.c_str(), "sweep", experiment_.c_str(), "--db", db_.c_str(),
          "--trainer", fake_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "the sweep did not stop on SIGTERM: " << read_text(out);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string text = read_text(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), kExitInterrupted) << text;
  EXPECT_NE(text.find("sweep fake interrupted: 6 trials run ("), std::string::npos) << text;
  // Progress lines show the peak as the report does: above the start-up baseline, in MiB under
  // 1 GiB, the basis named (the fake records no baseline: the estimate, called so).
  EXPECT_NE(text.find(" MiB above the start-up baseline "), std::string::npos) << text;
  EXPECT_EQ(text.find(" GiB, "), std::string::npos) << text;
  EXPECT_NE(text.find(" (estimated), "), std::string::npos) << text;

  int64_t finished = 0, running = 0;
  for (const auto& t : trials("fake")) {
    finished += t.ran() && t.status != "running";
    running += t.status == "running";
  }
  EXPECT_EQ(finished, 6);
  EXPECT_EQ(running, 1);  // the 7th, left to --resume
  store::Store store = store::Store::open(db_);
  const auto sweep = store::SweepStore(store.db()).find_sweep("fake");
  ASSERT_TRUE(sweep.has_value());
  EXPECT_EQ(sweep->status, "interrupted");
  EXPECT_NE(sweep->summary.find("\"trials_run\":6,"), std::string::npos) << sweep->summary;

  // The machine's load while each finished trial ran, summarized in the report's header.
  EXPECT_EQ(store::SweepStore(store.db()).trial_loads(sweep->id).size(), 6u);
  Result report = tune("report --db '" + db_ + "' --sweep fake --out '" +
                       (dir_ / "report").string() + "'");
  ASSERT_EQ(report.status, 0) << report.err;
  EXPECT_NE(read_text(dir_ / "report" / "README.md")
                .find("| machine load while trials ran | 1-minute load average "),
            std::string::npos);
  EXPECT_NE(read_text(dir_ / "report" / "README.md").find(" max over the start and end of 6 trials; "),
            std::string::npos);
}

// The default name of a grid sweep ("<name>-grid", which SmartSearchMatchesTheGrid... uses) is
// explained where sweep names are: the README's tuning section and `sweep --help`.
TEST_F(SweepCliTest, TheGridSuffixOfSweepNamesIsDocumented) {
  const std::string readme = read_text(fs::path(project_home()) / "README.md");
  EXPECT_NE(readme.find("plus the suffix `-grid` under `--search grid`"), std::string::npos);
  const Result help = tune("sweep --help");
  EXPECT_NE(help.out.find("\"-grid\" for --search grid"), std::string::npos) << help.out;
}

TEST_F(SweepCliTest, HangingTrialIsATimeoutAndTheSweepGoesOn) {
  std::string text = kExperiment;
  text.replace(text.find("trial_timeout_s: 30"), 19, "trial_timeout_s: 2");
  text.replace(text.find("mesh.sp: auto"), 13, "mesh.sp: [4]");
  std::ofstream(experiment_) << text;
  Result r = tune(sweep_args(), "FAKE_HANG_AT=2048");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto all = trials("fake");
  EXPECT_GT(count(all, "timeout"), 0);
  EXPECT_GT(count(all, "ok"), 0);
  for (const auto& t : all) {
    if (t.status == "timeout") {
      EXPECT_EQ(t.seqlen, 2048);
      EXPECT_EQ(t.exit_code, 124);
    }
  }
}

TEST_F(SweepCliTest, BadInputIsOneLineAndWritesNothing) {
  auto expect_one_line = [&](const Result& r, const std::string& needle) {
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  std::ofstream(experiment_) << std::string(kExperiment) + "colour: blue\n";
  expect_one_line(tune(sweep_args()), "colour: unknown key");
  std::ofstream(experiment_) << "name: x\nhardware: cpu-local\nspace: {}\n";
  expect_one_line(tune(sweep_args()), "space: empty");
  std::ofstream(experiment_) << "name: x\nhardware: no-such-gpu\nspace: {sequence.length: [8]}\n";
  expect_one_line(tune(sweep_args()), "hardware: no profile 'no-such-gpu'");
  std::string bad_axis = kExperiment;
  bad_axis.replace(bad_axis.find("memory.tiled_loss"), 17, "memory.tiled_los");
  std::ofstream(experiment_) << bad_axis;
  expect_one_line(tune(sweep_args()), "memory.tiled_los: unknown key");
  std::string no_data = kExperiment;
  no_data.replace(no_data.find("  train: {device: cpu"), 0, "  data: {source: megatron:prepared/train}\n");
  std::ofstream(experiment_) << no_data;
  expect_one_line(tune(sweep_args()), "base.data.source: megatron:prepared/train: no "
                                      "prepared/train.idx in the working directory or beside the "
                                      "experiment");
  EXPECT_FALSE(fs::exists(db_));  // nothing was written for any of them

  expect_one_line(tune("recommend --db '" + db_ + "' --out '" + (dir_ / "rec").string() + "'"),
                  "no such file");
  std::ofstream(dir_ / "corrupt.db") << "this is not a database, just text that goes on and on";
  expect_one_line(tune("recommend --db '" + (dir_ / "corrupt.db").string() + "' --out '" +
                       (dir_ / "rec").string() + "'"),
                  "corrupt.db");
  EXPECT_FALSE(fs::exists(dir_ / "rec"));

  std::ofstream(experiment_) << kExperiment;
  ASSERT_EQ(tune(sweep_args()).status, 0);
  expect_one_line(tune("export --db '" + db_ + "' --trial 99999 --format deepspeed"),
                  "no trial 99999");
  expect_one_line(tune("recommend --db '" + db_ + "' --sweep nope --out '" +
                       (dir_ / "rec").string() + "'"),
                  "--sweep nope: no such sweep");
  EXPECT_FALSE(fs::exists(dir_ / "rec"));
}

// A sweep on prepared data (a Megatron dataset with prepare_data.py's manifest beside it), named
// by a path relative to the experiment and run from another directory: every trial reads it by
// its absolute path, the report and WHY.md say which data was measured (tokens, documents, the
// loss mask, the tokenizer, the document lengths), and a resume after its loss mask changed is
// refused in one line.
TEST_F(SweepCliTest, PreparedDataIsNamedInTheReportAndChangedDataStopsAResume) {
  const fs::path prepared = dir_ / "prepared";
  fs::create_directories(prepared);
  const std::string prefix = (prepared / "train").string();
  data::write_megatron_dataset(prefix, {{1, 2, 3}, {4, 5, 6, 7}, {8, 9}}, data::TokenDType::kUInt16);
  data::write_megatron_dataset(prefix + "_loss_mask", {{0, 1, 1}, {0, 0, 1, 1}, {0, 1}},
                               data::TokenDType::kUInt8);
  std::ofstream(prepared / "manifest.json")
      << R"({"tool": "prepare_data.py", "version": 1, "mode": "sft",
             "tokenizer": {"path": "/models/tiny", "sha256": "0123456789abcdef0123", "files": []},
             "outputs": {"train": "train", "eval": "eval"},
             "document_length_histogram": [{"min": 2, "max": 3, "documents": 2},
                                           {"min": 4, "max": 7, "documents": 1}]})";
  std::ofstream(experiment_) << R"(name: prepared
hardware: cpu-local
world_size: 2
memory_limit_gib: 1.0
base:
  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
          vocab_size: 128}
  data: {source: megatron:prepared/train}
  train: {device: cpu, steps: 5}
space:
  mesh.sp: [2]
  data.packing: [windows, documents]
  sequence.length: [1024]
objective: throughput
trial: {warmup_steps: 1, steps: 2}
backend: [native, deepspeed]
search: {probe: false}
)";
  const std::string python = (fs::path(project_home()) / "tests/tuner/fake_python.sh").string();
  const Result run =
      shell("cd / && '" + tune_ + "' " + sweep_args("--python '" + python + "'"));
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  const auto stored = trials("prepared");
  ASSERT_EQ(count(stored, "ok"), 2);
  ASSERT_EQ(count(stored, "invalid"), 2);
  for (const auto& t : stored) {
    if (t.status == "ok") {
      EXPECT_NE(t.config_yaml.find("megatron:" + prefix), std::string::npos) << t.config_yaml;
      continue;
    }
    // The deepspeed backend trains windows of the stream without a mask: both are refused.
    const bool documents = t.point.find("documents") != std::string::npos;
    EXPECT_NE(t.reason.find(documents ? "data.packing: documents: the deepspeed backend trains "
                                        "windows of the token stream"
                                      : "data.loss_mask: the deepspeed backend learns every token"),
              std::string::npos)
        << t.point << ": " << t.reason;
  }

  const std::string report = (dir_ / "report").string();
  const Result reported = tune("report --db '" + db_ + "' --out '" + report + "'");
  ASSERT_EQ(reported.status, 0) << reported.err;
  const std::string readme = read_text(fs::path(report) / "README.md");
  for (const std::string& expected :
       {std::string("## Data\n\nThe trials trained on `megatron:") + prefix +
            "`: 9 tokens in 3 documents, with a loss mask; prepared by prepare_data.py in sft mode with the tokenizer "
            "/models/tiny (sha256 0123456789ab) (" + (prepared / "manifest.json").string() +
            "); windows of the stream.",
        std::string("| 2-3 "), std::string("| 4-7 "),
        // gnuplot refuses a histogram of one backend: the comparison plot says why it is absent
        std::string("Not drawn: only the native backend measured a configuration")}) {
    EXPECT_NE(readme.find(expected), std::string::npos) << expected << "\n" << readme;
  }
  const std::string rec = (dir_ / "rec").string();
  ASSERT_EQ(tune("recommend --db '" + db_ + "' --out '" + rec + "'").status, 0);
  EXPECT_NE(read_text(fs::path(rec) / "WHY.md").find("Data: `megatron:" + prefix + "`: 9 tokens"),
            std::string::npos);

  data::write_megatron_dataset(prefix + "_loss_mask", {{0, 1, 1}, {0, 1, 1, 1}, {0, 1}},
                               data::TokenDType::kUInt8);  // the same tokens, another mask
  const Result resumed = tune(sweep_args("--resume --python '" + python + "'"));
  EXPECT_EQ(resumed.status, 2) << resumed.out << resumed.err;
  EXPECT_NE(resumed.err.find("base.data.source: the data its trials read changed since sweep "
                             "'prepared' started"),
            std::string::npos)
      << resumed.err;
  EXPECT_EQ(std::count(resumed.err.begin(), resumed.err.end(), '\n'), 1) << resumed.err;
}

// Both backends in one sweep, with a stand-in for the deepspeed backend's Python
// (fake_python.sh, which checks the files its rank program reads and reports 0.8x the throughput):
// every configuration runs on each, each DeepSpeed trial gets its ds_config.json and the run's
// tokens, the report sets them side by side, recommend says which backend measured its pick.
TEST_F(SweepCliTest, BothBackendsRunEveryConfigurationAndTheReportComparesThem) {
  std::string text = kExperiment;
  auto set = [&](const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
  };
  set("memory.offload: [none, activations]", "memory.offload: [none]");
  set("sequence.length: {search: max, from: 1024, to: 32768, step: 1024}",
      "sequence.length: [1024, 2048]");
  set("objective: max-seqlen", "objective: throughput");
  text += "backend: [native, deepspeed]\nsearch: {probe: false}\n";
  std::ofstream(experiment_) << text;
  const std::string python = (fs::path(project_home()) / "tests/tuner/fake_python.sh").string();

  Result bad = tune(sweep_args("--python /bin/false"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err, "error: --python: /bin/false cannot import deepspeed, transformers and torch "
                     "(the deepspeed backend's ranks need them; pass --python or set "
                     "ULYSSES_PYTHON)\n");
  EXPECT_FALSE(fs::exists(db_));

  Result sweep = tune(sweep_args("--search grid --python '" + python + "'"));
  ASSERT_EQ(sweep.status, 0) << sweep.out << sweep.err;
  const auto all = trials("fake-grid");
  int native = 0, deepspeed = 0;
  for (const store::TrialRecord& t : all) {
    if (t.status == "invalid") continue;
    ASSERT_EQ(t.status, "ok") << t.key << ": " << t.error;
    const bool ds = t.point.find("\"backend\":\"deepspeed\"") != std::string::npos;
    (ds ? deepspeed : native) += 1;
    EXPECT_EQ(t.predicted_peak_bytes.has_value(), !ds) << t.key;  // ulysses-train's model only
    if (!ds) continue;
    const fs::path run = t.run_dir;
    EXPECT_NE(read_text(run / "ds_config.json").find("\"zero_optimization\""), std::string::npos);
    // 3 steps (1 warm-up + 2 measured) x dp (4 / sp) samples of the trial's length, 2-byte ids
    // (vocabulary 128).
    EXPECT_EQ(fs::file_size(run / "tokens.bin"),
              static_cast<uintmax_t>(3 * (4 / t.sp) * t.seqlen * 2)) << t.key;
    EXPECT_NE(read_text(run / "run.yaml").find("tokens:" + (run / "tokens.bin").string()),
              std::string::npos);
    EXPECT_EQ(t.config_yaml.find("tokens:"), std::string::npos);  // the trial's own config
  }
  EXPECT_EQ(native, deepspeed);
  EXPECT_EQ(native, 3 * 2 * 2);  // sp 1, 2, 4 x tiled loss 1, 8 x two lengths

  const fs::path report = dir_ / "report";
  Result rep = tune("report --db '" + db_ + "' --out '" + report.string() + "'");
  ASSERT_EQ(rep.status, 0) << rep.err;
  const std::string readme = read_text(report / "README.md");
  EXPECT_NE(readme.find("## Ours vs DeepSpeed"), std::string::npos);
  EXPECT_NE(readme.find("| 0.80 |"), std::string::npos);
  EXPECT_NE(readme.find("- fake: loss scaled by 1 / sp"), std::string::npos);
  EXPECT_TRUE(fs::exists(report / "backends.dat"));

  Result rec = tune("recommend --db '" + db_ + "' --out '" + (dir_ / "rec").string() + "'");
  ASSERT_EQ(rec.status, 0) << rec.err;
  EXPECT_NE(rec.out.find("measured on backend native"), std::string::npos) << rec.out;
  Result ds = tune("recommend --db '" + db_ + "' --backend deepspeed --out '" +
                   (dir_ / "rec-ds").string() + "'");
  ASSERT_EQ(ds.status, 0) << ds.err;
  EXPECT_NE(ds.out.find("measured on backend deepspeed"), std::string::npos) << ds.out;
  EXPECT_NE(read_text(dir_ / "rec-ds" / "WHY.md").find("the **deepspeed** backend"),
            std::string::npos);
  const std::string first_line = read_text(dir_ / "rec-ds" / "recommended.yaml").substr(0, 120);
  EXPECT_NE(first_line.find("measured on backend deepspeed"), std::string::npos) << first_line;
}

// 3 query heads over 1 KV head on 4 ranks, both backends: sp 2 splits the heads unevenly and sp 4
// needs a ring (2 all-to-all x 2 ring), neither of which DeepSpeed's Ulysses runs. --dry-run and
// the sweep call both DeepSpeed points invalid with the line the DeepSpeed export refuses with;
// the sweep runs the native points, finishes with exit 0 and leaves no trial `running` (a row an
// earlier run left `running` for an invalid point is settled by --resume). The uneven winner
// exports to DeepSpeed no more than a ring one: `export` refuses it in one line, `recommend`
// writes only ulysses-train's files and says why in WHY.md.
TEST_F(SweepCliTest, MeshesDeepSpeedCannotRunAreInvalidOnItsBackendAndTheSweepFinishes) {
  std::ofstream(experiment_) << R"(name: fake
hardware: cpu-local
world_size: 4
memory_limit_gib: 1.0
base:
  model: {hidden_size: 24, num_layers: 1, num_heads: 3, num_kv_heads: 1, intermediate_size: 64,
          vocab_size: 128}
  train: {device: cpu, steps: 5}
  mesh: {uneven_heads: true, sp_ring: auto}
space:
  mesh.sp: [2, 4]
  sequence.length: [1024]
objective: throughput
budget: {trial_timeout_s: 30}
trial: {warmup_steps: 1, steps: 2}
backend: [native, deepspeed]
search: {probe: false}
)";
  const std::string python = (fs::path(project_home()) / "tests/tuner/fake_python.sh").string();
  const std::string uneven =
      "mesh.uneven_heads: sp 2 splits 3 query heads / 1 KV head unevenly, which runs only in "
      "ulysses-train; DeepSpeed needs sp to divide the query heads";
  const std::string ring =
      "mesh.sp_ring: 2 (ring attention over sp 4 = 2 all-to-all x 2 ring) runs only in "
      "ulysses-train; DeepSpeed has Ulysses' all-to-all alone";

  Result dry = tune(sweep_args("--dry-run"));
  ASSERT_EQ(dry.status, 0) << dry.err;
  EXPECT_NE(dry.out.find("invalid: " + uneven), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("invalid: " + ring), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("\n2 valid points;"), std::string::npos) << dry.out;

  Result sweep = tune(sweep_args("--python '" + python + "'"));
  ASSERT_EQ(sweep.status, 0) << sweep.out << sweep.err;
  std::vector<store::TrialRecord> all = trials("fake");
  int64_t native_ok = 0;
  std::string invalid_key;
  for (const store::TrialRecord& t : all) {
    const bool ds = t.point.find("\"backend\":\"deepspeed\"") != std::string::npos;
    if (!ds) {
      EXPECT_EQ(t.status, "ok") << t.key << ": " << t.error;
      native_ok += t.status == "ok";
      continue;
    }
    ASSERT_EQ(t.status, "invalid") << t.key << ": " << t.error;
    const bool sp4 = t.point.find("\"mesh.sp\":\"4\"") != std::string::npos;
    EXPECT_EQ(t.sp, sp4 ? 4 : 2) << t.key;  // the mesh it would have run, for the printers
    EXPECT_FALSE(t.config_yaml.empty()) << t.key;
    EXPECT_EQ(t.reason.rfind(sp4 ? ring : uneven, 0), 0u) << t.key << ": " << t.reason;
    if (sp4) invalid_key = t.key;
  }
  EXPECT_EQ(native_ok, 2);
  EXPECT_EQ(count(all, "invalid"), 2);
  {
    store::Store store = store::Store::open(db_);
    store::SweepStore sweeps(store.db());
    const auto record = sweeps.find_sweep("fake");
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->status, "finished");
    // What an earlier version left behind: the ring point on DeepSpeed `running`.
    ASSERT_NE(invalid_key.find(" all lengths"), std::string::npos) << invalid_key;
    store::TrialRecord stale;
    stale.sweep_id = record->id;
    stale.key = invalid_key.substr(0, invalid_key.find(" all lengths")) + " L=1024";
    stale.seqlen = 1024;
    stale.world_size = 4, stale.dp = stale.sp = 0;
    sweeps.begin_trial(stale);
  }
  Result resumed = tune(sweep_args("--resume --python '" + python + "'"));
  ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
  all = trials("fake");
  for (const store::TrialRecord& t : all) EXPECT_NE(t.status, "running") << t.key;
  EXPECT_EQ(count(all, "invalid"), 3);
  EXPECT_EQ(count(all, "ok"), 2);

  // The winner is native sp 2, the uneven split.
  int64_t winner = 0;
  for (const store::TrialRecord& t : all) {
    if (t.status == "ok" && t.sp == 2) winner = t.id;
  }
  ASSERT_GT(winner, 0);
  Result ex = tune("export --db '" + db_ + "' --trial " + std::to_string(winner) +
                   " --format deepspeed");
  EXPECT_EQ(ex.status, 2) << ex.out;
  EXPECT_EQ(ex.err.rfind("error: " + uneven, 0), 0u) << ex.err;
  EXPECT_EQ(std::count(ex.err.begin(), ex.err.end(), '\n'), 1) << ex.err;
  const fs::path out = dir_ / "rec";
  Result rec = tune("recommend --db '" + db_ + "' --out '" + out.string() + "'");
  ASSERT_EQ(rec.status, 0) << rec.out << rec.err;
  EXPECT_TRUE(fs::exists(out / "recommended.yaml"));
  for (const char* file : {"ds_config.json", "arctic_training.yaml", "accelerate_config.yaml"}) {
    EXPECT_FALSE(fs::exists(out / file)) << file;
  }
  EXPECT_NE(read_text(out / "WHY.md").find("mesh.uneven_heads: sp 2 splits"), std::string::npos);
}

// A rule that only some lengths break (model.sliding_window 2048 below sequence.length 4096):
// with a memory limit and pruning, the engine asks the memory model about those lengths and
// records points skipped there. Each such trial is stored `invalid` (not run, not counted as a
// run), the sweep finishes and no row stays `running`, in a max-length search (pruning at the
// lengths above the window) and in a throughput search (the point out of memory at 1024 is
// skipped at 4096 as implied out of memory, sp 1 and 2 are pruned or run).
TEST_F(SweepCliTest, LengthsThatBreakARuleAreInvalidRowsAndTheSweepFinishes) {
  std::string text = kExperiment;
  auto set = [&](const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
  };
  set("vocab_size: 128}", "vocab_size: 128, sliding_window: 2048}\n  sequence: {length: 1024}");
  set("to: 32768", "to: 4096");
  std::ofstream(experiment_) << text;
  auto check = [&](const std::string& name, const Result& r) {
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    const auto all = trials(name);
    int64_t invalid = 0;
    for (const store::TrialRecord& t : all) {
      EXPECT_NE(t.status, "running") << t.key;
      if (t.status != "invalid") continue;
      ++invalid;
      EXPECT_GT(t.seqlen, 2048) << t.key;
      EXPECT_NE(t.reason.find("model.sliding_window"), std::string::npos) << t.reason;
    }
    EXPECT_GT(invalid, 0);
    store::Store store = store::Store::open(db_);
    store::SweepStore sweeps(store.db());
    const auto sweep = sweeps.find_sweep(name);
    ASSERT_TRUE(sweep.has_value());
    EXPECT_EQ(sweep->status, "finished");
    const auto summary = nlohmann::json::parse(sweep->summary);
    EXPECT_EQ(summary["invalid_at_length"].get<int64_t>(), invalid) << sweep->summary;
    int64_t ran = 0;
    for (const store::TrialRecord& t : all) ran += t.ran();
    EXPECT_EQ(summary["trials_run"].get<int64_t>(), ran) << sweep->summary;
  };
  check("fake", tune(sweep_args()));

  set("memory_limit_gib: 1.0", "memory_limit_gib: 0.3");
  set("sequence.length: {search: max, from: 1024, to: 4096, step: 1024}",
      "sequence.length: [1024, 4096]");
  set("objective: max-seqlen", "objective: throughput");
  std::ofstream(experiment_) << text;
  const Result throughput = tune(sweep_args("--name fake-throughput"));
  check("fake-throughput", throughput);
  int64_t skipped_at_4096 = 0;
  for (const store::TrialRecord& t : trials("fake-throughput")) {
    skipped_at_4096 += t.status == "skipped" && t.seqlen == 4096;
  }
  EXPECT_GT(skipped_at_4096, 0) << throughput.out;
}

// A trial whose run directory cannot be made (a file stands where it goes) is stored `failed`
// with the error and the sweep goes on; --resume settles a row an earlier run left `running`
// that it does not run again as `skipped`.
TEST_F(SweepCliTest, ATrialWhoseFilesCannotBeWrittenFailsAndTheSweepFinishes) {
  std::string text = kExperiment;
  auto set = [&](const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
  };
  set("mesh.sp: auto", "mesh.sp: [4]");
  set("memory.tiled_loss: [1, 8]", "memory.tiled_loss: [1]");
  set("memory.offload: [none, activations]", "memory.offload: [none]");
  set("sequence.length: {search: max, from: 1024, to: 32768, step: 1024}",
      "sequence.length: [1024, 2048]");
  set("objective: max-seqlen", "objective: throughput");
  std::ofstream(experiment_) << text;
  ASSERT_EQ(tune(sweep_args("--max-trials 1")).status, 0);
  auto all = trials("fake");
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(all[0].status, "ok");
  const fs::path runs = fs::path(all[0].run_dir).parent_path();
  {
    // A stale `running` row of a key no run writes; the next trial's directory is a file.
    store::Store store = store::Store::open(db_);
    store::SweepStore sweeps(store.db());
    store::TrialRecord stale;
    stale.sweep_id = sweeps.find_sweep("fake")->id;
    stale.key = "no longer in the space L=1024";
    stale.seqlen = 1024;
    stale.world_size = 4, stale.dp = stale.sp = 0;
    sweeps.begin_trial(stale);
    std::ofstream(runs / std::to_string(stale.id + 1)) << "not a directory";
  }
  const Result resumed = tune(sweep_args("--resume"));
  ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
  all = trials("fake");
  ASSERT_EQ(all.size(), 3u);
  for (const store::TrialRecord& t : all) {
    if (t.key == "no longer in the space L=1024") {
      EXPECT_EQ(t.status, "skipped");
      EXPECT_EQ(t.reason, "not re-run by the resumed sweep");
    } else if (t.seqlen == 2048) {
      EXPECT_EQ(t.status, "failed");
      EXPECT_NE(t.error.find("run_dir: cannot create"), std::string::npos) << t.error;
    } else {
      EXPECT_EQ(t.status, "ok") << t.key;
    }
  }
  store::Store store = store::Store::open(db_);
  store::SweepStore sweeps(store.db());
  EXPECT_EQ(sweeps.find_sweep("fake")->status, "finished");
}

// One rank per trial, so that two slots fit a 2-core machine: tiled loss and the activation
// offload (each in the memory order) for two data seeds (no memory order: each seed's points are
// decided side by side with the other's), at two lengths. Under 0.9 x 0.5 GiB only the offload
// fits at 4096 (the target) and everything but neither saving at 2048.
constexpr const char* kSlotsExperiment = R"(name: slots
hardware: cpu-local
world_size: 1
memory_limit_gib: 0.5
headroom: 0.1
base:
  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
          vocab_size: 128}
  train: {device: cpu, steps: 5}
space:
  memory.tiled_loss: [1, 8]
  memory.offload: [none, activations]
  data.seed: [0, 1]
  sequence.length: [2048, 4096]
objective: throughput
budget: {trial_timeout_s: 30}
trial: {warmup_steps: 1, steps: 2}
slots: 2
)";

// A trial's run as the fake trainer logged it (FAKE_LOG): when rank 0 started and ended.
struct Span {
  double start = 0, end = 0;
};

// FAKE_LOG's lines by trial id (the run directory's name); an `end` missing: end 0.
std::map<int64_t, Span> fake_spans(const fs::path& log) {
  std::map<int64_t, Span> spans;
  std::istringstream lines(read_text(log));
  std::string event, out, host;
  double at = 0;
  while (lines >> event >> out >> host >> at) {
    const int64_t id = std::stoll(fs::path(out).parent_path().filename().string());
    (event == "start" ? spans[id].start : spans[id].end) = at;
  }
  return spans;
}

bool overlap(const Span& a, const Span& b) { return a.start < b.end && b.start < a.end; }

// Two slots find what one finds (every row's status, each point's longest fit), on both slots at
// once: each trial's slot is stored, trials whose runs overlapped are each other's neighbours,
// an offloading trial ran with no neighbour (isolation offload_alone); with isolation shared the
// best configuration, measured beside another trial, is measured again alone (remeasure_of) and
// recommend ranks it by that.
TEST_F(SweepCliTest, TwoSlotsFindWhatOneFindsSideBySide) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cores";
  std::ofstream(experiment_) << kSlotsExperiment;
  // Slots that cannot hold a trial, or no number: one line naming slots, nothing written.
  Result bad = tune(sweep_args("--name bad --slots 4096"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err.rfind("error: slots: 4096 slots of the ", 0), 0u) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  bad = tune(sweep_args("--name bad --slots 0"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err, "error: --slots: expected a whole number >= 1 or auto, got '0'\n");
  EXPECT_FALSE(fs::exists(db_));
  const fs::path log = dir_ / "fake.log";
  const Result one =
      tune(sweep_args("--name one --slots 1"), "FAKE_SLEEP=0.1 FAKE_LOG='" + log.string() + "'");
  ASSERT_EQ(one.status, 0) << one.out << one.err;
  fs::remove(log);
  // Each trial lasts 1 s: the next one starts on the other slot well within it, also when a
  // loaded machine delays a thread or a process start by a good part of a second.
  const Result two =
      tune(sweep_args("--name two"), "FAKE_SLEEP=1 FAKE_LOG='" + log.string() + "'");
  ASSERT_EQ(two.status, 0) << two.out << two.err;
  EXPECT_NE(two.out.find("2 slots (cores "), std::string::npos) << two.out;

  auto outcomes = [](const std::vector<store::TrialRecord>& trials) {
    std::map<std::string, std::string> status;  // key -> status
    std::map<std::string, int64_t> longest;     // point -> longest ok real length
    for (const auto& t : trials) {
      if (t.remeasure_of) continue;
      status[t.key] = t.status;
      if (t.status == "ok" && !t.probe) longest[t.point] = std::max(longest[t.point], t.seqlen);
    }
    return std::make_pair(status, longest);
  };
  const auto one_trials = trials("one"), two_trials = trials("two");
  EXPECT_EQ(outcomes(two_trials), outcomes(one_trials));
  EXPECT_EQ(outcomes(one_trials).second.size(), 6u);  // every point but the two without savings

  store::Store store = store::Store::open(db_);
  store::SweepStore sweeps(store.db());
  EXPECT_TRUE(sweeps.trial_neighbours(sweeps.find_sweep("one")->id).empty());
  std::set<std::pair<int64_t, int64_t>> neighbours;
  for (const auto& n : sweeps.trial_neighbours(sweeps.find_sweep("two")->id)) {
    neighbours.insert({n.trial_id, n.neighbour_id});
  }
  const std::map<int64_t, Span> spans = fake_spans(log);
  std::set<std::string> slots_used;
  int64_t ran = 0;
  for (const auto& t : one_trials) EXPECT_EQ(t.slot, "") << t.key;
  for (const auto& a : two_trials) {
    if (!a.ran()) {
      EXPECT_EQ(a.slot, "") << a.key;
      continue;
    }
    ++ran;
    EXPECT_EQ(a.slot.rfind("cores ", 0), 0u) << a.key << ": " << a.slot;
    slots_used.insert(a.slot);
    ASSERT_TRUE(spans.count(a.id)) << a.key;
    const bool offloads = a.point.find("\"memory.offload\":\"activations\"") != std::string::npos;
    for (const auto& b : two_trials) {
      if (b.id == a.id || !b.ran()) continue;
      // The runs' own times lie inside what the sweep saw: overlapping runs are neighbours.
      if (overlap(spans.at(a.id), spans.at(b.id))) {
        EXPECT_TRUE(neighbours.count({a.id, b.id})) << a.key << " / " << b.key;
        EXPECT_NE(a.slot, b.slot) << a.key << " / " << b.key;
      }
      if (neighbours.count({a.id, b.id})) {
        EXPECT_TRUE(neighbours.count({b.id, a.id}));
      }
      if (offloads) {
        EXPECT_FALSE(neighbours.count({a.id, b.id})) << a.key << " had a neighbour";
      }
    }
  }
  EXPECT_EQ(slots_used.size(), 2u);
  EXPECT_FALSE(neighbours.empty());
  // The best (an offload at the target length) ran alone: nothing to re-measure.
  for (const auto& t : two_trials) EXPECT_FALSE(t.remeasure_of.has_value()) << t.key;

  // isolation shared: offloading trials have neighbours too; the best is then re-measured alone.
  std::string shared = kSlotsExperiment;
  shared += "isolation: shared\n";
  std::ofstream(experiment_) << shared;
  const Result three = tune(sweep_args("--name shared"), "FAKE_SLEEP=1");
  ASSERT_EQ(three.status, 0) << three.out << three.err;
  const auto shared_trials = trials("shared");
  EXPECT_EQ(outcomes(shared_trials), outcomes(one_trials));
  // The two seeds' offloads tie at the target: the first is re-measured, then the other, which
  // now ranks first, then the first re-measure stands first.
  std::vector<const store::TrialRecord*> again;
  for (const auto& t : shared_trials) {
    if (t.remeasure_of) again.push_back(&t);
  }
  ASSERT_FALSE(again.empty()) << three.out;
  EXPECT_LE(again.size(), 3u);
  const int64_t shared_id = sweeps.find_sweep("shared")->id;
  const auto pairs = sweeps.trial_neighbours(shared_id);
  for (const store::TrialRecord* r : again) {
    const auto original = sweeps.trial(*r->remeasure_of);
    ASSERT_TRUE(original.has_value());
    EXPECT_EQ(r->key, original->key + " remeasure");
    EXPECT_EQ(r->seqlen, original->seqlen);
    EXPECT_EQ(r->status, "ok");
    bool original_had_neighbours = false;
    for (const auto& n : pairs) {
      EXPECT_NE(n.trial_id, r->id) << "the re-measure had a neighbour";
      original_had_neighbours = original_had_neighbours || n.trial_id == original->id;
    }
    EXPECT_TRUE(original_had_neighbours) << original->key;
  }
  const Result rec = tune("recommend --db '" + db_ + "' --sweep shared --no-check --out '" +
                          (dir_ / "rec").string() + "'");
  ASSERT_EQ(rec.status, 0) << rec.err;
  const std::string why = read_text(dir_ / "rec" / "WHY.md");
  EXPECT_NE(why.find("Winner: trial #" + std::to_string(again.front()->id) + " "),
            std::string::npos)
      << why;
}

// A sweep of two slots stopped while two trials run: SIGTERM stops both (each stays `running`,
// the sweep `interrupted`, exit 130); SIGKILL leaves both `running` too; --resume runs again
// exactly those two of the trials stored before and keeps every finished one.
TEST_F(SweepCliTest, AStoppedTwoSlotSweepResumesOnlyTheTwoTrialsThatRan) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cores";
  std::string text = kSlotsExperiment;  // four independent points at two lengths
  auto set = [&](const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
  };
  set("  memory.tiled_loss: [1, 8]\n  memory.offload: [none, activations]\n", "");
  set("data.seed: [0, 1]", "data.seed: [0, 1, 2, 3]");
  set("[2048, 4096]", "[1024, 2048]");
  std::ofstream(experiment_) << text;
  for (const int signal : {SIGTERM, SIGKILL}) {
    const std::string name = signal == SIGTERM ? "term" : "kill";
    const fs::path log = dir_ / (name + ".log");
    const std::string out = (dir_ / (name + ".out")).string();
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("FAKE_SLEEP", "1", 1);
      setenv("FAKE_LOG", log.c_str(), 1);
      freopen(out.c_str(), "w", stdout);
      freopen(out.c_str(), "a", stderr);
      execl(tune_.c_str(), tune_.c_str(), "sweep", experiment_.c_str(), "--db", db_.c_str(),
            "--name", name.c_str(), "--trainer", fake_.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Once a trial has finished and two are running.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::vector<int64_t> in_flight;
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      in_flight.clear();
      int64_t ended = 0;
      for (const auto& [id, span] : fake_spans(log)) {
        if (span.end == 0) in_flight.push_back(id);
        ended += span.end > 0;
      }
      if (ended >= 1 && in_flight.size() == 2) break;
    }
    ASSERT_EQ(in_flight.size(), 2u) << read_text(out);
    kill(pid, signal);
    int status = 0;
    waitpid(pid, &status, 0);
    if (signal == SIGTERM) {
      ASSERT_TRUE(WIFEXITED(status)) << read_text(out);
      EXPECT_EQ(WEXITSTATUS(status), kExitInterrupted) << read_text(out);
    }
    std::map<int64_t, std::string> finished;  // id -> finished_at
    std::vector<int64_t> running;
    int64_t last_id = 0;  // of the rows stored before the resume
    for (const auto& t : trials(name)) {
      last_id = std::max(last_id, t.id);
      if (t.status == "running") running.push_back(t.id);
      if (t.ran() && t.status != "running") finished[t.id] = t.finished_at;
    }
    std::sort(in_flight.begin(), in_flight.end());
    EXPECT_EQ(running, in_flight) << read_text(out);
    EXPECT_GE(finished.size(), 1u);
    {
      store::Store store = store::Store::open(db_);
      store::SweepStore sweeps(store.db());
      EXPECT_EQ(sweeps.find_sweep(name)->status, signal == SIGTERM ? "interrupted" : "running");
    }

    fs::remove(log);
    const Result resumed = tune(sweep_args("--name " + name + " --resume"),
                                "FAKE_SLEEP=0.1 FAKE_LOG='" + log.string() + "'");
    ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
    std::vector<int64_t> rerun;  // trials stored before that ran again
    for (const auto& [id, span] : fake_spans(log)) {
      if (id <= last_id) rerun.push_back(id);
    }
    EXPECT_EQ(rerun, in_flight);
    for (const auto& t : trials(name)) {
      EXPECT_NE(t.status, "running") << t.key;
      if (finished.count(t.id)) {
        EXPECT_EQ(t.finished_at, finished[t.id]) << t.key;
      }
    }
  }
}

}  // namespace
}  // namespace ulysses::sweep
