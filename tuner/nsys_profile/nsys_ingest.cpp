// nsys SQLite export -> comm / compute / overlap kernel time (see nsys_ingest.h).
#include "tuner/nsys_profile/nsys_ingest.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "tuner/store/database.h"

namespace ulysses::nsys_profile {
namespace {

using Interval = std::pair<int64_t, int64_t>;  // [start, end) in ns
using Intervals = std::vector<Interval>;       // sorted, disjoint after normalize()

Intervals normalize(Intervals in) {
  std::sort(in.begin(), in.end());
  Intervals out;
  for (const Interval& i : in) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

// Intersection of two normalized lists.
Intervals intersect(const Intervals& a, const Intervals& b) {
  Intervals out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].first, b[j].first);
    const int64_t hi = std::min(a[i].second, b[j].second);
    if (lo < hi) out.emplace_back(lo, hi);
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return out;
}

double measure_ms(const Intervals& normalized) {
  int64_t ns = 0;
  for (const Interval& i : normalized) ns += i.second - i.first;
  return static_cast<double>(ns) / 1e6;
}

bool overlaps(const Interval& kernel, const Intervals& window) {
  auto it = std::upper_bound(window.begin(), window.end(), Interval{kernel.first, INT64_MAX});
  if (it != window.begin() && std::prev(it)->second > kernel.first) return true;
  return it != window.end() && it->first < kernel.second;
}

bool is_nccl(const std::string& name) {
  if (name.size() < 4) return false;
  std::string head = name.substr(0, 4);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return head == "nccl";
}

// The step windows of `options.domain`, or empty when there are none.
Intervals step_windows(store::Database& db, const IngestOptions& options, int64_t* steps) {
  *steps = 0;
  if (!db.has_table("NVTX_EVENTS")) return {};
  const bool has_text_id = db.has_column("NVTX_EVENTS", "textId");
  const bool has_domain = db.has_column("NVTX_EVENTS", "domainId");
  const std::string text = has_text_id ? "COALESCE(n.text, s.value)" : "n.text";
  const std::string join = has_text_id ? " LEFT JOIN StringIds s ON n.textId = s.id" : "";
  std::string domain_filter;
  if (has_domain) {
    store::Statement domains = db.prepare("SELECT n.domainId FROM NVTX_EVENTS n" + join +
                                          " WHERE n.eventType = 75 AND " + text + " = ?");
    domains.bind(1, options.domain);
    std::string ids;
    while (domains.step()) {
      if (!ids.empty()) ids += ',';
      ids += std::to_string(domains.column_int(0));
    }
    if (!ids.empty()) domain_filter = " AND n.domainId IN (" + ids + ")";
  }
  store::Statement ranges =
      db.prepare("SELECT n.globalTid, n.start, n.end FROM NVTX_EVENTS n" + join +
                 " WHERE n.eventType = 59 AND n.end > n.start AND " + text + " = ?" +
                 domain_filter + " ORDER BY n.globalTid, n.start");
  ranges.bind(1, options.step_range);
  Intervals windows;
  std::map<int64_t, int64_t> seen_per_thread;
  while (ranges.step()) {
    if (seen_per_thread[ranges.column_int(0)]++ < options.skip_steps) continue;
    windows.emplace_back(ranges.column_int(1), ranges.column_int(2));
    ++*steps;
  }
  return normalize(std::move(windows));
}

struct DeviceKernels {
  Intervals comm, compute;
};

}  // namespace

KernelSplit ingest_nsys_sqlite(const std::string& path, const IngestOptions& options) {
  store::Database db = store::Database::open(path, store::Database::Mode::kReadOnly);
  for (const char* table : {"CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"}) {
    if (!db.has_table(table)) {
      throw UserError(path + ": no " + table +
                      " table (profile taken without `-t cuda`, or no kernel ran)");
    }
  }
  KernelSplit split;
  const Intervals windows = step_windows(db, options, &split.steps);

  std::map<int64_t, DeviceKernels> kernels;
  store::Statement rows = db.prepare(
      "SELECT k.deviceId, k.start, k.end, COALESCE(s.value, ''), COALESCE(d.value, '') "
      "FROM CUPTI_ACTIVITY_KIND_KERNEL k "
      "LEFT JOIN StringIds s ON k.shortName = s.id "
      "LEFT JOIN StringIds d ON k.demangledName = d.id");
  while (rows.step()) {
    const Interval interval{rows.column_int(1), rows.column_int(2)};
    DeviceKernels& device = kernels[rows.column_int(0)];
    const bool comm = is_nccl(rows.column_text(3)) || is_nccl(rows.column_text(4));
    (comm ? device.comm : device.compute).push_back(interval);
  }

  split.total.device = -1;
  for (auto& [device_id, device] : kernels) {
    Intervals window = windows;
    if (window.empty()) {  // no step ranges: the device's whole kernel span
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (const Intervals* list : {&device.comm, &device.compute}) {
        for (const Interval& i : *list) {
          lo = std::min(lo, i.first);
          hi = std::max(hi, i.second);
        }
      }
      window = normalize({{lo, hi}});
    }
    DeviceSplit d;
    d.device = device_id;
    for (const Interval& i : device.comm) d.comm_kernels += overlaps(i, window) ? 1 : 0;
    for (const Interval& i : device.compute) d.compute_kernels += overlaps(i, window) ? 1 : 0;
    if (d.comm_kernels + d.compute_kernels == 0) continue;
    const Intervals comm = intersect(normalize(device.comm), window);
    const Intervals compute = intersect(normalize(device.compute), window);
    Intervals all = comm;
    all.insert(all.end(), compute.begin(), compute.end());
    d.window_ms = measure_ms(window);
    d.comm_ms = measure_ms(comm);
    d.compute_ms = measure_ms(compute);
    d.overlap_ms = measure_ms(intersect(comm, compute));
    d.kernel_ms = measure_ms(normalize(std::move(all)));
    split.total.window_ms += d.window_ms;
    split.total.kernel_ms += d.kernel_ms;
    split.total.comm_ms += d.comm_ms;
    split.total.compute_ms += d.compute_ms;
    split.total.overlap_ms += d.overlap_ms;
    split.total.comm_kernels += d.comm_kernels;
    split.total.compute_kernels += d.compute_kernels;
    split.devices.push_back(d);
  }
  return split;
}

std::string describe(const KernelSplit& split) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(3);
  auto line = [&](const std::string& who, const DeviceSplit& d) {
    out << who << ": window " << d.window_ms << " ms, kernels " << d.kernel_ms << " ms, comm "
        << d.comm_ms << " ms (overlapped " << d.overlap_ms << " ms, exposed " << d.exposed_comm_ms()
        << " ms), compute " << d.compute_ms << " ms; " << d.comm_kernels << " NCCL + "
        << d.compute_kernels << " other kernels\n";
  };
  for (const DeviceSplit& d : split.devices) line("device " + std::to_string(d.device), d);
  line("total (" + std::to_string(split.devices.size()) + " devices, " +
           std::to_string(split.steps) + " step ranges)",
       split.total);
  return out.str();
}

}  // namespace ulysses::nsys_profile
