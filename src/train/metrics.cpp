// metrics.jsonl and summary.json writer (see metrics.h).
#include "train/metrics.h"

#include <algorithm>
#include <filesystem>

#include "common/error.h"

namespace ulysses::train {
namespace {

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& dir, int64_t warmup_steps)
    : dir_(dir), warmup_steps_(warmup_steps) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  metrics_.open(dir + "/metrics.jsonl", std::ios::trunc);
  if (!metrics_) throw UserError("output.dir: cannot write " + dir + "/metrics.jsonl");
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
                         {"phases", m.phases}};
  metrics_ << line.dump() << "\n";
  metrics_.flush();
  steps_.push_back(m);
}

void MetricsWriter::write_eval(const nlohmann::json& record) {
  metrics_ << nlohmann::json{{"eval", record}}.dump() << "\n";
  metrics_.flush();
}

void MetricsWriter::write_summary(const nlohmann::json& extra) const {
  std::vector<const StepMetrics*> measured;
  for (const auto& s : steps_)
    if (s.step > warmup_steps_) measured.push_back(&s);
  if (measured.empty())
    for (const auto& s : steps_) measured.push_back(&s);

  std::vector<double> step_ms, tps;
  std::map<std::string, std::vector<double>> phases;
  int64_t peak = 0, peak_host = 0;
  for (const auto* s : measured) {
    step_ms.push_back(s->step_ms);
    tps.push_back(s->tokens_per_s);
    for (const auto& [name, ms] : s->phases) phases[name].push_back(ms);
  }
  for (const auto& s : steps_) {
    peak = std::max(peak, s.peak_mem_bytes);
    peak_host = std::max(peak_host, s.peak_host_bytes);
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
                            {"first_loss", steps_.empty() ? 0.0 : steps_.front().loss}};
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
