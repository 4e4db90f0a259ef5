// The report's README.md: the sweep, the basis of its memory figures
// (memory_basis.h), its environment and search summary (with the objective's best trial), the
// fastest and longest trial per mesh, the plots (or why each is missing) with the Pareto front's
// trials, and a table of every trial.
#pragma once
#include <string>
#include <vector>

#include "tuner/report/plot_script.h"
#include "tuner/results/sweep_source.h"

namespace ulysses::report {

// The whole README. `command` is the command line that made the report (shown in it); `plots`
// as write_plots() returned them (PNG names relative to the README).
std::string render_readme(const SweepData& data, const std::vector<Plot>& plots,
                          const std::string& command);

}  // namespace ulysses::report
