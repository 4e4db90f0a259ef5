// Calibration of the cost model's free coefficients from measurements: ordinary least
// squares y ~ X b over a handful of columns, solved by the normal equations (Gauss-Jordan with
// partial pivoting). Used to refine memory and time coefficients from a sweep's own trials.
#pragma once
#include <cstddef>
#include <vector>

namespace ulysses::costmodel {

struct LinearFit {
  std::vector<double> coefficients;  // b, one per column of X
  double rms_relative_error = 0.0;   // sqrt(mean(((X b - y) / y)^2)) over the rows
  int rows = 0;
};

// Least-squares b minimising sum_i w_i (x_i . b - y_i)^2 with w_i = 1 / y_i^2 (relative error,
// so that small and large measurements count alike). Rows are x_i (all of one width k >= 1).
// Throws UserError("fit: ...") when there are fewer rows than columns, widths differ, a y_i <= 0,
// or the columns are linearly dependent on these rows (singular).
// With `offset` (one per row, or empty = none), a known part of each measurement:
// x_i . b + offset_i ~ y_i, the error still relative to y_i.
LinearFit fit_relative_least_squares(const std::vector<std::vector<double>>& x,
                                     const std::vector<double>& y,
                                     const std::vector<double>& offset = {});

// The columns of x, left to right, that are not linear combinations of the columns kept before
// them on these rows (a column of zeros is never kept): a fit over them has a unique solution.
// Rows are all of one width; no rows keep no columns.
std::vector<size_t> independent_columns(const std::vector<std::vector<double>>& x);

}  // namespace ulysses::costmodel
