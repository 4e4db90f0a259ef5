// The generic search engine (tuner/search/) against synthetic memory and speed functions: grid,
// max-length bisection with probes and implications, pruning, dominance (and the axes it does not
// apply to), failed runs that bound nothing, invalid points, budget. Each smart search must reach
// the grid's answer with fewer runs.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "tuner/search/engine.h"
#include "tuner/search/knowledge.h"

namespace ulysses::search {
namespace {

// tiles {1, 4, auto}: 1 saves nothing; 4 and auto save (incomparable); offload {none, act, both}.
// sp {1, 2}: unordered. Lengths 1K..16K step 1K.
Space test_space() {
  Space s;
  s.axes.push_back({"mesh.sp", {"1", "2"}, {}});
  s.axes.push_back({"memory.tiled_mlp", {"1", "4", "auto"}, {0, 1, 1}});
  s.axes.push_back({"memory.offload", {"none", "activations", "both"}, {0, 1, 2}});
  for (int64_t l = 1024; l <= 16384; l += 1024) s.lengths.push_back(l);
  return s;
}

// Memory per rank in MiB: monotone in the savings and in the length. Speed (tokens/s): savings
// cost time. sp=2 halves activations but costs 10% speed.
struct Synthetic : Host {
  const Space& space;
  double limit_mib = 10000;
  double probe_factor = 0.9;  // probes need 90% of the real memory
  std::set<Point> invalid;
  std::optional<double> prune_above_mib;  // the "memory model" prunes above this
  int64_t max_runs = 0;
  int64_t next_id = 1;
  std::vector<std::tuple<Point, int64_t, bool>> runs;
  std::map<std::string, int64_t> records;  // status -> count
  std::vector<std::pair<Point, int64_t>> skipped;  // (point, length; 0 = all lengths)
  std::map<std::pair<Point, int64_t>, std::pair<bool, double>> real_results;  // (fits, speed)

  explicit Synthetic(const Space& s) : space(s) {}

  double memory_mib(const Point& p, int64_t length) const {
    const double sp = p[0] == 0 ? 1 : 2;
    const double tiles = p[1] == 0 ? 1.0 : (p[1] == 1 ? 0.6 : 0.55);
    const double offload = p[2] == 0 ? 1.0 : (p[2] == 1 ? 0.5 : 0.45);
    return 1000 + length / sp * tiles * offload;
  }
  double speed(const Point& p) const {
    return 1000.0 * (p[0] == 0 ? 1.0 : 0.9) * (p[1] == 0 ? 1.0 : 0.95) *
           (p[2] == 0 ? 1.0 : (p[2] == 1 ? 0.8 : 0.7));
  }
  std::optional<std::string> invalid_reason(const Point& p) override {
    if (invalid.count(p)) return std::string("mesh.sp: does not fit the heads");
    return std::nullopt;
  }
  std::optional<std::string> prune_reason(const Point& p, int64_t length) override {
    if (prune_above_mib && memory_mib(p, length) > *prune_above_mib) return std::string("model");
    return std::nullopt;
  }
  RunOutcome run(const Point& p, int64_t length, bool probe) override {
    runs.emplace_back(p, length, probe);
    const double need = memory_mib(p, length) * (probe ? probe_factor : 1.0);
    RunOutcome out;
    out.trial_id = next_id++;
    out.result = need <= limit_mib ? Result::kFits : Result::kOom;
    out.value = out.result == Result::kFits ? speed(p) : 0.0;
    if (!probe) real_results[{p, length}] = {out.result == Result::kFits, out.value};
    return out;
  }
  void record(const Point& p, int64_t length, const std::string& status,
              const std::string&) override {
    ++records[status];
    if (status == "skipped") skipped.emplace_back(p, length);
  }
  bool budget_left() override { return max_runs == 0 || static_cast<int64_t>(runs.size()) < max_runs; }

  // The best (length, speed) measured by real runs: max-seqlen order.
  std::pair<int64_t, double> best_max_length() const {
    std::pair<int64_t, double> best{0, 0};
    for (const auto& [key, r] : real_results) {
      if (!r.first) continue;
      if (key.second > best.first || (key.second == best.first && r.second > best.second)) {
        best = {key.second, r.second};
      }
    }
    return best;
  }
  double best_speed_at(int64_t length) const {
    double best = 0;
    for (const auto& [key, r] : real_results) {
      if (r.first && key.second == length) best = std::max(best, r.second);
    }
    return best;
  }
  // Ground truth: the longest fitting length of p on the lattice (0 = none).
  int64_t true_max(const Point& p) const {
    int64_t best = 0;
    for (int64_t l : space.lengths) {
      if (memory_mib(p, l) <= limit_mib) best = l;
    }
    return best;
  }
};

TEST(SearchSpace, PartialOrderOfSavings) {
  const Space s = test_space();
  EXPECT_EQ(all_points(s).size(), 18u);
  EXPECT_TRUE(saves_at_least(s, {0, 1, 2}, {0, 0, 0}));
  EXPECT_TRUE(saves_at_least(s, {0, 1, 1}, {0, 1, 1}));
  EXPECT_FALSE(saves_at_least(s, {0, 1, 0}, {0, 2, 0}));  // 4 tiles vs auto: incomparable
  EXPECT_FALSE(saves_at_least(s, {1, 1, 2}, {0, 0, 0}));  // different sp: incomparable
  EXPECT_FALSE(saves_at_least(s, {0, 0, 0}, {0, 1, 0}));
  EXPECT_EQ(saving_score(s, {1, 2, 2}), 3);
  EXPECT_EQ(describe(s, {1, 2, 0}), "mesh.sp=2 memory.tiled_mlp=auto memory.offload=none");
  EXPECT_EQ(point_json(s, {1, 2, 0}),
            R"({"mesh.sp":"2","memory.tiled_mlp":"auto","memory.offload":"none"})");
}

TEST(SearchKnowledge, ImplicationsFollowTheOrderAndTheLength) {
  const Space s = test_space();
  Knowledge k(s);
  k.add({0, 0, 0}, 5, /*fits=*/true, /*probe=*/false, 7);
  k.add({0, 1, 1}, 9, /*fits=*/false, /*probe=*/false, 8);
  k.add({1, 0, 0}, 3, /*fits=*/false, /*probe=*/true, 9);
  EXPECT_EQ(k.implied_fit({0, 1, 2}, 4, false), 7);   // saves more, shorter
  EXPECT_FALSE(k.implied_fit({0, 1, 2}, 6, false));   // longer: unknown
  EXPECT_FALSE(k.implied_fit({1, 1, 2}, 4, false));   // other mesh
  EXPECT_EQ(k.implied_oom({0, 0, 1}, 9, false), 8);   // saves less, same length
  EXPECT_FALSE(k.implied_oom({0, 1, 2}, 12, false));  // saves more: unknown
  EXPECT_EQ(k.implied_oom({1, 0, 0}, 3, false), 9);   // a probe OOM is a real OOM
  EXPECT_FALSE(k.implied_oom({0, 0, 1}, 9, true));    // a real OOM says nothing of a probe
  EXPECT_EQ(k.implied_fit({0, 0, 0}, 5, true), 7);    // a real fit is a probe fit
  EXPECT_EQ(k.dominating_fit({0, 1, 0}, 5), 7);
  EXPECT_FALSE(k.dominating_fit({0, 0, 0}, 5));       // not by itself
}

TEST(SearchEngine, GridRunsEveryValidPointAtEveryLength) {
  const Space s = test_space();
  Synthetic host(s);
  host.invalid = {{1, 0, 0}, {1, 1, 0}};
  Options o;
  o.method = "grid";
  const Summary sum = run_search(s, o, host);
  EXPECT_EQ(sum.invalid, 2);
  EXPECT_EQ(sum.grid_runs, 16 * 16);
  EXPECT_EQ(sum.runs, 16 * 16);
  EXPECT_EQ(host.records["invalid"], 2);
  for (const auto& [p, length, probe] : host.runs) EXPECT_FALSE(host.invalid.count(p));
}

class MaxLengthSearch : public ::testing::TestWithParam<bool> {};  // probe on/off

TEST_P(MaxLengthSearch, FindsTheGridsLongestLengthWithAThirdOfItsRuns) {
  const Space s0 = test_space();
  Space s = s0;
  s.search_max = true;
  Synthetic grid_host(s);
  grid_host.limit_mib = 4000;
  Options grid;
  grid.method = "grid";
  const Summary grid_sum = run_search(s, grid, grid_host);

  Synthetic host(s);
  host.limit_mib = 4000;
  Options smart;
  smart.probe = GetParam();
  const Summary sum = run_search(s, smart, host);
  EXPECT_EQ(host.best_max_length(), grid_host.best_max_length());
  EXPECT_GT(host.best_max_length().first, 0);
  EXPECT_LE(3 * (sum.runs + sum.probes), grid_sum.runs) << sum.runs << " + " << sum.probes;
  EXPECT_GT(sum.skipped, 0);
  // The most-saving point of each mesh had its exact boundary measured by a real run.
  for (const Point& top : {Point{0, 2, 2}, Point{1, 2, 2}}) {
    const int64_t truth = host.true_max(top);
    ASSERT_GT(truth, 0);
    const auto measured = host.real_results.find({top, truth});
    EXPECT_TRUE(measured != host.real_results.end() && measured->second.first)
        << describe(s, top) << " at " << truth;
  }
}

INSTANTIATE_TEST_SUITE_P(Probe, MaxLengthSearch, ::testing::Bool());

// curve: every point whose longest fit a real run settled is also measured, by real runs, at
// `curve` shorter lengths round(lo * k / (curve + 1)) (lo the index of its longest fit), each
// once; points the search skipped get none.
TEST(SearchEngine, CurveMeasuresEachSettledPointAtShorterLengthsOnce) {
  Space s = test_space();
  s.search_max = true;
  s.curve = 3;
  Synthetic host(s);
  host.limit_mib = 4000;
  Options o;
  run_search(s, o, host);
  std::map<std::pair<Point, int64_t>, int> real_runs;
  for (const auto& [p, length, probe] : host.runs) {
    if (!probe) ++real_runs[{p, length}];
  }
  for (const auto& [key, count] : real_runs) EXPECT_EQ(count, 1) << describe(s, key.first);
  int settled = 0;
  for (const Point& p : all_points(s)) {
    const int64_t truth = host.true_max(p);
    const auto at_max = host.real_results.find({p, truth});
    if (truth == 0 || at_max == host.real_results.end()) continue;  // skipped: no curve
    ++settled;
    const int lo = static_cast<int>((truth - 1024) / 1024);
    for (int k = 1; k <= 3; ++k) {
      const int i = static_cast<int>(std::lround(lo * k / 4.0));
      if (i == lo) continue;
      const auto r = host.real_results.find({p, s.lengths[i]});
      ASSERT_TRUE(r != host.real_results.end()) << describe(s, p) << " at " << s.lengths[i];
      EXPECT_TRUE(r->second.first);
    }
  }
  EXPECT_GE(settled, 2);

  Space flat = s;  // curve 0 (the default): no run below a settled point's boundary bisection
  flat.curve = 0;
  Synthetic without(flat);
  without.limit_mib = 4000;
  run_search(flat, o, without);
  EXPECT_LT(without.runs.size(), host.runs.size());
}

TEST(SearchEngine, ProbeOutOfMemoryIsNeverConfirmedByARealRun) {
  Space s = test_space();
  s.search_max = true;
  Synthetic host(s);
  host.limit_mib = 4000;
  Options o;
  run_search(s, o, host);
  std::set<std::pair<Point, int64_t>> probe_oom;
  for (const auto& [p, length, probe] : host.runs) {
    if (probe && host.memory_mib(p, length) * host.probe_factor > host.limit_mib) {
      probe_oom.insert({p, length});
    }
  }
  EXPECT_FALSE(probe_oom.empty());
  for (const auto& [p, length, probe] : host.runs) {
    if (!probe) {
      EXPECT_FALSE(probe_oom.count({p, length})) << describe(s, p) << " " << length;
    }
  }
}

TEST(SearchEngine, PrunedPairsAreRecordedAndNeverRun) {
  Space s = test_space();
  s.search_max = true;
  Synthetic host(s);
  host.limit_mib = 4000;
  host.prune_above_mib = 4500;  // above the limit: prunes only what cannot fit
  Options o;
  const Summary sum = run_search(s, o, host);
  EXPECT_GT(sum.pruned, 0);
  EXPECT_EQ(host.records["pruned"], sum.pruned);
  for (const auto& [p, length, probe] : host.runs) EXPECT_LE(host.memory_mib(p, length), 4500);
  Synthetic plain(s);
  plain.limit_mib = 4000;
  run_search(s, o, plain);
  EXPECT_EQ(host.best_max_length(), plain.best_max_length());
}

TEST(SearchEngine, ThroughputSkipsDominatedPointsAndMatchesTheGrid) {
  Space s = test_space();
  s.lengths = {4096, 8192};
  Synthetic grid_host(s), host(s);
  grid_host.limit_mib = host.limit_mib = 5000;
  Options grid;
  grid.method = "grid";
  const Summary grid_sum = run_search(s, grid, grid_host);
  const Summary sum = run_search(s, Options{}, host);
  for (int64_t l : s.lengths) EXPECT_EQ(host.best_speed_at(l), grid_host.best_speed_at(l)) << l;
  EXPECT_GT(sum.skipped, 0);
  EXPECT_LT(sum.runs, grid_sum.runs);
  // A skipped point either would not fit, or is no faster than the best measured at its length.
  ASSERT_EQ(static_cast<int64_t>(host.skipped.size()), sum.skipped);
  for (const auto& [p, length] : host.skipped) {
    const bool fits = host.memory_mib(p, length) <= host.limit_mib;
    EXPECT_TRUE(!fits || host.speed(p) <= host.best_speed_at(length))
        << describe(s, p) << " at " << length;
  }
}

// A host whose cost model predicts sp 2 faster than sp 1 (the axis has no memory order).
struct Predicting : Synthetic {
  using Synthetic::Synthetic;
  std::optional<double> predicted_value(const Point& p, int64_t) override {
    return p[0] == 1 ? 2.0 : 1.0;
  }
};

TEST(SearchEngine, PredictionsOrderPointsOfEqualSavings) {
  Space s = test_space();
  s.lengths = {4096};
  Predicting host(s);
  host.limit_mib = 5000;
  run_search(s, Options{}, host);
  ASSERT_FALSE(host.runs.empty());
  // Throughput: fewest savings first, and among those the predicted winner (sp 2).
  EXPECT_EQ(describe(s, std::get<0>(host.runs.front())), describe(s, {1, 0, 0}));
  // Max length: most savings first, and among those sp 2 first.
  s.search_max = true;
  s.lengths = {1024, 2048, 4096};
  Predicting max_host(s);
  run_search(s, Options{}, max_host);
  ASSERT_FALSE(max_host.runs.empty());
  EXPECT_EQ(describe(s, std::get<0>(max_host.runs.front())), describe(s, {1, 1, 2}));
}

TEST(SearchEngine, BudgetStopsStartingRuns) {
  Space s = test_space();
  s.search_max = true;
  Synthetic host(s);
  host.limit_mib = 4000;
  host.max_runs = 5;
  const Summary sum = run_search(s, Options{}, host);
  EXPECT_TRUE(sum.budget_exhausted);
  EXPECT_EQ(host.runs.size(), 5u);
}

// A host driven by functions: the result of (point, length, probe) and a point's speed.
struct Scripted : Host {
  std::function<Result(const Point&, int64_t, bool)> outcome;
  std::function<double(const Point&)> speed = [](const Point&) { return 1.0; };
  std::vector<std::tuple<Point, int64_t, bool>> runs;
  struct Record {
    Point point;
    int64_t length;
    std::string status, reason;
  };
  std::vector<Record> records;
  std::map<Point, int64_t> longest_fit;  // real runs
  int64_t next_id = 1;
  int64_t invalid_from = 0;  // > 0: lengths from this one on break a rule (not run)

  std::optional<std::string> invalid_reason(const Point&) override { return std::nullopt; }
  std::optional<std::string> prune_reason(const Point&, int64_t) override { return std::nullopt; }
  RunOutcome run(const Point& p, int64_t length, bool probe) override {
    RunOutcome out;
    if (invalid_from > 0 && length >= invalid_from) {
      out.ran = false;
      return out;
    }
    runs.emplace_back(p, length, probe);
    out.trial_id = next_id++;
    out.result = outcome(p, length, probe);
    if (out.result == Result::kFits) out.value = speed(p);
    if (out.result == Result::kFits && !probe) {
      longest_fit[p] = std::max(longest_fit[p], length);
    }
    return out;
  }
  void record(const Point& p, int64_t length, const std::string& status,
              const std::string& reason) override {
    records.push_back({p, length, status, reason});
  }
  bool budget_left() override { return true; }
  int64_t runs_at(int64_t length, bool probe) const {
    int64_t n = 0;
    for (const auto& [p, l, pr] : runs) n += l == length && pr == probe;
    return n;
  }
};

// A trial the host does not run because its length breaks a rule is no run: the summary counts
// it apart from the runs.
TEST(SearchEngine, TrialsInvalidAtTheirLengthAreNotCountedAsRuns) {
  Space s;
  s.axes.push_back({"memory.tiled_mlp", {"1", "4"}, {0, 1}});
  s.lengths = {1024, 2048, 4096};
  Scripted host;
  host.outcome = [](const Point&, int64_t, bool) { return Result::kFits; };
  host.invalid_from = 4096;
  Options grid;
  grid.method = "grid";
  const Summary sum = run_search(s, grid, host);
  EXPECT_EQ(sum.runs, 4);
  EXPECT_EQ(sum.invalid_at_length, 2);
  EXPECT_EQ(static_cast<int64_t>(host.runs.size()), sum.runs);
}

// A ZeRO stage saves memory but may be faster: once stage 0 fits, the higher stages are still
// measured; the tiled MLP (whose saving costs time) stays dominated by the same stage untiled.
TEST(SearchEngine, HigherZeroStagesAreMeasuredOnceStageZeroFits) {
  Space s;
  s.axes.push_back({"zero.stage", {"0", "1", "2", "3"}, {0, 1, 2, 3}, /*saving_costs_time=*/false});
  s.axes.push_back({"memory.tiled_mlp", {"1", "4"}, {0, 1}});
  s.lengths = {4096};
  Scripted host;
  host.outcome = [](const Point&, int64_t, bool) { return Result::kFits; };
  host.speed = [](const Point& p) {
    const double stage[] = {1.0, 1.05, 1.2, 0.9};  // stage 2 is the fastest
    return stage[p[0]] * (p[1] == 0 ? 1.0 : 0.9);
  };
  const Summary sum = run_search(s, Options{}, host);
  EXPECT_EQ(sum.runs, 4);
  std::set<int> stages;
  for (const auto& [p, length, probe] : host.runs) {
    EXPECT_EQ(p[1], 0) << describe(s, p);
    stages.insert(p[0]);
  }
  EXPECT_EQ(stages, (std::set<int>{0, 1, 2, 3}));
  ASSERT_EQ(host.records.size(), 4u);
  for (const Scripted::Record& r : host.records) {
    EXPECT_EQ(r.status, "skipped");
    EXPECT_EQ(r.point[1], 1);
    EXPECT_EQ(r.reason.rfind("dominated by", 0), 0u) << r.reason;
  }
  Knowledge k(s);
  k.add({0, 0}, 0, /*fits=*/true, /*probe=*/false, 7);
  EXPECT_FALSE(k.dominating_fit({2, 0}, 0));  // saves more, on an axis where that may be faster
  EXPECT_EQ(k.dominating_fit({0, 1}, 0), 7);
  EXPECT_FALSE(k.dominating_fit({2, 1}, 0));
}

// One axis, lengths 1K..16K, fits up to 12K.
Space one_point_space() {
  Space s;
  s.axes.push_back({"mesh.sp", {"1"}, {}});
  for (int64_t l = 1024; l <= 16384; l += 1024) s.lengths.push_back(l);
  s.search_max = true;
  return s;
}

Result fits_to_12k(int64_t length) { return length <= 12288 ? Result::kFits : Result::kOom; }

// A run that fails (a timeout, a crash) at 8K says nothing about memory: the search tries around
// it and still finds 12K.
TEST(SearchEngine, AFailedRunBoundsNoBisection) {
  const Space s = one_point_space();
  Scripted host;
  host.outcome = [](const Point&, int64_t length, bool) {
    return length == 8192 ? Result::kFailed : fits_to_12k(length);
  };
  Options o;
  o.probe = false;
  run_search(s, o, host);
  EXPECT_EQ(host.longest_fit[{0}], 12288);
  EXPECT_EQ(host.runs_at(8192, false), 1);
  EXPECT_TRUE(host.records.empty()) << host.records.front().reason;  // settled: nothing to say
}

// A probe that fails does not cap the real search either.
TEST(SearchEngine, AFailedProbeDoesNotCapTheRealSearch) {
  const Space s = one_point_space();
  Scripted host;
  host.outcome = [](const Point&, int64_t length, bool probe) {
    return probe && length == 8192 ? Result::kFailed : fits_to_12k(length);
  };
  run_search(s, Options{}, host);
  EXPECT_EQ(host.longest_fit[{0}], 12288);
}

// After kMaxFailuresPerPoint failures the point's search stops, and the sweep records that its
// longest fitting length is open rather than taking the failures for out-of-memory.
TEST(SearchEngine, RepeatedFailuresLeaveTheLongestLengthOpenAndSaySo) {
  const Space s = one_point_space();
  Scripted host;
  host.outcome = [](const Point&, int64_t length, bool) {
    return length == 8192 || length == 7168 ? Result::kFailed : fits_to_12k(length);
  };
  Options o;
  o.probe = false;
  run_search(s, o, host);
  EXPECT_EQ(host.longest_fit[{0}], 4096);
  EXPECT_EQ(host.runs.size(), 5u);  // 1K, 2K, 4K, then 8K and 7K fail
  ASSERT_EQ(host.records.size(), 1u);
  EXPECT_EQ(host.records[0].status, "skipped");
  EXPECT_EQ(host.records[0].length, 0);
  EXPECT_EQ(host.records[0].reason,
            "longest fitting length not settled: fits at 4096; runs failed at 7168, 8192 (not a "
            "memory result), search stopped");
}

// Synthetic for a search with several workers: run() may be called from several threads at
// once. Each run holds its result back until `overlap` runs have been in flight together since
// it started, or until the engine has called idle() twice meanwhile (it is waiting for this run:
// the units after it depend on it). So a run is still in flight while every unit that does not
// wait for it decides: one that should have waited for it and did not would decide without its
// result and differ from the one-worker search. An engine starts an independent unit at once,
// without idling, so the overlap is seen whenever the search allows one.
struct Concurrent : Synthetic {
  using Synthetic::Synthetic;
  std::mutex mutex;
  std::condition_variable changed;
  int in_flight = 0, most_in_flight = 0, overlap = 2;
  int64_t overlaps = 0;  // times in_flight reached `overlap`
  int64_t idle_calls = 0;
  int64_t run_calls = 0;
  int64_t throw_at = 0;  // the run_calls-th run throws (0 = none)
  bool thrown = false;
  int64_t started_after_throw = 0;

  RunOutcome run(const Point& p, int64_t length, bool probe) override {
    std::unique_lock<std::mutex> lock(mutex);
    if (thrown) {
      // Started while the exception was on its way to the engine: such a run lasts long
      // enough that the engine has taken the exception before it ends, so that no unit
      // after it may start for a reason of the machine's scheduling.
      ++started_after_throw;
      changed.wait_for(lock, std::chrono::seconds(3), [] { return false; });
    }
    const int64_t overlaps_at_start = overlaps, idle_at_start = idle_calls;
    ++in_flight;
    most_in_flight = std::max(most_in_flight, in_flight);
    if (in_flight >= overlap) ++overlaps;
    changed.notify_all();
    changed.wait_for(lock, std::chrono::seconds(60), [&] {
      return overlaps > overlaps_at_start || idle_calls >= idle_at_start + 2;
    });
    const bool fail = ++run_calls == throw_at;
    RunOutcome out = Synthetic::run(p, length, probe);
    --in_flight;
    changed.notify_all();
    if (fail) {
      thrown = true;
      throw std::runtime_error("stop");
    }
    return out;
  }
  void idle() override {
    std::lock_guard<std::mutex> lock(mutex);
    ++idle_calls;
    changed.notify_all();
  }
  // Points and lengths by status, without trial ids (they depend on the order runs end).
  std::map<std::string, std::multiset<std::pair<Point, int64_t>>> by_status;
  void record(const Point& p, int64_t length, const std::string& status,
              const std::string& reason) override {
    Synthetic::record(p, length, status, reason);
    by_status[status].insert({p, length});
  }
  std::multiset<std::tuple<Point, int64_t, bool>> run_set() const {
    return {runs.begin(), runs.end()};
  }
};

// Six workers decide every unit from the same finished runs as one: the same runs, skips,
// prunes and longest lengths in the grid, throughput (dominance, implied out-of-memory) and
// max-length (probes, bisection, curve) searches, with runs side by side.
TEST(SearchEngine, WorkersRunSideBySideAndDecideAsOne) {
  Space throughput = test_space();
  throughput.lengths = {4096, 8192};
  Space max_length = test_space();
  max_length.search_max = true;
  max_length.curve = 2;
  struct Case {
    const Space* space;
    std::string method;
  };
  for (const Case& c : {Case{&throughput, "smart"}, Case{&throughput, "grid"},
                        Case{&max_length, "smart"}}) {
    Options one;
    one.method = c.method;
    Concurrent serial(*c.space);
    serial.limit_mib = 5000;
    serial.prune_above_mib = 5200;  // above the limit: prunes only what cannot fit
    serial.overlap = 1;
    const Summary a = run_search(*c.space, one, serial);
    Options six = one;
    six.workers = 6;
    Concurrent parallel(*c.space);
    parallel.overlap = six.workers;
    parallel.limit_mib = 5000;
    parallel.prune_above_mib = 5200;
    const Summary b = run_search(*c.space, six, parallel);
    SCOPED_TRACE(c.method + (c.space->search_max ? " max length" : " throughput"));
    EXPECT_EQ(serial.most_in_flight, 1);
    EXPECT_GE(parallel.most_in_flight, 2);
    EXPECT_LE(parallel.most_in_flight, 6);
    EXPECT_EQ(parallel.run_set(), serial.run_set());
    EXPECT_EQ(parallel.by_status, serial.by_status);
    EXPECT_EQ(parallel.real_results, serial.real_results);
    EXPECT_EQ(a.runs, b.runs);
    EXPECT_EQ(a.probes, b.probes);
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(a.pruned, b.pruned);
    if (c.method == "smart") {
      EXPECT_GT(b.skipped, 0);  // dominance and implications still skip
      EXPECT_GT(b.pruned, 0);   // and the memory model still prunes
    }
  }
}

// A throughput search on six workers never runs what a finished run implies (out of memory
// implied, or dominated): the units that could be skipped wait for the runs that decide them.
TEST(SearchEngine, WorkersSkipWhatFinishedRunsImply) {
  Space s = test_space();
  s.lengths = {4096, 8192};
  Concurrent host(s);
  host.limit_mib = 5000;
  Options o;
  o.workers = host.overlap = 6;
  run_search(s, o, host);
  ASSERT_FALSE(host.by_status["skipped"].empty());
  for (const auto& [p, length, probe] : host.runs) {
    EXPECT_EQ(host.by_status["skipped"].count({p, length}), 0u) << describe(s, p) << length;
  }
  // Nothing dominated ran: no point ran at a length where one it cannot beat already fitted.
  for (const auto& [p, length, probe] : host.runs) {
    for (const auto& [q, other, other_probe] : host.runs) {
      if (other != length || q == p || !cannot_be_faster(s, p, q)) continue;
      const bool q_fits = host.real_results[{q, length}].first;
      EXPECT_FALSE(q_fits) << describe(s, p) << " ran though " << describe(s, q) << " fits at "
                           << length;
    }
  }
}

// Concurrent, recording which unit took each decision: budget_left() is asked, under the engine's
// lock, as a grid unit decides to start its run, and run() follows in the same thread.
struct DecisionOrder : Concurrent {
  using Concurrent::Concurrent;
  std::mutex order_mutex;
  std::vector<std::thread::id> deciders;
  std::map<std::thread::id, std::pair<Point, int64_t>> unit_of;
  bool budget_left() override {
    std::lock_guard<std::mutex> lock(order_mutex);
    deciders.push_back(std::this_thread::get_id());
    return true;
  }
  RunOutcome run(const Point& p, int64_t length, bool probe) override {
    {
      std::lock_guard<std::mutex> lock(order_mutex);
      unit_of[std::this_thread::get_id()] = {p, length};
    }
    return Concurrent::run(p, length, probe);
  }
};

// Units take their first decision in the one-worker order, whichever of the started threads
// gets the engine's lock first (else, on --resume, where replayed runs end at once, a later
// unit's result could decide an earlier one).
TEST(SearchEngine, WorkersDecideInTheOneWorkerOrder) {
  Space s = test_space();
  s.lengths = {4096, 8192};
  Options one;
  one.method = "grid";
  Concurrent serial(s);
  serial.overlap = 1;
  run_search(s, one, serial);
  std::vector<std::pair<Point, int64_t>> expected;
  for (const auto& [p, length, probe] : serial.runs) expected.emplace_back(p, length);
  for (int repeat = 0; repeat < 5; ++repeat) {
    DecisionOrder host(s);
    Options six = one;
    six.workers = host.overlap = 6;
    run_search(s, six, host);
    std::vector<std::pair<Point, int64_t>> decided;
    for (const std::thread::id& id : host.deciders) decided.push_back(host.unit_of.at(id));
    ASSERT_EQ(decided, expected) << "repeat " << repeat;
  }
}

// An exception in one worker's run stops the search: nothing starts once the engine has it, and
// it reaches the caller once the other runs ended. Between the throw and the engine taking it,
// the other worker may end its run and start one more (no more: that one outlasts the window).
TEST(SearchEngine, AnExceptionInAWorkerStopsTheSearch) {
  Space s = test_space();
  s.lengths = {4096, 8192};
  Concurrent host(s);
  host.limit_mib = 5000;
  host.throw_at = 3;
  Options o;
  o.method = "grid";
  o.workers = 2;
  EXPECT_THROW(run_search(s, o, host), std::runtime_error);
  EXPECT_LE(host.started_after_throw, 1);
  // the third, the one beside it, and at most the one started in the window
  EXPECT_LE(host.runs.size(), 5u);
  EXPECT_EQ(host.in_flight, 0);
}

// Runs a two-worker search with address space for one thread's stack (8 MiB by default) but
// not for a second, and exits: 3 when the search threw std::system_error, 0 when it did not, 5
// when the cap could not be set (a process ended by std::terminate fails the test).
[[noreturn]] void search_with_room_for_one_thread() {
  Space s = test_space();
  s.lengths = {4096, 8192};
  Concurrent host(s);
  Options o;
  o.method = "grid";
  o.workers = 2;
  std::ifstream statm("/proc/self/statm");
  long pages = 0;
  statm >> pages;
  const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
                     (rlim_t{12} << 20);
  const rlimit limit{cap, cap};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(5);
  try {
    run_search(s, o, host);
  } catch (const std::system_error&) {
    std::_Exit(3);
  }
  std::_Exit(0);
}

// A worker thread that cannot be made stops the search with that error once the units started
// have ended, instead of ending the process (std::terminate for a thread left joinable).
TEST(SearchEngine, AWorkerThatCannotStartStopsTheSearchWithItsError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(search_with_room_for_one_thread(), testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace ulysses::search
