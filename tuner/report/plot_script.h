// The report's plots as gnuplot input: data files plus one script,
// plots.gp, that draws them as PNGs when run by gnuplot in the report directory. Pure: builds
// text, writes nothing (plots.h writes the files and runs gnuplot).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tuner/results/sweep_source.h"

namespace ulysses::report {

// One plot of the report.
struct Plot {
  std::string file;     // the PNG's name inside the report directory
  std::string title;    // a heading for the README
  std::string omitted;  // "" when drawn; else a sentence saying why it is not
  std::string caption;  // what the drawn plot shows, for the README; "" = the README's own
};

struct PlotFiles {
  // In this order: throughput_vs_seqlen.png (tokens/s per rank vs length, one line per
  // configuration, measured trials), memory_vs_seqlen.png (peak per rank vs length in the
  // quantity memory.limit_gib caps, memory_basis.h capped_peak, with the per-rank limits as
  // dashed lines, OOM trials as crosses on the limit they exceeded or, unknown, at their peak; or,
  // when an ok CPU trial did not record that quantity, its RSS above the baseline and no limit
  // line; points and limits in one unit, MiB or GiB by the largest value drawn, with a caption
  // saying which), time_breakdown.png (stacked compute /
  // comm / offload / optimizer / other ms per measured trial), pareto_front.png (length vs
  // throughput of measured trials, the front highlighted, no point labels: the README lists the
  // front); then, when ok trials have the cost model's predictions, prediction_error.png (the
  // error of the predicted peak and step time of each, with the +-10 % and +-20 % bands).
  // Every axis range is set from the data with a margin: no point or bar lies on the frame.
  std::vector<Plot> plots;
  // (file name, content): plots.gp and the .dat files it reads. plots.gp draws exactly the plots
  // whose `omitted` is "", choosing pngcairo when gnuplot has it and png otherwise.
  std::vector<std::pair<std::string, std::string>> files;
};

PlotFiles make_plot_files(const SweepData& data);

// `text` as a gnuplot single-quoted string: 'it''s'.
std::string gnuplot_quote(const std::string& text);

}  // namespace ulysses::report
