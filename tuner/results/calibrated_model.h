// The cost model's coefficients as the tuner uses them: the defaults of a hardware profile or a
// fit stored in a results database (calibrations rows with benchmark costmodel.fit, written by
// `plan --fit DB`), and the two predictions a sweep stores beside each trial's measurement.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"
#include "tuner/calibrate/hardware_profile.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/costmodel/time_model.h"
#include "tuner/store/database.h"
#include "tuner/store/store.h"

namespace ulysses::plan {

// The precision a profile's runs use by default: bf16 on CUDA, fp32 on CPU.
std::string default_precision(const calibrate::HardwareProfile& hw);

// Time coefficients for a profile and sp: ms per TFLOP from peak x efficiency (GEMM 0.60,
// attention 0.45 on CUDA; 0.25 / 0.10 on CPU), all-to-all and all-reduce at 0.8 x the link they
// cross (intra-node when sp (resp. world) <= devices_per_node, else inter-node), offload at
// 0.8 x host_to_device, the offloaded optimizer's host passes at the rank's share of the node's
// host memory bandwidth (costmodel::default_ms_per_gb_host; host_threads = host_cores /
// devices_per_node, 0 when the profile gives no cores), 5 ms overhead, no overlap. With ring
// attention (sp_ring > 1) the all-to-all spans sp / sp_ring ranks and the ring's neighbour
// transfers cross the link of the whole SP group.
costmodel::TimeCoefficients time_coefficients(const calibrate::HardwareProfile& hw,
                                              const std::string& precision, int64_t sp,
                                              int64_t world, int64_t sp_ring = 1);

// Default memory coefficients: costmodel::default_memory_coefficients(hw.device_type).
costmodel::MemoryCoefficients memory_coefficients(const calibrate::HardwareProfile& hw);

struct CalibratedModel {
  costmodel::MemoryCoefficients memory;
  costmodel::TimeCoefficients time;  // used when time_calibrated, else the profile's per mesh
  bool time_calibrated = false;
  int64_t fit_run_id = 0;  // calibration_runs.id of the fit, 0 = defaults
};

// The coefficient rows of a fit (metric = runtime_bytes, allocator_fraction, ms_per_tflop,
// ms_per_tflop_attention, ms_per_gb_comm, overhead_ms; the names of the calibration JSON).
std::vector<store::Calibration> fit_rows(const CalibratedModel& m, const std::string& params);

// Defaults for `device_type` with the rows of a fit applied. Throws UserError naming the first
// coefficient the rows lack ("<where>: no coefficient 'ms_per_tflop'").
CalibratedModel model_from_rows(const std::vector<store::Calibration>& rows,
                                const std::string& device_type, const std::string& where);

// The time coefficients of the newest fit for `device_type` in `db` (any device when none
// matches), or the defaults; memory coefficients are always the defaults (see the .cpp).
CalibratedModel load_model(store::Database& db, const std::string& device_type);

// Peak bytes per rank (CPU: peak RSS) and step milliseconds of a validated run config; the
// time from the fit when there is one, else from `hw`'s peaks (planner.h time_coefficients).
int64_t predict_peak_bytes(const CalibratedModel& m, const config::RunConfig& c);
double predict_step_ms(const CalibratedModel& m, const calibrate::HardwareProfile& hw,
                       const config::RunConfig& c);

}  // namespace ulysses::plan
