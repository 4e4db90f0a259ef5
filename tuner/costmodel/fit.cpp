// Weighted least squares by the normal equations (see fit.h).
#include "tuner/costmodel/fit.h"

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

#include "common/error.h"

namespace ulysses::costmodel {

LinearFit fit_relative_least_squares(const std::vector<std::vector<double>>& x,
                                     const std::vector<double>& y,
                                     const std::vector<double>& offset) {
  if (x.empty() || x.size() != y.size()) throw UserError("fit: need one y per row of x");
  if (!offset.empty() && offset.size() != y.size()) throw UserError("fit: need one offset per row");
  auto known = [&](size_t i) { return offset.empty() ? 0.0 : offset[i]; };
  const size_t k = x.front().size();
  if (k == 0 || x.size() < k) {
    throw UserError("fit: " + std::to_string(x.size()) + " rows for " + std::to_string(k) +
                    " coefficients");
  }
  // A = X^T W X (k x k), r = X^T W y, augmented into [A | r].
  std::vector<std::vector<double>> a(k);
  for (std::vector<double>& row : a) row.assign(k + 1, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].size() != k) throw UserError("fit: row " + std::to_string(i) + " has another width");
    if (!(y[i] > 0)) throw UserError("fit: measurement " + std::to_string(i) + " is not > 0");
    const double w = 1.0 / (y[i] * y[i]);
    for (size_t r = 0; r < k; ++r) {
      for (size_t c = 0; c < k; ++c) a[r][c] += w * x[i][r] * x[i][c];
      a[r][k] += w * x[i][r] * (y[i] - known(i));
    }
  }
  for (size_t col = 0; col < k; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < k; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    double scale = 0;
    for (size_t r = 0; r < k; ++r) scale = std::fmax(scale, std::fabs(a[r][col]));
    if (std::fabs(a[pivot][col]) <= 1e-12 * scale || scale == 0) {
      throw UserError("fit: the columns are linearly dependent on these measurements");
    }
    std::swap(a[col], a[pivot]);
    for (size_t r = 0; r < k; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (size_t c = col; c <= k; ++c) a[r][c] -= f * a[col][c];
    }
  }
  LinearFit fit;
  fit.rows = static_cast<int>(x.size());
  for (size_t r = 0; r < k; ++r) fit.coefficients.push_back(a[r][k] / a[r][r]);
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double pred = known(i);
    for (size_t c = 0; c < k; ++c) pred += x[i][c] * fit.coefficients[c];
    sum += std::pow((pred - y[i]) / y[i], 2);
  }
  fit.rms_relative_error = std::sqrt(sum / static_cast<double>(x.size()));
  return fit;
}

std::vector<size_t> independent_columns(const std::vector<std::vector<double>>& x) {
  std::vector<size_t> kept;
  if (x.empty()) return kept;
  // Modified Gram-Schmidt over the columns: what is left of a column after removing its
  // projections on the kept ones is (numerically) nothing when it depends on them.
  std::vector<std::vector<double>> basis;
  for (size_t c = 0; c < x.front().size(); ++c) {
    std::vector<double> v;
    double norm = 0;
    for (const auto& row : x) {
      v.push_back(row.at(c));
      norm += row.at(c) * row.at(c);
    }
    norm = std::sqrt(norm);
    if (norm == 0) continue;
    for (const auto& q : basis) {
      double dot = 0;
      for (size_t i = 0; i < v.size(); ++i) dot += q[i] * v[i];
      for (size_t i = 0; i < v.size(); ++i) v[i] -= dot * q[i];
    }
    double rest = 0;
    for (double e : v) rest += e * e;
    rest = std::sqrt(rest);
    if (rest <= 1e-9 * norm) continue;
    for (double& e : v) e /= rest;
    basis.push_back(std::move(v));
    kept.push_back(c);
  }
  return kept;
}

}  // namespace ulysses::costmodel
