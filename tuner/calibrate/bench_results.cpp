// Benchmark JSON -> calibration rows (see bench_results.h).
#include "tuner/calibrate/bench_results.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ulysses::calibrate {
namespace {

struct CounterUnit {
  const char* counter;
  const char* unit;
};
constexpr CounterUnit kCounters[] = {
    {"algbw_GBps", "GB/s"}, {"busbw_GBps", "GB/s"}, {"tflops", "TFLOP/s"}, {"GBps", "GB/s"}};

double to_ms(double value, const std::string& unit) {
  if (unit == "ns") return value / 1e6;
  if (unit == "us") return value / 1e3;
  if (unit == "s") return value * 1e3;
  return value;  // "ms"
}

nlohmann::json name_params(const std::string& name) {
  nlohmann::json params = nlohmann::json::object();
  size_t begin = name.find('/');
  while (begin != std::string::npos) {
    const size_t end = name.find('/', begin + 1);
    const std::string piece =
        name.substr(begin + 1, end == std::string::npos ? end : end - begin - 1);
    const size_t colon = piece.find(':');
    if (colon != std::string::npos) params[piece.substr(0, colon)] = piece.substr(colon + 1);
    begin = end;
  }
  return params;
}

}  // namespace

std::string benchmark_family(const std::string& name) { return name.substr(0, name.find('/')); }

std::vector<store::Calibration> calibrations_from_bench_json(const std::string& json_text,
                                                             const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(source + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array()) {
    throw UserError(source + ": not Google Benchmark JSON (no \"benchmarks\" array)");
  }
  std::vector<store::Calibration> rows;
  for (const nlohmann::json& run : doc["benchmarks"]) {
    if (run.value("run_type", "iteration") != "iteration") continue;
    if (run.value("error_occurred", false)) continue;
    std::string name = run.value("name", "");
    const std::string suffix = "/manual_time";  // Google Benchmark's mark of UseManualTime
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      name.resize(name.size() - suffix.size());
    }
    if (name.empty() || !run.contains("real_time")) continue;
    const std::string params = name_params(name).dump();
    auto add = [&](const std::string& metric, double value, const std::string& unit) {
      store::Calibration row;
      row.benchmark = name;
      row.metric = metric;
      row.value = value;
      row.unit = unit;
      row.params = params;
      rows.push_back(std::move(row));
    };
    add("time_ms", to_ms(run["real_time"].get<double>(), run.value("time_unit", "ns")), "ms");
    for (const CounterUnit& c : kCounters) {
      if (run.contains(c.counter) && run[c.counter].is_number()) {
        add(c.counter, run[c.counter].get<double>(), c.unit);
      }
    }
  }
  return rows;
}

}  // namespace ulysses::calibrate
