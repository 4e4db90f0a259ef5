// The search space as data: named axes with string values, an optional memory order
// per axis, and the sequence lengths to try. The engine (engine.h) is generic over it and knows
// nothing of Ulysses; tuner/experiment/ builds a Space from an experiment file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ulysses::search {

// One axis. `saving`, when not empty, orders the values by memory: value i saves at least as
// much memory as value j iff i == j or saving[i] > saving[j] (so equal ranks with different
// values are incomparable, e.g. 4 tiles vs auto tiles). Empty: values are incomparable.
// `saving_costs_time`: a value that saves more memory is never faster (tiling the MLP,
// checkpointing, offloads, a smaller micro-batch). False where saving memory can also save
// time (a higher ZeRO stage reduces fewer bytes and steps a smaller optimizer shard): the memory
// order then still serves the fit / out-of-memory implications, but not dominance.
// Invariants: values non-empty and distinct; saving empty or saving.size() == values.size().
struct Axis {
  std::string key;
  std::vector<std::string> values;
  std::vector<int> saving;
  bool saving_costs_time = true;
};

struct Space {
  std::vector<Axis> axes;
  std::vector<int64_t> lengths;  // ascending, distinct
  bool search_max = false;       // find the longest fitting length instead of trying each
  // Max-length search: each point whose longest fitting length was found is also measured at
  // this many shorter lengths (spread evenly below it), for throughput against length.
  int curve = 0;
};

// A point: one value index per axis.
using Point = std::vector<int>;

// Every point of the Cartesian product, the last axis varying fastest.
std::vector<Point> all_points(const Space& space);

// True when `a` saves at least as much memory as `b` on every axis (a >= b in the product
// order): then peak memory(a) <= peak memory(b) at the same length. REQUIRES: same space.
bool saves_at_least(const Space& space, const Point& a, const Point& b);

// True when `a` cannot be faster than `b`: saves_at_least(a, b), and a == b on every axis whose
// savings need not cost time (Axis::saving_costs_time false). REQUIRES: same space.
bool cannot_be_faster(const Space& space, const Point& a, const Point& b);

// Sum of the saving ranks (0 for unordered axes): a linear extension of saves_at_least, used to
// order candidates (most saving first, or least).
int saving_score(const Space& space, const Point& p);

// "mesh.sp=2 memory.tiled_mlp=auto" (axes in space order).
std::string describe(const Space& space, const Point& p);

// {"mesh.sp": "2", ...} as a JSON object text, values as strings.
std::string point_json(const Space& space, const Point& p);

}  // namespace ulysses::search
