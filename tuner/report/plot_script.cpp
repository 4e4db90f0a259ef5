// gnuplot data and script for the report's plots (see plot_script.h).
#include "tuner/report/plot_script.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "tuner/results/backend_comparison.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/sweep_analysis.h"

namespace ulysses::report {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// A number for a gnuplot command: six significant digits.
std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// Starts one plot: resets settings, opens its PNG with the terminal chosen at the top. A
// `subtitle` goes on a second line of the title.
std::string begin_plot(const std::string& png, const std::string& title, int width, int height,
                       const std::string& subtitle = "") {
  return "\nreset\neval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, " +
         std::to_string(width) + ", " + std::to_string(height) + ")\nset output " +
         gnuplot_quote(png) + "\nset title " + gnuplot_quote(title) +
         (subtitle.empty() ? "" : " . \"\\n\" . " + gnuplot_quote(subtitle)) + "\nset grid\n";
}

// The length axis: log scale in x when the lengths span a factor of 4 or more (they usually
// double), and a range with a margin either side, so that no point sits on the frame.
// REQUIRES: lengths non-empty.
std::string length_axis(const std::vector<int64_t>& lengths) {
  std::string out = "set xlabel 'sequence length (tokens)'\nset format x '%.0f'\n";
  const auto [lo_it, hi_it] = std::minmax_element(lengths.begin(), lengths.end());
  double lo = static_cast<double>(*lo_it), hi = static_cast<double>(*hi_it);
  if (lo > 0 && hi >= 4 * lo) {
    out += "set logscale x 2\n";
    const double factor = std::max(1.25, std::pow(hi / lo, 0.05));
    lo /= factor, hi *= factor;
  } else {
    const double margin = hi > lo ? 0.08 * (hi - lo) : std::max(0.1 * hi, 1.0);
    lo -= margin, hi += margin;
  }
  return out + "set xrange [" + number(lo) + ":" + number(hi) + "]\n";
}

// A y range from 0 to a margin above `highest` (the largest value drawn), so that no point or
// bar touches the top of the frame ([0:1] when nothing is above 0); it starts a little below 0
// when `lowest` (the smallest point drawn) is near 0, so that such a point is not cut by the
// bottom of the frame. Bars, which start at 0, pass lowest = highest.
std::string y_from_zero(double lowest, double highest) {
  const double top = highest > 0 ? highest * 1.12 : 1.0;
  const double bottom = lowest < 0.04 * top ? -0.04 * top : 0.0;
  return "set yrange [" + number(bottom) + ":" + number(top) + "]\n";
}

// The x axis of one labelled column per trial (bars, or points at 0, 1, ...): the labels
// (column 1 of the data) slanted by 40 degrees and, when `rows` columns share `plot_px` pixels too
// tightly for that, only every k-th, so that no label runs into the next (neighbouring labels need
// 22 px between them across their slant: spacing x sin 40 degrees). Returns the xlabel and xtics
// commands; *xtic is the using-column that labels the rows.
std::string trial_axis(int rows, int plot_px, const std::string& what, std::string* xtic) {
  const double spacing = static_cast<double>(plot_px) / std::max(rows, 1);
  const int step = std::max(1, static_cast<int>(std::ceil(22.0 / (spacing * 0.64))));
  *xtic = step == 1 ? "xtic(1)"
                    : "xtic(int($0) % " + std::to_string(step) + " == 0 ? stringcolumn(1) : '')";
  const std::string every = step == 1 ? "" : " (one in " + std::to_string(step) + " labelled)";
  return "set xlabel " + gnuplot_quote(what + every + ": mesh dp x sp, sequence length") +
         "\nset xtics rotate by -40\n";
}

// Measured trials grouped by configuration (first-seen order), each group sorted by length.
std::vector<std::pair<std::string, std::vector<TrialRecord>>> by_configuration(
    const std::vector<TrialRecord>& trials) {
  std::vector<std::pair<std::string, std::vector<TrialRecord>>> groups;
  for (const auto& t : trials) {
    const std::string name = configuration(t);
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == name; });
    if (it == groups.end()) it = groups.insert(groups.end(), {name, {}});
    it->second.push_back(t);
  }
  for (auto& [name, group] : groups) {
    std::stable_sort(group.begin(), group.end(),
                     [](auto& a, auto& b) { return a.seqlen < b.seqlen; });
  }
  return groups;
}

std::vector<TrialRecord> measured(const std::vector<TrialRecord>& trials) {
  std::vector<TrialRecord> out;
  std::copy_if(trials.begin(), trials.end(), std::back_inserter(out), is_measured);
  return out;
}

constexpr const char* kNoMeasured =
    "no trial was measured (no `ok` trial that is not a memory probe)";

void throughput_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  const auto trials = measured(data.trials);
  if (trials.empty()) {
    plot.omitted = std::string("Not drawn: ") + kNoMeasured + ".";
    return;
  }
  dat = "# seqlen tokens_per_s_per_rank trial_id; one block per configuration\n";
  std::vector<int64_t> lengths;
  double lowest = std::numeric_limits<double>::infinity(), highest = 0.0;
  std::string plot_cmd = "plot ";
  int index = 0;
  for (const auto& [name, group] : by_configuration(trials)) {
    dat += "# " + name + "\n";
    for (const auto& t : group) {
      dat += std::to_string(t.seqlen) + " " + exact(t.tokens_per_s_per_rank) + " " +
             std::to_string(t.id) + "\n";
      lengths.push_back(t.seqlen);
      lowest = std::min(lowest, *t.tokens_per_s_per_rank);
      highest = std::max(highest, *t.tokens_per_s_per_rank);
    }
    dat += "\n\n";
    plot_cmd += std::string(index == 0 ? "'throughput.dat'" : ", \\\n     ''") + " index " +
                std::to_string(index) + " using 1:2 with linespoints lw 2 pt 7 title " +
                gnuplot_quote(name);
    ++index;
  }
  gp += begin_plot(plot.file, plot.title, 1000, 620) + length_axis(lengths) +
        "set ylabel 'tokens/s per rank'\n" + y_from_zero(lowest, highest) + "set key below\n" +
        plot_cmd + "\n";
}

// The unit of a memory axis: MiB when every value drawn is under 1 GiB, else GiB.
struct MemoryUnit {
  const char* name;
  double bytes;
  double of(int64_t b) const { return static_cast<double>(b) / bytes; }
  // `b` in this unit for a label: "415 MiB", "4.5 MiB", "8.00 GiB".
  std::string text(int64_t b) const {
    char out[48];
    const double v = of(b);
    std::snprintf(out, sizeof out, bytes == kGiB ? "%.2f %s" : v < 10 ? "%.1f %s" : "%.0f %s", v,
                  name);
    return out;
  }
};
MemoryUnit memory_unit(int64_t largest) {
  return largest < static_cast<int64_t>(kGiB) ? MemoryUnit{"MiB", kMiB} : MemoryUnit{"GiB", kGiB};
}

void memory_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  std::vector<TrialRecord> fit, probes, oom;
  std::set<int64_t> limits;
  for (const auto& t : data.trials) {
    if (t.limit_bytes && *t.limit_bytes > 0) limits.insert(*t.limit_bytes);
    if (t.status == "ok" && t.peak_mem_bytes) (t.probe ? probes : fit).push_back(t);
    if (t.status == "oom" && (t.peak_mem_bytes || (t.limit_bytes && *t.limit_bytes > 0))) {
      oom.push_back(t);
    }
  }
  if (fit.empty() && probes.empty() && oom.empty()) {
    plot.omitted =
        "Not drawn: no `ok` trial recorded its peak memory and no trial ran out of memory "
        "under a known limit.";
    return;
  }
  // The quantity drawn: the one the limit caps (memory_basis.h capped_peak), beside the limits;
  // when an ok trial did not record it (a CPU trial of an older ulysses-train), the RSS above the
  // baseline of every trial and no limit, which caps something else.
  // A CPU trial without a limit caps nothing: then the RSS, as every other printer shows it (on
  // CUDA the capped peak is the peak).
  const bool any_cpu = std::any_of(data.trials.begin(), data.trials.end(),
                                   [](auto& t) { return trial_device(t) != "cuda"; });
  const bool capped = (!limits.empty() || !any_cpu) &&
                      std::all_of(fit.begin(), fit.end(), [](auto& t) { return capped_peak(t); }) &&
                      std::all_of(probes.begin(), probes.end(),
                                  [](auto& t) { return capped_peak(t); });
  const bool cpu = limit_caps_address_space(data.trials);
  if (!capped) limits.clear();
  // An out-of-memory trial sits on the limit it exceeded (what it measured before the failing
  // allocation can lie below it); without one, at its measured peak in the quantity drawn.
  auto value = [&](const TrialRecord& t, bool out_of_memory) -> std::optional<int64_t> {
    if (out_of_memory && capped && t.limit_bytes && *t.limit_bytes > 0) return *t.limit_bytes;
    return capped ? capped_peak(t) : peak_above_baseline(t);
  };
  std::erase_if(oom, [&](const TrialRecord& t) { return !value(t, true); });
  if (fit.empty() && probes.empty() && oom.empty()) {
    plot.omitted = "Not drawn: no trial that ran out of memory recorded a limit or a peak.";
    return;
  }
  int64_t largest = limits.empty() ? 0 : *limits.rbegin();
  for (const auto* group : {&fit, &probes, &oom}) {
    for (const auto& t : *group) largest = std::max(largest, *value(t, group == &oom));
  }
  const MemoryUnit unit = memory_unit(largest);
  const std::string quantity = !capped ? "RSS above the start-up RSS"
                               : cpu   ? "address space above the start-up address space"
                                       : "peak above the start-up baseline";

  std::vector<std::pair<std::string, std::vector<TrialRecord>>> groups = by_configuration(fit);
  if (!probes.empty()) groups.emplace_back("memory probes", probes);
  std::string limit_text;  // "415 MiB, 830 MiB": the dashed lines, in the points' unit
  for (int64_t limit : limits) limit_text += (limit_text.empty() ? "" : ", ") + unit.text(limit);
  dat = std::string("# seqlen ") + unit.name + " trial_id: per rank, " + quantity +
        "; blocks: configurations, then probes, then out of memory\n" +
        (limits.empty() ? "" : "# per-rank limit " + limit_text + " (the dashed lines)\n");
  std::vector<int64_t> lengths;
  for (const auto* group : {&fit, &probes, &oom}) {
    for (const auto& t : *group) lengths.push_back(t.seqlen);
  }
  const std::string x_axis = length_axis(lengths);
  double lowest = std::numeric_limits<double>::infinity(), top = 0.0;
  std::string plot_cmd = "plot ";
  int index = 0;
  auto add_block = [&](const std::string& name, const std::string& rows, const std::string& style) {
    dat += "# " + name + "\n" + rows + "\n\n";
    plot_cmd += std::string(index == 0 ? "'memory.dat'" : ", \\\n     ''") + " index " +
                std::to_string(index) + " using 1:2 " + style + " title " + gnuplot_quote(name);
    ++index;
  };
  auto trial_rows = [&](const std::vector<TrialRecord>& group, bool out_of_memory) {
    std::string rows;
    for (const auto& t : group) {
      const double y = unit.of(*value(t, out_of_memory));
      rows += std::to_string(t.seqlen) + " " + exact(y) + " " + std::to_string(t.id) + "\n";
      lowest = std::min(lowest, y), top = std::max(top, y);
    }
    return rows;
  };
  for (const auto& [name, group] : groups) {
    add_block(name, trial_rows(group, false),
              name == "memory probes" ? "with points pt 6 ps 1.5" : "with linespoints lw 2 pt 7");
  }
  if (!oom.empty()) {
    add_block("out of memory", trial_rows(oom, true), "with points pt 2 ps 2 lw 2 lc rgb 'red'");
  }
  std::string limit_lines;
  for (int64_t limit : limits) {
    const std::string y = exact(unit.of(limit));
    top = std::max(top, unit.of(limit));
    limit_lines += "set arrow from graph 0, first " + y + " to graph 1, first " + y +
                   " nohead dt 2 lw 2 lc rgb 'red'\nset label " +
                   gnuplot_quote("limit " + unit.text(limit) + " per rank") +
                   " at graph 0.01, first " + y + " offset 0,0.7 tc rgb 'red'\n";
  }
  std::string subtitle = capped && cpu
                             ? "address space above each rank's start-up address space: what "
                               "memory.limit_gib caps on CPU (RLIMIT_AS)"
                             : memory_basis_caption(data.trials);
  if (!capped && !data.trials.empty()) {
    subtitle += "; the limit caps address space, not RSS: not drawn";
  }
  gp += begin_plot(plot.file, plot.title, 1000, 620, subtitle) + x_axis + "set ylabel " +
        gnuplot_quote(std::string(!capped ? "RSS per rank above start-up RSS"
                                  : cpu   ? "address space per rank above start-up"
                                          : "peak per rank above start-up baseline") +
                      " (" + unit.name + ")") +
        "\n" + y_from_zero(lowest, top) + "set key below\n" + limit_lines + plot_cmd + "\n";

  if (!capped) {
    plot.caption =
        "RSS per rank above its start-up RSS (see Memory above), in " + std::string(unit.name) +
        ". No limit is drawn: on CPU memory.limit_gib caps address space, not RSS, and some of "
        "these trials did not record their address space (an older ulysses-train), so an RSS "
        "above the limit does not mean a trial exceeded it. Crosses: trials that ran out of "
        "memory, at the RSS they measured.";
  } else {
    plot.caption =
        std::string("Peak memory per rank in the quantity memory.limit_gib caps (see Memory "
                    "above)") +
        (cpu ? ": on CPU the address space above the rank's start-up address space, not its "
               "RSS"
             : "") +
        "; points and the dashed per-rank limits in " + unit.name +
        ". Crosses: trials that ran out of memory, on the limit they exceeded (what they "
        "measured before the failing allocation can be lower), or at their measured peak when "
        "no limit was recorded.";
  }
}

void breakdown_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  std::vector<TrialRecord> trials;
  for (const auto& t : measured(data.trials)) {
    if (t.step_ms) trials.push_back(t);
  }
  if (trials.empty()) {
    plot.omitted = std::string("Not drawn: ") + kNoMeasured + ".";
    return;
  }
  dat = "# label compute_ms comm_ms offload_ms optimizer_ms other_ms trial_id\n";
  double highest = 0.0;  // the tallest stack
  for (const auto& t : trials) {
    const auto it = data.phases.find(t.id);
    const TimeBreakdown b =
        time_breakdown(t, it == data.phases.end() ? std::vector<TrialPhase>{} : it->second);
    highest = std::max(highest, b.compute_ms + b.comm_ms + b.offload_ms + b.optimizer_ms +
                                    b.other_ms);
    dat += "\"" + std::to_string(t.id) + ": " + mesh(t) + " sl=" + std::to_string(t.seqlen) +
           "\" " + exact(b.compute_ms) + " " + exact(b.comm_ms) + " " + exact(b.offload_ms) + " " +
           exact(b.optimizer_ms) + " " + exact(b.other_ms) + " " + std::to_string(t.id) + "\n";
  }
  const int rows = static_cast<int>(trials.size());
  const int width = std::clamp(220 + 45 * rows, 900, 4000);
  std::string xtic;
  const std::string x_axis = trial_axis(rows, width - 320, "trial", &xtic);  // the key: right
  gp += begin_plot(plot.file, plot.title, width, 620) + "set ylabel 'ms per step'\n" + x_axis +
        "set style data histograms\nset style histogram rowstacked\n"
        "set style fill solid 0.85 border -1\nset boxwidth 0.75\n" +
        y_from_zero(highest, highest) + "set key outside right top\n"
        "plot 'phases.dat' using 2:" + xtic + " title 'compute', '' using 3 title 'comm', "
        "'' using 4 title 'offload', '' using 5 title 'optimizer', '' using 6 title 'other'\n";
}

void pareto_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  std::vector<LengthThroughput> points;
  for (const auto& t : measured(data.trials)) {
    points.push_back({t.seqlen, *t.tokens_per_s_per_rank, t.id});
  }
  if (points.empty()) {
    plot.omitted = std::string("Not drawn: ") + kNoMeasured + ".";
    return;
  }
  std::vector<int64_t> lengths;
  double lowest = std::numeric_limits<double>::infinity(), highest = 0.0;
  dat = "# seqlen tokens_per_s_per_rank trial_id; block 0: measured trials, block 1: the front\n";
  for (const auto& p : points) {
    dat += std::to_string(p.seqlen) + " " + exact(p.tokens_per_s_per_rank) + " " +
           std::to_string(p.trial_id) + "\n";
    lengths.push_back(p.seqlen);
    lowest = std::min(lowest, p.tokens_per_s_per_rank);
    highest = std::max(highest, p.tokens_per_s_per_rank);
  }
  dat += "\n\n";
  for (const auto& p : pareto_front(points)) {
    dat += std::to_string(p.seqlen) + " " + exact(p.tokens_per_s_per_rank) + " " +
           std::to_string(p.trial_id) + "\n";
  }
  // No point labels: front points of nearby lengths and throughputs would overwrite each other.
  // The README lists the front's trials in a table under the plot.
  gp += begin_plot(plot.file, plot.title, 1000, 620) + length_axis(lengths) +
        "set ylabel 'tokens/s per rank'\n" + y_from_zero(lowest, highest) + "set key below\n"
        "plot 'pareto.dat' index 0 using 1:2 with points pt 6 ps 1.3 lc rgb 'gray50' "
        "title 'measured trials', \\\n"
        "     '' index 1 using 1:2 with linespoints lw 2 pt 7 ps 1.6 lc rgb 'red' "
        "title 'Pareto front (longer and faster is better; trials in the table below)'\n";
}

// Error of the cost model's predictions per ok trial (memory, both above the start-up baseline,
// and step time), with the +-10 % (memory) and +-20 % (time) bands the model is held to. Returns
// false when no ok trial has a prediction beside its measurement (then there is no plot).
bool prediction_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  dat = "# label memory_error_pct step_time_error_pct trial_id (? = none)\n";
  int rows = 0;
  double lowest = -25.0, highest = 25.0;  // the bands stay inside the frame, and every error
  for (const auto& t : data.trials) {
    if (t.status != "ok") continue;
    const std::optional<int64_t> peak = peak_above_baseline(t);
    const std::optional<int64_t> predicted_peak = above_baseline(t, t.predicted_peak_bytes);
    const bool mem = peak && predicted_peak && *peak > 0;
    const bool time = t.step_ms && t.predicted_step_ms && *t.step_ms > 0 && !t.probe;
    if (!mem && !time) continue;
    auto error = [&](double predicted, double measured) {
      const double pct = 100.0 * (predicted - measured) / measured;
      lowest = std::min(lowest, pct), highest = std::max(highest, pct);
      return exact(pct);
    };
    dat += "\"" + std::to_string(t.id) + ": " + mesh(t) + " sl=" + std::to_string(t.seqlen) +
           (t.probe ? " probe" : "") + "\" ";
    dat += mem ? error(static_cast<double>(*predicted_peak), static_cast<double>(*peak)) : "?";
    dat += " ";
    dat += time ? error(*t.predicted_step_ms, *t.step_ms) : "?";
    dat += " " + std::to_string(t.id) + "\n";
    ++rows;
  }
  if (rows == 0) return false;
  const int width = std::clamp(200 + 60 * rows, 900, 4000);
  std::string xtic;
  const std::string x_axis = trial_axis(rows, width - 150, "ok trial", &xtic);  // the key: below
  const double margin = 0.08 * (highest - lowest);  // no marker on the frame
  gp += begin_plot(plot.file, plot.title, width, 620) +
        "set datafile missing '?'\nset ylabel '(predicted - measured) / measured, %'\n" + x_axis +
        "set key below horizontal\nset grid ytics\n"
        "set xrange [-0.6:" + number(rows - 0.4) + "]\nset yrange [" +
        number(lowest - margin) + ":" + number(highest + margin) + "]\n"
        "set arrow from graph 0, first 10 to graph 1, first 10 nohead dt 2 lc rgb 'blue'\n"
        "set arrow from graph 0, first -10 to graph 1, first -10 nohead dt 2 lc rgb 'blue'\n"
        "set arrow from graph 0, first 20 to graph 1, first 20 nohead dt 2 lc rgb 'red'\n"
        "set arrow from graph 0, first -20 to graph 1, first -20 nohead dt 2 lc rgb 'red'\n"
        "plot 'prediction.dat' using 0:2:" + xtic + " with points pt 7 ps 1.5 lc rgb 'blue' "
        "title " + gnuplot_quote(peak_label(data.trials) + " (band +-10 %)") + ", \\\n"
        "     '' using 0:3 with points pt 5 ps 1.5 lc rgb 'red' "
        "title " +
        gnuplot_quote(std::string(data.time_calibrated ? "step time" : "step time, uncalibrated") +
                      " (band +-20 %)") +
        "\n";
  return true;
}

// Tokens/s per rank of each configuration and length on both backends, side by side (one pair
// of bars per row of the report's "Ours vs DeepSpeed" table; a backend that has no measurement
// there has no bar). Returns false when the sweep holds one backend only.
bool backends_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  const std::vector<BackendPair> pairs = backend_pairs(data.trials);
  if (pairs.empty()) return false;
  dat = "# row native_tokens_per_s_per_rank deepspeed_tokens_per_s_per_rank (NaN = none)\n";
  double highest = 0.0;
  int rows = 0, native_bars = 0, deepspeed_bars = 0;
  auto value = [&](const TrialRecord* t, int& bars) {
    if (!t || !is_measured(*t)) return std::string("NaN");
    highest = std::max(highest, *t->tokens_per_s_per_rank);
    ++bars;
    return exact(t->tokens_per_s_per_rank);
  };
  for (const BackendPair& p : pairs) {  // labelled by the row of the report's table
    ++rows;
    dat += std::to_string(rows) + " " + value(p.native, native_bars) + " " +
           value(p.deepspeed, deepspeed_bars) + "\n";
  }
  // gnuplot refuses a histogram column without a single value.
  if (native_bars == 0 || deepspeed_bars == 0) {
    plot.omitted = native_bars + deepspeed_bars == 0
                       ? "Not drawn: neither backend measured a configuration the other ran."
                       : std::string("Not drawn: only the ") +
                             (native_bars ? "native" : "deepspeed") +
                             " backend measured a configuration (see the table above).";
    return true;
  }
  const int width = std::clamp(260 + 70 * rows, 900, 4000);
  gp += begin_plot(plot.file, plot.title, width, 560) + "set ylabel 'tokens/s per rank'\n" +
        "set xlabel 'row of the table above (a configuration at a length)'\n"
        "set style data histograms\nset style histogram clustered gap 1\n"
        "set style fill solid 0.85 border -1\n" + y_from_zero(highest, highest) +
        "set key below horizontal\n"
        "plot 'backends.dat' using 2:xtic(1) title 'native (ulysses-train)' lc rgb '#1f77b4', "
        "'' using 3 title 'deepspeed (transformers + DeepSpeed)' lc rgb '#ff7f0e'\n";
  return true;
}

// Seconds since the epoch of a UTC time "YYYY-MM-DDTHH:MM:SSZ" (sweep_host.h utc_now), or
// nullopt when `text` is not one.
std::optional<double> utc_seconds(const std::string& text) {
  std::tm tm{};
  char zone = 0;
  if (std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &zone) != 7 ||
      zone != 'Z') {
    return std::nullopt;
  }
  tm.tm_year -= 1900, tm.tm_mon -= 1;
  return static_cast<double>(timegm(&tm));
}

// The slots of a sweep that ran trials side by side, over time: one row per slot, one bar per
// trial that ran (from its start for its wall time), coloured by status; re-measures alone
// hatched. Returns false when no trial names a slot (the sweep ran one trial at a time).
bool timeline_plot(const SweepData& data, Plot& plot, std::string& dat, std::string& gp) {
  struct Bar {
    const TrialRecord* trial;
    double start, end;
  };
  std::vector<std::string> slots;  // in the order of their first trial's start
  std::vector<Bar> bars;
  for (const auto& t : data.trials) {
    if (t.slot.empty()) continue;
    const std::optional<double> start = utc_seconds(t.started_at);
    if (!start) continue;
    const std::optional<double> end =
        t.wall_s ? std::optional<double>(*start + *t.wall_s) : utc_seconds(t.finished_at);
    if (!end) continue;  // still running
    bars.push_back({&t, *start, std::max(*end, *start)});
  }
  if (bars.empty()) {
    if (std::none_of(data.trials.begin(), data.trials.end(),
                     [](auto& t) { return !t.slot.empty(); })) {
      return false;
    }
    plot.omitted = "Not drawn: no trial that ran on a slot recorded its start and wall time.";
    return true;
  }
  std::stable_sort(bars.begin(), bars.end(), [](auto& a, auto& b) { return a.start < b.start; });
  for (const Bar& b : bars) {
    if (std::find(slots.begin(), slots.end(), b.trial->slot) == slots.end()) {
      slots.push_back(b.trial->slot);
    }
  }
  const double origin = bars.front().start;
  double last = 0.0;
  for (const Bar& b : bars) last = std::max(last, b.end - origin);
  const double span = std::max(last, 1.0);
  // One data block per legend entry: the statuses in kTrialStatuses order, then re-measures.
  std::vector<std::pair<std::string, std::string>> blocks;  // (title, rows)
  auto block = [&](const std::string& title) -> std::string& {
    auto it = std::find_if(blocks.begin(), blocks.end(), [&](auto& b) { return b.first == title; });
    return it != blocks.end() ? it->second : blocks.emplace_back(title, "").second;
  };
  for (const char* status : store::kTrialStatuses) block(status);
  block("ok, re-measured alone");
  std::string labels;
  int neighboured = 0, measured_trials = 0;
  std::set<int64_t> with_neighbours;
  for (const auto& [trial, neighbours] : data.neighbours) {
    if (!neighbours.empty()) with_neighbours.insert(trial);
  }
  for (const Bar& b : bars) {
    const TrialRecord& t = *b.trial;
    const auto row = std::find(slots.begin(), slots.end(), t.slot) - slots.begin();
    const std::string title =
        t.remeasure_of && t.status == "ok" ? "ok, re-measured alone" : t.status;
    block(title) += std::to_string(row) + " " + exact(b.start - origin) + " " +
                    exact(b.end - origin) + " " + std::to_string(t.id) + "\n";
    if (b.end - b.start >= span / 25) {
      labels += exact((b.start + b.end) / 2 - origin) + " " + std::to_string(row) + " " +
                std::to_string(t.id) + "\n";
    }
    if (is_measured(t)) {
      ++measured_trials;
      if (with_neighbours.count(t.id)) ++neighboured;
    }
  }
  std::erase_if(blocks, [](auto& b) { return b.second.empty(); });
  dat = "# slot_row start_s end_s trial_id (seconds since the first trial's start); one block per "
        "status\n";
  std::string plot_cmd = "plot ";
  const std::map<std::string, std::string> colours = {
      {"ok", "#2ca02c"},      {"ok, re-measured alone", "#2ca02c"},
      {"oom", "#d62728"},     {"failed", "#ff7f0e"},
      {"timeout", "#9467bd"}, {"killed", "#8c564b"},
      {"running", "#1f77b4"}};
  for (size_t i = 0; i < blocks.size(); ++i) {
    dat += "# " + blocks[i].first + "\n" + blocks[i].second + "\n\n";
    const auto colour = colours.find(blocks[i].first);
    const bool hatched = blocks[i].first == "ok, re-measured alone";
    const std::string rgb =
        "rgb '" + (colour != colours.end() ? colour->second : std::string("gray50")) + "'";
    plot_cmd += std::string(i == 0 ? "'timeline.dat'" : ", \\\n     ''") + " index " +
                std::to_string(i) +
                " using (($2 + $3) / 2):1:2:3:($1 - 0.35):($1 + 0.35) with boxxyerror fc " + rgb +
                (hatched ? " fs pattern 4 border lc " + rgb
                         : std::string(" fs solid 0.8 border lc rgb 'gray20'")) +
                " title " + gnuplot_quote(blocks[i].first);
  }
  if (!labels.empty()) {
    dat += "# labels: x row trial_id\n" + labels + "\n\n";
    plot_cmd += ", \\\n     '' index " + std::to_string(blocks.size()) +
                " using 1:2:3 with labels notitle";
  }
  std::string ytics = "set ytics (";
  for (size_t i = 0; i < slots.size(); ++i) {
    ytics += (i ? ", " : "") + gnuplot_quote(slots[i]) + " " + std::to_string(i);
  }
  ytics += ")\n";
  const int height = std::clamp(220 + 60 * static_cast<int>(slots.size()), 420, 1600);
  gp += begin_plot(plot.file, plot.title, 1100, height) + "set xlabel 'seconds since the first " +
        "trial started'\nset xrange [" + number(-0.04 * span) + ":" + number(1.04 * span) +
        "]\nset yrange [-0.7:" + number(static_cast<double>(slots.size()) - 0.3) +
        "]\n" + ytics + "set grid noytics xtics\nset key outside right top vertical\n" + plot_cmd + "\n";
  plot.caption = "Each trial that ran, as a bar on the slot it ran on, from its start for its wall "
                 "time (labelled with its id where the bar is wide enough); hatched: a "
                 "configuration measured again with no other trial running. " +
                 std::to_string(neighboured) + " of " + std::to_string(measured_trials) +
                 " measured trials ran beside another trial.";
  return true;
}

}  // namespace

std::string gnuplot_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\n' || c == '\r') c = ' ';
    out += c == '\'' ? std::string("''") : std::string(1, c);
  }
  return out + "'";
}

PlotFiles make_plot_files(const SweepData& data) {
  PlotFiles out;
  out.plots = {{"throughput_vs_seqlen.png", "Throughput vs sequence length", "", ""},
               {"memory_vs_seqlen.png", "Peak memory vs sequence length", "", ""},
               {"time_breakdown.png", "Where a step's time goes", "", ""},
               {"pareto_front.png", "Pareto front: sequence length vs throughput", "", ""}};
  std::string gp = "# Plots of sweep " + data.sweep.name +
                   " (written by ulysses-tune report). To redraw: gnuplot plots.gp, run in this "
                   "directory.\npng_terminal = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? "
                   "'pngcairo' : 'png'\n";
  const char* dat_names[] = {"throughput.dat", "memory.dat", "phases.dat", "pareto.dat"};
  void (*builders[])(const SweepData&, Plot&, std::string&, std::string&) = {
      throughput_plot, memory_plot, breakdown_plot, pareto_plot};
  for (size_t i = 0; i < out.plots.size(); ++i) {
    std::string dat;
    builders[i](data, out.plots[i], dat, gp);
    if (!dat.empty()) out.files.emplace_back(dat_names[i], dat);
  }
  Plot prediction{"prediction_error.png", "Cost model: predicted vs measured, error per trial",
                  "", ""};
  std::string dat;
  if (prediction_plot(data, prediction, dat, gp)) {
    out.plots.push_back(prediction);
    out.files.emplace_back("prediction.dat", dat);
  }
  Plot timeline{"timeline.png", "Trials over time on the sweep's slots", "", ""};
  dat.clear();
  if (timeline_plot(data, timeline, dat, gp)) {
    out.plots.push_back(timeline);
    if (!dat.empty()) out.files.emplace_back("timeline.dat", dat);
  }
  Plot backends{"backends.png", "Ours vs DeepSpeed: tokens/s per rank", "", ""};
  dat.clear();
  if (backends_plot(data, backends, dat, gp)) {
    out.plots.push_back(backends);
    if (!dat.empty()) out.files.emplace_back("backends.dat", dat);
  }
  gp += "\nset output\n";
  out.files.emplace_back("plots.gp", gp);
  return out;
}

}  // namespace ulysses::report
