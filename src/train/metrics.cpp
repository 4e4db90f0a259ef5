// metrics.jsonl and summary.json writer (see metrics.h).
#include "train/metrics.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <c10/util/Exception.h>

#include "common/error.h"
#include "common/input_file.h"
#include "memory/memory_stats.h"

namespace ulysses::train {
namespace {

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// Achieved model FLOP/s of one rank in a step.
double flops_per_rank(const StepMetrics& m, int64_t world_size) {
  return m.step_ms > 0.0 ? m.model_flops / (m.step_ms / 1000.0) / static_cast<double>(world_size)
                         : 0.0;
}

// The fields of a metrics.jsonl step record that the summary uses.
StepMetrics step_from_json(const nlohmann::json& line) {
  StepMetrics m;
  m.step = line.value("step", int64_t{0});
  m.loss = line.value("loss", 0.0);
  m.grad_norm = line.value("grad_norm", 0.0);
  m.lr = line.value("lr", 0.0);
  m.tokens = line.value("tokens", int64_t{0});
  m.valid_tokens = line.value("valid_tokens", int64_t{0});
  m.step_ms = line.value("step_ms", 0.0);
  m.tokens_per_s = line.value("tokens_per_s", 0.0);
  m.peak_mem_bytes = line.value("peak_mem_bytes", int64_t{0});
  m.peak_host_bytes = line.value("peak_host_bytes", int64_t{0});
  if (line.contains("phases")) m.phases = line["phases"].get<std::map<std::string, double>>();
  m.compute_ms = line.value("compute_ms", 0.0);
  m.comm_ms = line.value("comm_ms", 0.0);
  m.offload_ms = line.value("offload_ms", 0.0);
  m.optimizer_ms = line.value("optimizer_ms", 0.0);
  m.comm_wait_ms = line.value("comm_wait_ms", 0.0);
  m.model_flops = line.value("model_flops", 0.0);
  m.skipped = line.value("skipped", false);
  m.first_sample = line.value("first_sample", int64_t{0});
  return m;
}

// The step a metrics.jsonl record belongs to (an eval record's "eval.step"); -1 when none.
int64_t record_step(const nlohmann::json& line) {
  if (line.contains("step")) return line["step"].get<int64_t>();
  if (line.contains("eval") && line["eval"].contains("step")) return line["eval"]["step"].get<int64_t>();
  return -1;
}

}  // namespace

void StepMetrics::set_times(const profile::StepTimes& times) {
  phases = times.phases;
  compute_ms = times.compute_ms;
  comm_ms = times.comm_ms;
  offload_ms = times.offload_ms;
  optimizer_ms = times.optimizer_ms;
  comm_wait_ms = times.comm_wait_ms;
}

void MetricsWriter::set_throughput_basis(int64_t world_size, double peak_flops_per_rank) {
  TORCH_CHECK(world_size >= 1 && peak_flops_per_rank >= 0.0, "set_throughput_basis: bad arguments");
  world_size_ = world_size;
  peak_flops_per_rank_ = peak_flops_per_rank;
}

MetricsWriter::MetricsWriter(const std::string& dir, int64_t warmup_steps, int64_t resumed_step)
    : dir_(dir), warmup_steps_(warmup_steps) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/metrics.jsonl";
  std::string kept;  // earlier records of a resumed run, one per line
  if (resumed_step > 0 && std::filesystem::exists(path, ec)) {
    std::istringstream in(read_input_file(path, "a metrics file", kMaxMetricsFileBytes));
    std::string text;
    while (std::getline(in, text)) {
      nlohmann::json line = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (line.is_discarded() || !line.is_object()) continue;  // a line cut by a kill
      const int64_t step = record_step(line);
      if (step < 0 || step > resumed_step) continue;
      kept += text + "\n";
      if (line.contains("step")) steps_.push_back(step_from_json(line)), ++kept_steps_;
    }
  }
  {  // rewrite through a temporary file so a crash here loses nothing
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) throw UserError("output.dir: cannot write " + path);
  }
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) throw UserError("output.dir: cannot write " + path + " (" + ec.message() + ")");
  metrics_.open(path, std::ios::app);
  if (!metrics_) throw UserError("output.dir: cannot write " + path);
}

void MetricsWriter::write_step(const StepMetrics& m) {
  nlohmann::json line = {{"step", m.step},
                         {"loss", m.loss},
                         {"grad_norm", m.grad_norm},
                         {"lr", m.lr},
                         {"tokens", m.tokens},
                         {"valid_tokens", m.valid_tokens},
                         {"step_ms", m.step_ms},
                         {"tokens_per_s", m.tokens_per_s},
                         {"peak_mem_bytes", m.peak_mem_bytes},
                         {"peak_host_bytes", m.peak_host_bytes},
                         {"phases", m.phases},
                         {"compute_ms", m.compute_ms},
                         {"comm_ms", m.comm_ms},
                         {"offload_ms", m.offload_ms},
                         {"optimizer_ms", m.optimizer_ms},
                         {"comm_wait_ms", m.comm_wait_ms},
                         {"tokens_per_s_per_rank",
                          m.tokens_per_s / static_cast<double>(world_size_)},
                         {"first_sample", m.first_sample}};
  if (m.skipped) line["skipped"] = true;
  if (m.model_flops > 0.0) {
    line["model_flops"] = m.model_flops;
    line["tflops_per_rank"] = flops_per_rank(m, world_size_) / 1e12;
  }
  metrics_ << line.dump() << "\n";
  metrics_.flush();
  steps_.push_back(m);
}

void MetricsWriter::write_eval(const nlohmann::json& record) {
  metrics_ << nlohmann::json{{"eval", record}}.dump() << "\n";
  metrics_.flush();
}

void MetricsWriter::write_summary(const nlohmann::json& extra) const {
  // Warm-up: the first warmup_steps steps this process ran (after a resume the first steps are
  // cold again), and among the records kept from before a resume, the run's first steps.
  std::vector<const StepMetrics*> measured;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto kept = static_cast<size_t>(kept_steps_);
    const bool warm = i < kept ? steps_[i].step <= warmup_steps_
                               : static_cast<int64_t>(i - kept) < warmup_steps_;
    if (!warm) measured.push_back(&steps_[i]);
  }
  if (measured.empty())
    for (const auto& s : steps_) measured.push_back(&s);

  std::vector<double> step_ms, tps, flops;
  std::map<std::string, std::vector<double>> phases, categories;
  int64_t peak = 0, peak_host = 0, skipped = 0;
  for (const auto* s : measured) {
    step_ms.push_back(s->step_ms);
    tps.push_back(s->tokens_per_s);
    for (const auto& [name, ms] : s->phases) phases[name].push_back(ms);
    categories["compute_ms_median"].push_back(s->compute_ms);
    categories["comm_ms_median"].push_back(s->comm_ms);
    categories["offload_ms_median"].push_back(s->offload_ms);
    categories["optimizer_ms_median"].push_back(s->optimizer_ms);
    categories["comm_wait_ms_median"].push_back(s->comm_wait_ms);
    if (s->model_flops > 0.0) flops.push_back(flops_per_rank(*s, world_size_));
  }
  for (const auto& s : steps_) {
    peak = std::max(peak, s.peak_mem_bytes);
    peak_host = std::max(peak_host, s.peak_host_bytes);
    skipped += s.skipped ? 1 : 0;
  }
  nlohmann::json phase_medians = nlohmann::json::object();
  for (auto& [name, values] : phases) phase_medians[name] = median(values);

  nlohmann::json summary = {{"steps", steps_.size()},
                            {"measured_steps", measured.size()},
                            {"warmup_steps", warmup_steps_},
                            {"step_ms_median", median(step_ms)},
                            {"tokens_per_s_median", median(tps)},
                            {"phases_ms_median", phase_medians},
                            {"peak_mem_bytes", peak},
                            {"peak_host_bytes", peak_host},
                            {"final_loss", steps_.empty() ? 0.0 : steps_.back().loss},
                            {"first_loss", steps_.empty() ? 0.0 : steps_.front().loss},
                            {"skipped_steps", skipped}};
  for (auto& [key, values] : categories) summary[key] = median(values);
  summary["tokens_per_s_per_rank_median"] = median(tps) / static_cast<double>(world_size_);
  if (!flops.empty()) {
    const double achieved = median(flops);  // FLOP/s per rank
    summary["model_flops_per_step"] = measured.back()->model_flops;
    summary["tflops_per_rank_median"] = achieved / 1e12;
    summary["flops_formula"] = "6*N_matmul + 6*L*sl*hq*hd per token (profile/flops.h)";
    if (peak_flops_per_rank_ > 0.0) {
      summary["peak_tflops_per_rank"] = peak_flops_per_rank_ / 1e12;
      summary["mfu"] = achieved / peak_flops_per_rank_;
    }
  }
  // What peak_mem_bytes counts from (rank 0's start-up baseline); absent when not measured.
  if (const std::optional<int64_t> baseline = memory::startup_baseline_bytes()) {
    summary["memory_baseline_bytes"] = *baseline;
  }
  for (const auto& [key, value] : extra.items()) summary[key] = value;
  const std::string tmp = dir_ + "/.summary.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << summary.dump(2) << "\n";
    if (!out) throw UserError("output.dir: cannot write " + dir_ + "/summary.json");
  }
  std::filesystem::rename(tmp, dir_ + "/summary.json");
}

}  // namespace ulysses::train
