// Points of a search space and their memory order (see space.h).
#include "tuner/search/space.h"

#include <nlohmann/json.hpp>

namespace ulysses::search {

std::vector<Point> all_points(const Space& space) {
  std::vector<Point> points = {Point{}};
  for (const Axis& axis : space.axes) {
    std::vector<Point> next;
    for (const Point& p : points) {
      for (int v = 0; v < static_cast<int>(axis.values.size()); ++v) {
        Point q = p;
        q.push_back(v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  return points;
}

bool saves_at_least(const Space& space, const Point& a, const Point& b) {
  for (size_t i = 0; i < space.axes.size(); ++i) {
    if (a[i] == b[i]) continue;
    const std::vector<int>& saving = space.axes[i].saving;
    if (saving.empty() || saving[a[i]] <= saving[b[i]]) return false;
  }
  return true;
}

bool cannot_be_faster(const Space& space, const Point& a, const Point& b) {
  for (size_t i = 0; i < space.axes.size(); ++i) {
    if (a[i] != b[i] && !space.axes[i].saving_costs_time) return false;
  }
  return saves_at_least(space, a, b);
}

int saving_score(const Space& space, const Point& p) {
  int score = 0;
  for (size_t i = 0; i < space.axes.size(); ++i) {
    if (!space.axes[i].saving.empty()) score += space.axes[i].saving[p[i]];
  }
  return score;
}

std::string describe(const Space& space, const Point& p) {
  std::string out;
  for (size_t i = 0; i < space.axes.size(); ++i) {
    if (!out.empty()) out += ' ';
    out += space.axes[i].key + "=" + space.axes[i].values[p[i]];
  }
  return out;
}

std::string point_json(const Space& space, const Point& p) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t i = 0; i < space.axes.size(); ++i) j[space.axes[i].key] = space.axes[i].values[p[i]];
  return j.dump();
}

}  // namespace ulysses::search
