// `ulysses-tune recommend`'s numerics check end to end with the real ulysses-train: a sweep of one
// tiny configuration, then recommend runs it for 3 steps beside the same model on one rank and
// compares loss, grad norm and eval loss per step (fp32 tolerance 1e-4 relative). A Ulysses
// winner with DP, an uneven-heads winner and a ring winner pass; the same Ulysses mesh with an eval
// loss made wrong on purpose (ULYSSES_FAULT_SP_EVAL_SCALE=1: the trainer's test-only fault hook,
// src/train/evaluator.cpp, multiplies the eval loss by sp) fails, is not recommended, and
// recommend exits 1 writing nothing; beside a slower configuration that passes, that one is
// recommended.
#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "sweep_cli_fixture.h"
#include "tuner/store/database.h"

namespace ulysses::sweep {
namespace {

// One point on `world` ranks: heads 4 (KV 2), 64 tokens, fp32 on CPU; `mesh` the base's mesh
// section, `axis` the space's line of one value beside the length.
std::string experiment(const std::string& name, int world, const std::string& mesh,
                       const std::string& axis) {
  return "name: " + name + "\nhardware: cpu-local\nworld_size: " + std::to_string(world) +
         "\nmemory_limit_gib: 1.0\nheadroom: 0.1\nbase:\n"
         "  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2,\n"
         "          intermediate_size: 64, vocab_size: 128}\n"
         "  sequence: {micro_batch: 1, grad_accum: 1}\n"
         "  train: {device: cpu, steps: 5}\n"
         "  comm: {timeout_s: 60, collective_timeout_s: 60}\n" +
         (mesh.empty() ? std::string() : "  mesh: " + mesh + "\n") + "space:\n" +
         (axis.empty() ? std::string() : "  " + axis + "\n") +
         "  sequence.length: [64]\nobjective: throughput\nbudget: {trial_timeout_s: 60}\n"
         "trial: {warmup_steps: 1, steps: 1}\n";
}

struct CheckRow {
  std::string status, reason;
  nlohmann::json result;
};

class NumericsCheckTest : public SweepCliTest {
 protected:
  // Sweeps `yaml` (its one trial must be ok).
  void sweep(const std::string& yaml) {
    std::ofstream(experiment_) << yaml;
    const Result r = tune("sweep '" + experiment_ + "' --db '" + db_ + "'");
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  std::vector<CheckRow> rows() {
    store::Database db = store::Database::open(db_, store::Database::Mode::kReadOnly);
    std::vector<CheckRow> out;
    store::Statement s =
        db.prepare("SELECT status, reason, result FROM numerics_checks ORDER BY id");
    while (s.step()) {
      out.push_back({s.column_text(0), s.column_text(1), nlohmann::json::parse(s.column_text(2))});
    }
    return out;
  }
  // A passed check: both runs' 3 steps agree within the tolerance, WHY.md shows them.
  void expect_passed(const std::string& out_dir, int ranks, int dp) {
    const Result r = tune("recommend --db '" + db_ + "' --out '" + out_dir + "'");
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("numerics check passed"), std::string::npos) << r.out;
    const std::vector<CheckRow> checks = rows();
    ASSERT_EQ(checks.size(), 1u);
    EXPECT_EQ(checks[0].status, "passed") << checks[0].reason;
    const nlohmann::json& j = checks[0].result;
    EXPECT_EQ(j["candidate_ranks"], ranks);
    EXPECT_DOUBLE_EQ(j["tolerance"].get<double>(), 1e-4);
    EXPECT_LE(j["worst"].get<double>(), 1e-4);
    for (const char* run : {"candidate", "reference"}) {
      ASSERT_EQ(j[run].size(), 3u) << run;
      for (const auto& step : j[run]) {
        for (const char* m : {"loss", "grad_norm", "eval_loss"}) {
          EXPECT_TRUE(step[m].is_number()) << run << " " << m;
        }
      }
    }
    // Not the same numbers by accident: the model learns, so steps differ.
    EXPECT_NE(j["candidate"][0]["loss"], j["candidate"][2]["loss"]);
    const std::string why = read_text(fs::path(out_dir) / "WHY.md");
    EXPECT_NE(why.find("## Numerics check"), std::string::npos) << why;
    EXPECT_NE(why.find("**passed**"), std::string::npos) << why;
    EXPECT_NE(why.find("--nproc " + std::to_string(ranks) + "`"), std::string::npos) << why;
    EXPECT_NE(why.find("| 3 | "), std::string::npos) << why;
    // The reference: one rank, the same global batch through grad_accum.
    const std::string ref = read_text(fs::path(out_dir) / "numerics-check/trial-1-reference.yaml");
    EXPECT_NE(ref.find("sp: 1"), std::string::npos) << ref;
    EXPECT_NE(ref.find("grad_accum: " + std::to_string(dp)), std::string::npos) << ref;
  }
};

TEST_F(NumericsCheckTest, UlyssesWinnerPassesAndAWrongEvalLossIsNotRecommended) {
  sweep(experiment("nc-ulysses", 4, "", "mesh.sp: [2]"));  // dp 2 x sp 2
  expect_passed((dir_ / "rec").string(), 4, 2);

  const std::string wrong = (dir_ / "rec-wrong").string();
  const Result r = tune("recommend --db '" + db_ + "' --out '" + wrong + "'",
                        "ULYSSES_FAULT_SP_EVAL_SCALE=1");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("not recommended: trial #1 (dp=2 sp=2): eval loss at step "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("differs by 100% from one rank's"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no candidate passed the numerics check"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(wrong));
  const std::vector<CheckRow> checks = rows();
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_EQ(checks[1].status, "failed");
  EXPECT_EQ(checks[1].result["worst_metric"], "eval_loss");
  EXPECT_NEAR(checks[1].result["worst"].get<double>(), 1.0, 1e-3);  // sp x the loss

  // --no-check recommends it, and WHY.md says the check was skipped.
  const Result skipped =
      tune("recommend --no-check --db '" + db_ + "' --out '" + wrong + "'",
           "ULYSSES_FAULT_SP_EVAL_SCALE=1");
  ASSERT_EQ(skipped.status, 0) << skipped.out << skipped.err;
  EXPECT_NE(read_text(fs::path(wrong) / "WHY.md").find("Skipped (`--no-check`)"),
            std::string::npos);
  EXPECT_EQ(rows().size(), 2u);  // nothing ran, nothing stored

  // A slower second configuration, dp 2 x sp 1 on 2 ranks (the fault spares it): the faulted
  // winner is passed over and the next one, which passes, is recommended.
  {
    store::Store st = store::Store::open(db_);
    store::SweepStore sweeps(st.db());
    store::TrialRecord t = *sweeps.trial(1);
    t.id = 0;
    t.key += "-dp2";
    t.point = R"({"mesh.sp": 1})";
    t.world_size = 2, t.dp = 2, t.sp = 1;
    t.config_yaml = config::to_yaml(
        config::parse_run_config_yaml(t.config_yaml, {"mesh.sp=1", "mesh.dp=2"}));
    t.tokens_per_s_per_rank = *t.tokens_per_s_per_rank / 2;
    t.tokens_per_s = *t.tokens_per_s / 2;
    t.step_ms = *t.step_ms * 2;
    sweeps.add_trial(t);
    ASSERT_EQ(t.id, 2);
  }
  const std::string next = (dir_ / "rec-next").string();
  const Result fallback =
      tune("recommend --db '" + db_ + "' --out '" + next + "'", "ULYSSES_FAULT_SP_EVAL_SCALE=1");
  ASSERT_EQ(fallback.status, 0) << fallback.out << fallback.err;
  EXPECT_NE(fallback.err.find("not recommended: trial #1 (dp=2 sp=2): eval loss"),
            std::string::npos)
      << fallback.err;
  EXPECT_NE(fallback.out.find("recommended: trial #2 "), std::string::npos) << fallback.out;
  const std::string why = read_text(fs::path(next) / "WHY.md");
  EXPECT_NE(why.find("### Trial #1 (dp=2 sp=2): **failed**"), std::string::npos) << why;
  EXPECT_NE(why.find("### Trial #2 (dp=2 sp=1): **passed**"), std::string::npos) << why;
  const std::vector<CheckRow> all = rows();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[2].status, "failed");
  EXPECT_EQ(all[3].status, "passed");
  EXPECT_EQ(all[3].result["candidate_ranks"], 2);
}

TEST_F(NumericsCheckTest, UnevenHeadsWinnerPasses) {
  sweep(experiment("nc-uneven", 3, "{uneven_heads: true}", "mesh.sp: [3]"));  // 4 heads over 3 ranks
  expect_passed((dir_ / "rec").string(), 3, 1);
}

TEST_F(NumericsCheckTest, RingWinnerPasses) {
  sweep(experiment("nc-ring", 4, "{sp: 4, sp_ring: 2}", ""));  // 2 a2a x 2 ring
  expect_passed((dir_ / "rec").string(), 4, 1);
}

}  // namespace
}  // namespace ulysses::sweep
