// The numerics check of `ulysses-tune recommend` (see numerics_check.h).
#include "tuner/recommend/numerics_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/shell_quote.h"
#include "config/run_config.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/trial/runner.h"

namespace ulysses::recommend {
namespace {

namespace fs = std::filesystem;

std::string num(double v, const char* format = "%.6g") {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

std::string percent(double v) { return num(100.0 * v, "%.3g") + "%"; }

// The step records and evaluation records of one run's metrics.jsonl, by step.
std::vector<CheckStep> read_steps(const fs::path& metrics) {
  std::map<int64_t, CheckStep> by_step;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("eval") && j["eval"].is_object()) {
      const auto& e = j["eval"];
      if (!e.contains("step") || !e.contains("loss")) continue;
      CheckStep& s = by_step[e["step"].get<int64_t>()];
      s.step = e["step"].get<int64_t>();
      s.eval_loss = e["loss"].get<double>();
    } else if (j.contains("step") && j["step"].is_number_integer()) {
      CheckStep& s = by_step[j["step"].get<int64_t>()];
      s.step = j["step"].get<int64_t>();
      if (j.contains("loss") && j["loss"].is_number()) s.loss = j["loss"].get<double>();
      if (j.contains("grad_norm") && j["grad_norm"].is_number()) {
        s.grad_norm = j["grad_norm"].get<double>();
      }
    }
  }
  std::vector<CheckStep> steps;
  for (const auto& [step, s] : by_step) {
    if (step >= 1) steps.push_back(s);
  }
  return steps;
}

nlohmann::json read_summary(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

double relative(double a, double reference) {
  if (a == reference) return 0.0;
  if (!std::isfinite(a) || !std::isfinite(reference)) return INFINITY;
  return std::abs(a - reference) / std::max(std::abs(reference), 1e-12);
}

std::string metric_words(const std::string& metric) {
  return metric == "eval_loss" ? "eval loss" : metric == "grad_norm" ? "grad norm" : metric;
}

std::string launch_command(const std::string& yaml_file, int ranks) {
  return "ulysses-tune launch " + shell_quote(yaml_file) + " --nproc " + std::to_string(ranks);
}

// Compares the runs step by step; sets worst_* and, when over the tolerance or a record is
// missing, status failed with the reason.
void compare(NumericsCheck* c) {
  c->status = "passed";
  for (int64_t step = 1; step <= c->steps; ++step) {
    const auto find = [&](const std::vector<CheckStep>& steps) -> const CheckStep* {
      for (const CheckStep& s : steps) {
        if (s.step == step) return &s;
      }
      return nullptr;
    };
    const CheckStep* a = find(c->candidate);
    const CheckStep* b = find(c->reference);
    for (const char* metric : {"loss", "grad_norm", "eval_loss"}) {
      const std::string m = metric;
      const auto value = [&](const CheckStep* s) -> std::optional<double> {
        if (s == nullptr) return std::nullopt;
        return m == "loss" ? s->loss : m == "grad_norm" ? s->grad_norm : s->eval_loss;
      };
      const std::optional<double> va = value(a), vb = value(b);
      if (!va || !vb) {
        c->status = "failed";
        c->reason = std::string("the ") + (!va ? "candidate" : "reference") +
                    " run recorded no " + metric_words(m) + " at step " + std::to_string(step);
        return;
      }
      const double d = relative(*va, *vb);
      if (c->worst_metric.empty() || d > c->worst) {
        c->worst = d, c->worst_metric = m, c->worst_step = step;
      }
    }
  }
  if (c->worst > c->tolerance) {
    const CheckStep* a = nullptr;
    const CheckStep* b = nullptr;
    for (const CheckStep& s : c->candidate) a = s.step == c->worst_step ? &s : a;
    for (const CheckStep& s : c->reference) b = s.step == c->worst_step ? &s : b;
    const auto pick = [&](const CheckStep& s) {
      return *(c->worst_metric == "loss"        ? s.loss
               : c->worst_metric == "grad_norm" ? s.grad_norm
                                                : s.eval_loss);
    };
    c->status = "failed";
    c->reason = metric_words(c->worst_metric) + " at step " + std::to_string(c->worst_step) +
                " differs by " + percent(c->worst) + " from one rank's (" + num(pick(*a)) +
                " vs " + num(pick(*b)) + "; tolerance " + num(c->tolerance, "%.0e") + " relative)";
  } else {
    c->reason = "every step's loss, grad norm and eval loss within " +
                num(c->tolerance, "%.0e") + " relative of one rank's (worst " +
                num(c->worst, "%.1e") + ", " + metric_words(c->worst_metric) + " at step " +
                std::to_string(c->worst_step) + ")";
  }
}

std::string cell(const std::optional<double>& v) { return v ? num(*v) : std::string("-"); }

}  // namespace

double numerics_tolerance(const std::string& precision) {
  // fp32: the runs differ only in the order of their sums (all-to-alls, ring blocks, DP and
  // accumulation): ~1e-7 relative per step; 1e-4 leaves room for longer sequences and larger
  // models over a few Adam steps. bf16 keeps 8 bits of mantissa (3.9e-3 relative per rounding),
  // and the two meshes round at different places in every layer: 2e-2.
  return precision == "bf16" || precision == "bf16-states" ? 2e-2 : 1e-4;
}

nlohmann::ordered_json NumericsCheck::to_json() const {
  const auto steps_json = [](const std::vector<CheckStep>& steps) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const CheckStep& s : steps) {
      nlohmann::ordered_json row = {{"step", s.step}};
      row["loss"] = s.loss ? nlohmann::ordered_json(*s.loss) : nlohmann::ordered_json();
      row["grad_norm"] =
          s.grad_norm ? nlohmann::ordered_json(*s.grad_norm) : nlohmann::ordered_json();
      row["eval_loss"] =
          s.eval_loss ? nlohmann::ordered_json(*s.eval_loss) : nlohmann::ordered_json();
      rows.push_back(row);
    }
    return rows;
  };
  nlohmann::ordered_json j = {{"status", status},
                              {"reason", reason},
                              {"trial_id", trial_id},
                              {"configuration", configuration},
                              {"precision", precision},
                              {"tolerance", tolerance},
                              {"steps", steps},
                              {"candidate_ranks", candidate_ranks},
                              {"candidate_command", candidate_command},
                              {"reference_command", reference_command},
                              {"worst", worst},
                              {"worst_metric", worst_metric},
                              {"worst_step", worst_step}};
  j["candidate"] = steps_json(candidate);
  j["reference"] = steps_json(reference);
  return j;
}

CheckConfigs check_configs(const store::TrialRecord& t, const CheckOptions& o,
                           const std::string& candidate_dir, const std::string& reference_dir) {
  const config::RunConfig stored = config::parse_run_config_yaml(t.config_yaml);
  // The same short run for both: a few steps, an evaluation after each on held-out batches
  // (the trial's eval.source, else synthetic data of another seed, else the training source),
  // the full model (no probe shortcut), no checkpoints, no memory cap (the one rank holds what
  // the mesh split).
  std::vector<std::string> common = {
      "train.steps=" + std::to_string(o.steps), "profile.warmup_steps=0",
      "attention.skip_all_but_last=false", "eval.every=1", "memory.limit_gib=0",
      "checkpoint.dir=", "checkpoint.resume=", "checkpoint.save_initial=false"};
  if (stored.eval.source.empty() && stored.data.source == "synthetic") {
    common.push_back("eval.source=synthetic");
    common.push_back("eval.seed=" + std::to_string(stored.data.seed + 1));
  } else if (stored.eval.source.empty()) {
    // Prepared data without an eval set: the training source's first batches (its documents
    // and loss mask as the run reads them); both runs read the same ones.
    common.push_back("eval.source=" + stored.data.source);
  }
  std::vector<std::string> candidate = common;
  candidate.push_back("eval.steps=" + std::to_string(o.eval_batches));
  candidate.push_back("output.dir=" + candidate_dir);
  // One rank, the same global batch (dp x micro_batch x grad_accum samples per step, the same
  // samples in the same order: data_loader.h) and the same eval samples (dp x eval.steps).
  std::vector<std::string> reference = common;
  const int64_t dp = stored.mesh.dp;
  reference.insert(reference.end(),
                   {"mesh.sp=1", "mesh.dp=1", "mesh.sp_ring=1", "mesh.uneven_heads=false",
                    "zero.stage=0",
                    "sequence.grad_accum=" + std::to_string(stored.sequence.grad_accum * dp),
                    "eval.steps=" + std::to_string(o.eval_batches * dp),
                    "output.dir=" + reference_dir});
  CheckConfigs c;
  c.candidate_yaml = config::to_yaml(config::parse_run_config_yaml(t.config_yaml, candidate));
  c.reference_yaml = config::to_yaml(config::parse_run_config_yaml(t.config_yaml, reference));
  c.candidate_ranks = static_cast<int>(stored.mesh.dp * stored.mesh.sp);
  c.precision = stored.memory.precision;
  return c;
}

NumericsCheck check_numerics(const store::TrialRecord& t, const CheckOptions& o) {
  NumericsCheck c;
  c.trial_id = t.id;
  c.configuration = report::configuration(t);
  c.steps = o.steps;
  const fs::path base = fs::path(o.work_dir) / ("trial-" + std::to_string(t.id));
  const fs::path candidate_dir = base.string() + "-candidate";
  const fs::path reference_dir = base.string() + "-reference";
  const CheckConfigs configs =
      check_configs(t, o, candidate_dir.string(), reference_dir.string());
  c.candidate_yaml = configs.candidate_yaml;
  c.reference_yaml = configs.reference_yaml;
  c.candidate_ranks = configs.candidate_ranks;
  c.precision = configs.precision;
  c.tolerance = numerics_tolerance(configs.precision);
  c.candidate_command = launch_command("numerics-check/trial-" + std::to_string(t.id) +
                                           "-candidate.yaml",
                                       configs.candidate_ranks);
  c.reference_command = launch_command("numerics-check/trial-" + std::to_string(t.id) +
                                           "-reference.yaml",
                                       1);
  if (configs.candidate_ranks == 1) {
    c.status = "passed";
    c.reason = "it runs on one rank without sequence or data parallelism: it is its own "
               "reference";
    return c;
  }
  const auto run = [&](const fs::path& dir, const std::string& yaml, int ranks) {
    trial::TrialSpec spec;
    spec.run_dir = dir.string();
    spec.output_dir = dir.string();
    spec.config_yaml = yaml;
    spec.nproc = ranks;
    spec.timeout_s = o.timeout_s;
    spec.trainer = o.trainer;
    return trial::make_trial_runner("local")->run(spec);
  };
  const trial::TrialOutcome a = run(candidate_dir, configs.candidate_yaml,
                                    configs.candidate_ranks);
  if (a.status == "running") throw UserError("recommend: interrupted during the numerics check");
  if (a.status != "ok") {
    c.status = "failed";
    c.reason = "its short run ended " + a.status + (a.error.empty() ? "" : ": " + a.error);
    return c;
  }
  const trial::TrialOutcome b = run(reference_dir, configs.reference_yaml, 1);
  if (b.status == "running") throw UserError("recommend: interrupted during the numerics check");
  c.candidate = read_steps(candidate_dir / "metrics.jsonl");
  if (b.status != "ok") {
    c.status = "not_run";
    c.reason = "the one-rank reference ended " + b.status +
               (b.error.empty() ? "" : ": " + b.error) + ", so nothing was compared";
    return c;
  }
  c.reference = read_steps(reference_dir / "metrics.jsonl");
  // The mesh the candidate reports must be the mesh it was given (an sp setting ignored would
  // agree in numbers with one rank).
  const config::RunConfig asked = config::parse_run_config_yaml(configs.candidate_yaml);
  const nlohmann::json summary = read_summary(candidate_dir / "summary.json");
  for (const auto& [key, want] : {std::pair<const char*, int64_t>{"sp", asked.mesh.sp},
                                  std::pair<const char*, int64_t>{"dp", asked.mesh.dp}}) {
    if (!summary.contains(key) || !summary[key].is_number_integer() ||
        summary[key].get<int64_t>() != want) {
      c.status = "failed";
      c.reason = std::string("its run reports ") + key + " " +
                 (summary.contains(key) ? summary[key].dump() : std::string("nothing")) +
                 " in summary.json, configured " + std::to_string(want);
      return c;
    }
  }
  compare(&c);
  return c;
}

std::string render_numerics_section(const std::vector<NumericsCheck>& checks) {
  std::ostringstream md;
  md << "\n## Numerics check\n\n";
  if (checks.empty()) return md.str();
  const NumericsCheck& last = checks.back();
  if (last.status == "skipped") {
    md << "Skipped (`--no-check`): the recommended configuration was not compared with the same "
          "model on one rank.\n";
    return md.str();
  }
  if (last.status == "not_run" && last.candidate_command.empty()) {
    md << "Not run: " << last.reason << ".\n";
    return md.str();
  }
  md << "Before a configuration is recommended, a short run of it (" << last.steps
     << " steps, an evaluation after each) and a run of the same model on one rank (sp 1, dp 1, "
        "no ring, no uneven heads, no ZeRO sharding; the same global batch through grad_accum, "
        "the same seed, data and memory features) must agree per step in loss, grad norm and "
        "eval loss within a relative tolerance: 1e-4 in fp32 (the meshes differ only in the "
        "order of their sums), 2e-2 in bf16 (8 bits of mantissa, rounded at different places "
        "by each mesh). Both configurations are in `numerics-check/`.\n\n";
  for (const NumericsCheck& c : checks) {
    md << "### Trial #" << c.trial_id << " (" << c.configuration << "): **" << c.status
       << "**\n\n";
    md << c.reason << ".\n\n";
    if (c.candidate_ranks <= 1) continue;
    md << "- candidate: `" << c.candidate_command << "`\n- reference: `" << c.reference_command
       << "`\n- precision " << c.precision << ", tolerance " << num(c.tolerance, "%.0e")
       << " relative\n\n";
    if (c.candidate.empty() && c.reference.empty()) continue;
    md << "| step | loss | loss (1 rank) | grad norm | grad norm (1 rank) | eval loss | "
          "eval loss (1 rank) | worst rel. diff |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (int64_t step = 1; step <= c.steps; ++step) {
      CheckStep a, b;
      for (const CheckStep& s : c.candidate) a = s.step == step ? s : a;
      for (const CheckStep& s : c.reference) b = s.step == step ? s : b;
      double worst = 0.0;
      bool any = false;
      for (const auto& [x, y] : {std::pair{a.loss, b.loss}, std::pair{a.grad_norm, b.grad_norm},
                                 std::pair{a.eval_loss, b.eval_loss}}) {
        if (x && y) worst = std::max(worst, relative(*x, *y)), any = true;
      }
      md << "| " << step << " | " << cell(a.loss) << " | " << cell(b.loss) << " | "
         << cell(a.grad_norm) << " | " << cell(b.grad_norm) << " | " << cell(a.eval_loss)
         << " | " << cell(b.eval_loss) << " | " << (any ? num(worst, "%.1e") : "-") << " |\n";
    }
    md << "\n";
  }
  return md.str();
}

}  // namespace ulysses::recommend
