// Fitted coefficients <-> calibrations rows, and the sweep's predictions (see calibrated_model.h).
#include "tuner/results/calibrated_model.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace ulysses::plan {

std::string default_precision(const calibrate::HardwareProfile& hw) {
  return hw.device_type == "cuda" ? "bf16" : "fp32";
}

costmodel::TimeCoefficients time_coefficients(const calibrate::HardwareProfile& hw,
                                              const std::string& precision, int64_t sp,
                                              int64_t world, int64_t sp_ring) {
  const bool cuda = hw.device_type == "cuda";
  const double peak = hw.peak_tflops(precision.empty() ? default_precision(hw) : precision);
  costmodel::TimeCoefficients k;
  if (peak > 0) {
    k.ms_per_tflop = 1000.0 / (peak * (cuda ? 0.60 : 0.25));
    k.ms_per_tflop_attention = 1000.0 / (peak * (cuda ? 0.45 : 0.10));
  }
  auto link = [&](int64_t ranks) {
    const double gbps = ranks <= hw.devices_per_node ? hw.intra_node_gbps : hw.inter_node_gbps;
    return gbps > 0 ? 1000.0 / (0.8 * gbps) : 0.0;
  };
  k.ms_per_gb_a2a = link(sp / std::max<int64_t>(1, sp_ring));
  k.ms_per_gb_ring = link(sp);
  k.ms_per_gb_allreduce = link(world);
  k.ms_per_gb_offload = hw.host_to_device_gbps > 0 ? 1000.0 / (0.8 * hw.host_to_device_gbps) : 0;
  // The offloaded optimizer's host passes: the rank's share of the node's host memory bandwidth,
  // reached by the threads the trainer gives a rank by default (the node's cores over its ranks).
  k.ms_per_gb_host =
      costmodel::default_ms_per_gb_host(hw.host_memory_bandwidth_gbps(), hw.devices_per_node);
  k.host_threads =
      hw.host_cores > 0 ? std::max<int64_t>(1, hw.host_cores / hw.devices_per_node) : 0;
  k.overhead_ms = 5.0;
  k.overlap = 0.0;
  return k;
}

costmodel::MemoryCoefficients memory_coefficients(const calibrate::HardwareProfile& hw) {
  return costmodel::default_memory_coefficients(hw.device_type);
}


std::vector<store::Calibration> fit_rows(const CalibratedModel& m, const std::string& params) {
  const char* fit = store::kCostModelFitBenchmark;
  return {{0, fit, "runtime_bytes", m.memory.runtime_bytes, "B", params},
          {0, fit, "allocator_fraction", m.memory.allocator_fraction, "1", params},
          {0, fit, "ms_per_tflop", m.time.ms_per_tflop, "ms/TFLOP", params},
          {0, fit, "ms_per_tflop_attention", m.time.ms_per_tflop_attention, "ms/TFLOP", params},
          {0, fit, "ms_per_gb_comm", m.time.ms_per_gb_a2a, "ms/GB", params},
          {0, fit, "overhead_ms", m.time.overhead_ms, "ms", params},
          {0, fit, "ms_per_gb_host", m.time.ms_per_gb_host, "ms/GB", params},
          {0, fit, "host_threads", static_cast<double>(m.time.host_threads), "threads", params},
          {0, fit, "ms_per_gb_upload", m.time.ms_per_gb_upload, "ms/GB", params},
          {0, fit, "optimizer_overlap", m.time.optimizer_overlap, "1", params}};
}

CalibratedModel model_from_rows(const std::vector<store::Calibration>& rows,
                                const std::string& device_type, const std::string& where) {
  std::map<std::string, double> values;
  for (const store::Calibration& row : rows) {
    if (row.benchmark == store::kCostModelFitBenchmark) values[row.metric] = row.value;
  }
  auto get = [&](const char* name) {
    const auto it = values.find(name);
    if (it == values.end()) throw UserError(where + ": no coefficient '" + name + "'");
    return it->second;
  };
  CalibratedModel m;
  m.memory = costmodel::default_memory_coefficients(device_type);
  m.memory.runtime_bytes = get("runtime_bytes");
  m.memory.allocator_fraction = get("allocator_fraction");
  m.time.ms_per_tflop = get("ms_per_tflop");
  m.time.ms_per_tflop_attention = get("ms_per_tflop_attention");
  m.time.ms_per_gb_a2a = m.time.ms_per_gb_allreduce = get("ms_per_gb_comm");
  m.time.overhead_ms = get("overhead_ms");
  // The offloaded optimizer's terms; a fit stored before they existed has none (defaults).
  auto get_or = [&](const char* name, double fallback) {
    const auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  };
  m.time.ms_per_gb_host = get_or("ms_per_gb_host", m.time.ms_per_gb_host);
  m.time.host_threads = static_cast<int64_t>(get_or("host_threads", 0));
  m.time.ms_per_gb_upload = get_or("ms_per_gb_upload", m.time.ms_per_gb_upload);
  m.time.optimizer_overlap = get_or("optimizer_overlap", m.time.optimizer_overlap);
  m.time_calibrated = true;
  return m;
}

CalibratedModel load_model(store::Database& db, const std::string& device_type) {
  std::optional<store::CalibrationRun> run = store::latest_model_fit(db, device_type);
  if (!run) run = store::latest_model_fit(db, "");
  if (!run) {
    CalibratedModel m;
    m.memory = costmodel::default_memory_coefficients(device_type);
    return m;
  }
  CalibratedModel m = model_from_rows(store::read_calibrations(db, run->id), device_type,
                                      db.path() + ": calibration run " + std::to_string(run->id));
  // Memory keeps the defaults: a fit of runtime + overhead on one sweep's few peaks follows its
  // noise (a quickstart fit gave 90 % overhead and missed a later trial by 21 %), while the
  // defaults held every ok trial of two sweeps within 10 % (reports/cost-model-cpu/).
  m.memory = costmodel::default_memory_coefficients(device_type);
  m.fit_run_id = run->id;
  return m;
}

int64_t predict_peak_bytes(const CalibratedModel& m, const config::RunConfig& c) {
  return costmodel::predict_memory(c, m.memory).peak_bytes;
}

double predict_step_ms(const CalibratedModel& m, const calibrate::HardwareProfile& hw,
                       const config::RunConfig& c) {
  const costmodel::TimeCoefficients k =
      m.time_calibrated ? m.time
                        : time_coefficients(hw, c.memory.precision, c.mesh.sp,
                                            c.mesh.dp * c.mesh.sp, costmodel::ring_ranks(c));
  return costmodel::predict_time(costmodel::step_work(c), k).step_ms;
}

}  // namespace ulysses::plan
