// Draws the report's plots: writes plots.gp and its data files (plot_script.h) into a directory
// and runs gnuplot there, so the PNGs sit beside the script that made them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tuner/report/plot_script.h"

namespace ulysses::report {

// The gnuplot to run: `requested` when not "" (UserError "--gnuplot X: not an executable file"
// when it is not one), else $GNUPLOT when set, else `gnuplot` on PATH; nullopt when none.
std::optional<std::string> find_gnuplot(const std::string& requested);

// Writes the plot files of `data` into `dir` (which must exist) and, when gnuplot is given,
// runs `gnuplot plots.gp` in `dir` (its output goes to a log that is removed on success).
// Returns the plots; without gnuplot every plot that would be drawn is marked omitted with a
// sentence saying how to draw it. Throws std::runtime_error naming gnuplot and its last error
// line when it fails or leaves a PNG undrawn; UserError when a file cannot be written.
std::vector<Plot> write_plots(const SweepData& data, const std::string& dir,
                              const std::optional<std::string>& gnuplot);

}  // namespace ulysses::report
