// Least-squares calibration of the cost model's free coefficients (see calibration.h).
#include "tuner/costmodel/calibration.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "common/error.h"

namespace ulysses::costmodel {

const char* const kTimeColumns[kTimeColumnCount] = {
    "GEMM", "attention", "communication", "overhead", "host optimizer pass", "upload"};

// Ring attention's K/V pass is left out: predict_time hides it behind the blocks' attention, and
// the fit takes it as hidden too.
double comm_bytes(const StepWork& w) {
  return w.a2a_bytes + w.allreduce_bytes + w.zero_reduce_bytes + w.zero_gather_bytes;
}

MemoryCoefficients fit_memory(const std::vector<Measured>& trials, LinearFit* fit) {
  MemoryCoefficients bare;
  bare.runtime_bytes = 0, bare.allocator_fraction = 0, bare.activation_scale = 1;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (const Measured& m : trials) {
    x.push_back({1.0, static_cast<double>(predict_memory(m.config, bare).peak_bytes)});
    y.push_back(m.value);
  }
  const LinearFit f = fit_relative_least_squares(x, y);
  if (fit) *fit = f;
  MemoryCoefficients k;
  k.runtime_bytes = f.coefficients[0];
  k.allocator_fraction = f.coefficients[1] - 1.0;
  return k;
}

TimeCoefficients fit_time(const std::vector<Measured>& trials, const TimeCoefficients& base,
                          LinearFit* fit, std::vector<std::string>* inseparable) {
  if (trials.empty()) throw UserError("fit: no step times to fit");
  const double upload_ms_per_gb =
      base.ms_per_gb_upload >= 0 ? base.ms_per_gb_upload : base.ms_per_gb_offload;
  const bool upload_known = upload_ms_per_gb > 0;
  const double exposed = 1 - base.optimizer_overlap;  // of the optimizer's phase
  std::vector<std::vector<double>> all;
  std::vector<double> y, known;
  int64_t threads = -1;  // the offloaded trials' optim.host_threads; 0 = auto or mixed
  for (const Measured& m : trials) {
    const StepWork w = step_work(m.config);
    const double upload_gb = w.optimizer_upload_bytes / 1e9;
    all.push_back({w.matmul_flops / 1e12, w.attention_flops / 1e12, comm_bytes(w) / 1e9, 1.0,
                   exposed * (w.optimizer_norm_bytes + w.optimizer_host_bytes) / 1e9,
                   upload_known ? 0.0 : exposed * upload_gb});
    y.push_back(m.value);
    known.push_back(upload_known ? exposed * upload_gb * upload_ms_per_gb : 0.0);
    if (w.optimizer_host_bytes > 0) threads = threads < 0 || threads == w.host_threads ? w.host_threads : 0;
  }
  // Only the columns these trials tell apart: trials of one shape (one mesh, one length) do the
  // same GEMM, attention and communication work in the same proportions, so one coefficient
  // explains them all and the others are left at 0.
  std::vector<size_t> used = independent_columns(all);
  if (inseparable) {
    inseparable->clear();
    for (size_t c = 0; c < kTimeColumnCount; ++c) {
      bool nonzero = false;
      for (const auto& row : all) nonzero = nonzero || row[c] != 0;
      if (nonzero && std::find(used.begin(), used.end(), c) == used.end()) {
        inseparable->push_back(kTimeColumns[c]);
      }
    }
  }
  // Non-negative: a throughput or an overhead below zero has no meaning. Refit without the most
  // negative column until none is left negative (a small active-set method).
  LinearFit f;
  while (true) {
    std::vector<std::vector<double>> x;
    for (const auto& row : all) {
      std::vector<double> r;
      for (size_t c : used) r.push_back(row[c]);
      x.push_back(r);
    }
    f = fit_relative_least_squares(x, y, known);
    size_t worst = used.size();
    for (size_t i = 0; i < used.size(); ++i) {
      const bool more_negative = worst == used.size() || f.coefficients[i] < f.coefficients[worst];
      if (f.coefficients[i] < 0 && more_negative) worst = i;
    }
    if (worst == used.size() || used.size() == 1) break;
    used.erase(used.begin() + static_cast<std::ptrdiff_t>(worst));
  }
  if (fit) *fit = f;
  double b[kTimeColumnCount] = {0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < used.size(); ++i) b[used[i]] = std::max(0.0, f.coefficients[i]);
  TimeCoefficients k = base;
  k.ms_per_tflop = b[0];
  k.ms_per_tflop_attention = b[1];
  k.ms_per_gb_a2a = k.ms_per_gb_allreduce = b[2];
  k.overhead_ms = b[3];
  // A host rate no trial measured (none offloaded its optimizer) stays base's, the profile's.
  const bool host_measured = threads >= 0;
  k.ms_per_gb_host = host_measured ? b[4] : base.ms_per_gb_host;
  k.host_threads = host_measured ? threads : base.host_threads;
  k.ms_per_gb_upload = upload_known ? upload_ms_per_gb : b[5];
  return k;
}

}  // namespace ulysses::costmodel
