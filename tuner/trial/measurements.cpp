// summary.json / metrics.jsonl -> Measurements (see measurements.h). Field names are those
// MetricsWriter writes (src/train/metrics.cpp).
#include "tuner/trial/measurements.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/input_file.h"

namespace ulysses::trial {
namespace {

using nlohmann::json;

std::optional<double> number(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::optional<int64_t> integer(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->is_number_float() ? static_cast<int64_t>(it->get<double>()) : it->get<int64_t>();
}

// The text of `path`; nullopt when it is missing or unreadable, or over kMaxInputFileBytes (then
// *error, when still empty, says so in one line).
std::optional<std::string> read_text(const std::string& path, std::string* error) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  try {
    return read_input_file(path, "a JSON file");
  } catch (const UserError& e) {
    if (error->empty()) *error = e.what();
    return std::nullopt;
  }
}

// The JSON object in `path`, or nullopt when the file is missing, refused by read_text, or holds
// no JSON object.
std::optional<json> read_object(const std::string& path, std::string* error) {
  const std::optional<std::string> text = read_text(path, error);
  if (!text) return std::nullopt;
  json value = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return std::nullopt;
  return value;
}

// The step lines of metrics.jsonl; *peak_host_bytes = their largest peak_host_bytes (nullopt
// when none has one).
std::vector<store::TrialStep> read_steps(const std::string& path,
                                         std::optional<int64_t>* peak_host_bytes,
                                         std::string* error) {
  std::vector<store::TrialStep> steps;
  std::istringstream in(read_text(path, error).value_or(""));
  for (std::string line; std::getline(in, line);) {
    const json value = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!value.is_object() || value.contains("eval") || !integer(value, "step")) continue;
    store::TrialStep step;
    step.step = *integer(value, "step");
    step.loss = number(value, "loss").value_or(0.0);
    step.grad_norm = number(value, "grad_norm").value_or(0.0);
    step.step_ms = number(value, "step_ms").value_or(0.0);
    step.tokens_per_s = number(value, "tokens_per_s").value_or(0.0);
    step.peak_mem_bytes = integer(value, "peak_mem_bytes").value_or(0);
    if (const auto host = integer(value, "peak_host_bytes")) {
      *peak_host_bytes = std::max(peak_host_bytes->value_or(0), *host);
    }
    steps.push_back(step);
  }
  return steps;
}

void read_summary(const json& summary, Measurements* m) {
  m->summary_found = true;
  m->summary_json = summary.dump();
  if (integer(summary, "measured_steps").value_or(0) > 0) {
    m->step_ms = number(summary, "step_ms_median");
    m->tokens_per_s = number(summary, "tokens_per_s_median");
    m->tokens_per_s_per_rank = number(summary, "tokens_per_s_per_rank_median");
    m->final_loss = number(summary, "final_loss");
  }
  // The largest rank's peak (ulysses-train all-reduces it); rank 0's when a summary lacks it.
  m->peak_mem_bytes = integer(summary, "max_rank_peak_mem_bytes");
  if (!m->peak_mem_bytes) m->peak_mem_bytes = integer(summary, "peak_mem_bytes");
  m->peak_host_bytes = integer(summary, "max_rank_peak_host_bytes");
  if (!m->peak_host_bytes) m->peak_host_bytes = integer(summary, "peak_host_bytes");
  const auto phases = summary.find("phases_ms_median");
  if (phases != summary.end() && phases->is_object()) {
    for (const auto& [name, ms] : phases->items()) {
      if (ms.is_number()) m->phases.push_back({name, ms.get<double>()});
    }
  }
  for (const char* category : kCategoryPhases) {
    const std::string key = std::string(category) + "_median";
    if (const auto ms = number(summary, key.c_str())) m->phases.push_back({category, *ms});
  }
}

}  // namespace

Measurements read_measurements(const std::string& output_dir) {
  Measurements m;
  std::optional<int64_t> steps_peak_host;
  const std::optional<json> summary = read_object(output_dir + "/summary.json", &m.error);
  m.steps = read_steps(output_dir + "/metrics.jsonl", &steps_peak_host, &m.error);
  if (summary) {
    read_summary(*summary, &m);
  } else if (!m.steps.empty()) {  // no summary (the run failed): peak memory of the steps it ran
    int64_t peak = 0;
    for (const auto& step : m.steps) peak = std::max(peak, step.peak_mem_bytes);
    m.peak_mem_bytes = peak;
    m.peak_host_bytes = steps_peak_host;
  }
  return m;
}

}  // namespace ulysses::trial
