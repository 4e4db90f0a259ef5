// A results database holding one synthetic sweep, for the report / list / show tests.
//
// Trials (name: mesh dp x sp, seqlen, status, tokens/s per rank), tiled_mlp = 1 unless noted:
//   A 1x2 1024 ok 1000   B 1x2 2048 ok 900   C 1x2 4096 ok 700
//   D 2x1 1024 ok 1100   E 2x1 2048 ok 800   F 2x1 4096 ok 700
//   G 1x2 8192 ok 5000, a memory probe (its throughput must never count)
//   H 1x2 16384 oom (tiled_mlp 2; peak 9 GiB; error with a comma, quotes and a line break)
//   I 2x1 16384 pruned   J 1x3 1024 invalid (reason with a '|')   K 2x1 8192 timeout
// Every ok trial has phases compute 50, comm 20, offload 5, optimizer 5 ms and step 100 ms and
// a peak of seqlen x 256 KiB (whole process: the trials ran on CPU); limits are 8 GiB per rank.
// A and B have the cost model's predictions (A's step time +60 %). Pareto front: D, B, C. The
// experiment's objective is max-seqlen: the best trial is C (4096 tokens, as fast as F, lower id),
// which the summary names too; the fastest trial, D, is not the best.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tuner/report/report_command.h"
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"
#include "common/remove_tree.h"

namespace ulysses::report::testing {

class ReportFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("report-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ulysses::remove_tree(dir_);
    std::filesystem::create_directories(dir_);
    db_path_ = (dir_ / "results.db").string();
    store::Store store = store::Store::open(db_path_);
    store::SweepStore sweeps(store.db());
    store::SweepRecord sweep;
    sweep.name = "synthetic";
    sweep.experiment_path = "experiments/synthetic.yaml";
    sweep.experiment_yaml =
        "name: synthetic\nhardware: cpu-local\nworld_size: 2\nmemory_limit_gib: 8\n"
        "space:\n  mesh.sp: auto\n  memory.tiled_mlp: [1, 2]\n"
        "  sequence.length: [1024, 2048, 4096, 8192, 16384]\nobjective: max-seqlen\n";
    sweep.objective = "max-seqlen";
    sweep.environment = R"({"host":"node-7","devices":[{"name":"cpu","memory_gib":8}],)"
                        R"("versions":{"libtorch":"2.13.0"}})";
    sweep.id = sweeps.create_sweep(sweep);

    const int64_t gib = int64_t{1} << 30;
    add("A", sweeps, sweep.id, 1, 2, 1024, "ok", 1000, [](store::TrialRecord& t) {
      t.predicted_peak_bytes = int64_t{300} << 20;
      t.predicted_step_ms = 160.0;
    });
    add("B", sweeps, sweep.id, 1, 2, 2048, "ok", 900, [](store::TrialRecord& t) {
      t.predicted_peak_bytes = int64_t{600} << 20;
      t.predicted_step_ms = 95.0;
    });
    add("C", sweeps, sweep.id, 1, 2, 4096, "ok", 700);
    add("D", sweeps, sweep.id, 2, 1, 1024, "ok", 1100);
    add("E", sweeps, sweep.id, 2, 1, 2048, "ok", 800);
    add("F", sweeps, sweep.id, 2, 1, 4096, "ok", 700);
    add("G", sweeps, sweep.id, 1, 2, 8192, "ok", 5000,
        [](store::TrialRecord& t) { t.probe = true; });
    add("H", sweeps, sweep.id, 1, 2, 16384, "oom", 0, [&](store::TrialRecord& t) {
      t.point = R"({"mesh.sp":2,"memory.tiled_mlp":2,"sequence.length":16384})";
      t.exit_code = 12;
      t.peak_mem_bytes = 9 * gib;
      t.error = "out of memory: \"CUDA\", tried to allocate 2.00 GiB,\nat layer 3";
    });
    add("I", sweeps, sweep.id, 2, 1, 16384, "pruned", 0, [&](store::TrialRecord& t) {
      t.predicted_peak_bytes = 20 * gib;
      t.reason = "predicted peak 20.0 GiB > limit 8.0 GiB";
    });
    add("J", sweeps, sweep.id, 1, 3, 1024, "invalid", 0, [](store::TrialRecord& t) {
      t.world_size = 3;
      t.reason = "mesh.sp=3: does not divide 8 heads | kv heads";
    });
    add("K", sweeps, sweep.id, 2, 1, 8192, "timeout", 0, [](store::TrialRecord& t) {
      t.exit_code = 124;
      t.error = "trial ran past its timeout (600 s)";
    });
    sweep.status = "finished";
    sweep.finished_at = "2025-01-01T02:00:00Z";
    sweep.summary = R"({"trials_run":9,"pruned":1,"skipped":0,"invalid":1,"grid_trials":24,)"
                    R"("best_trial":)" +
                    std::to_string(id("C")) + R"(,"grid_comparison":{"grid_best_trial":)" +
                    std::to_string(id("C")) + R"(,"same_recommendation":true},"extra_key":"kept"})";
    sweeps.update_sweep(sweep);
  }
  void TearDown() override { ulysses::remove_tree(dir_); }

  int64_t id(const std::string& name) const { return ids_.at(name); }

  ReportOptions options(const std::filesystem::path& out) const {
    ReportOptions o;
    o.db_path = db_path_;
    o.sweep = "synthetic";
    o.out_dir = out.string();
    return o;
  }

  template <typename Fn = void (*)(store::TrialRecord&)>
  void add(
      const std::string& name, store::SweepStore& sweeps, int64_t sweep_id, int64_t dp, int64_t sp,
      int64_t seqlen, const std::string& status, double tokens_per_rank,
      Fn&& adjust = [](store::TrialRecord&) {}) {
    store::TrialRecord t;
    t.sweep_id = sweep_id;
    t.key = name;
    t.point = R"({"mesh.sp":)" + std::to_string(sp) +
              R"(,"memory.tiled_mlp":1,"sequence.length":)" + std::to_string(seqlen) + "}";
    t.config_yaml = "mesh: {dp: " + std::to_string(dp) + ", sp: " + std::to_string(sp) +
                    "}\nsequence: {length: " + std::to_string(seqlen) + "}\n";
    t.seqlen = seqlen;
    t.world_size = dp * sp;
    t.dp = dp;
    t.sp = sp;
    t.status = status;
    t.limit_bytes = int64_t{8} << 30;
    t.run_dir = "runs/synthetic/" + name;
    std::vector<store::TrialStep> steps;
    std::vector<store::TrialPhase> phases;
    if (status == "ok") {
      t.exit_code = 0;
      t.step_ms = 100.0;
      t.tokens_per_s_per_rank = tokens_per_rank;
      t.tokens_per_s = tokens_per_rank * static_cast<double>(t.world_size);
      t.peak_mem_bytes = seqlen * (int64_t{1} << 18);
      t.final_loss = 6.5 + 1.0 / 3.0;
      steps = {{1, 7.0, 2.0, 150.0, 10.0, 1000}, {2, 6.75, 1.5, 100.0, 20.0, 2000}};
      phases = {{"compute_ms", 50.0},
                {"comm_ms", 20.0},
                {"offload_ms", 5.0},
                {"optimizer_ms", 5.0},
                {"a2a", 20.0}};
    }
    adjust(t);
    if (status == "pruned" || status == "invalid") {
      sweeps.add_trial(t);
    } else {
      const store::TrialRecord finished = t;
      sweeps.begin_trial(t);
      store::TrialRecord done = finished;
      done.id = t.id;
      sweeps.finish_trial(done, steps, phases);
      t = done;
    }
    ids_[name] = t.id;
    trials_.push_back(t);
  }

  std::filesystem::path dir_;
  std::string db_path_;
  std::vector<store::TrialRecord> trials_;  // as stored, in id order
  std::map<std::string, int64_t> ids_;
};

}  // namespace ulysses::report::testing
