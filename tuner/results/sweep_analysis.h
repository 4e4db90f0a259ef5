// What the report computes from a sweep's trials, as pure functions over the store's records:
// which trials are measurements, the search space's axes, configurations, the best trial per
// mesh, the time breakdown of a step, and the Pareto front of sequence length vs throughput.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::report {

using store::TrialPhase;
using store::TrialRecord;

// True when the trial's throughput is a real measurement: status ok, not a memory probe
// (attention.skip_all_but_last skews time), tokens_per_s_per_rank set.
bool is_measured(const TrialRecord& trial);

// The trial's point (JSON object) as (axis key, value text) in the object's order, without the
// mesh and sequence-length axes ("mesh.dp", "mesh.sp", "sequence.length"), which reports show as
// columns of their own. Strings unquoted, numbers and booleans as JSON writes them. A point that
// is not a JSON object gives {("point", its text)}.
std::vector<std::pair<std::string, std::string>> axis_values(const TrialRecord& trial);
// The axis keys of all trials, in first-seen order.
std::vector<std::string> axis_keys(const std::vector<TrialRecord>& trials);
// Column headers for axis keys: the last dotted component ("memory.tiled_mlp" -> "tiled_mlp")
// unless two keys share it, then the whole key. Same order and size as `keys`.
std::vector<std::string> axis_headers(const std::vector<std::string>& keys);
// The value of axis `key` of the trial, "" when the point has no such axis.
std::string axis_value(const TrialRecord& trial, const std::string& key);

// "dp=1 sp=2 tiled_mlp=4 offload=none": the mesh, its split as format.h mesh_split says it
// ("dp=1 sp=4 (2 a2a x 2 ring) ..."), and every axis but the length (and but the axis `except`
// when given). Trials with the same configuration form one line of a plot against
// sequence length.
std::string configuration(const TrialRecord& trial, const std::string& except = "");

// The backend that ran the trial: its point's "backend" axis, else "native" (ulysses-train).
std::string trial_backend(const TrialRecord& trial);

// Counts by status: kTrialStatuses order first, then unknown statuses in first-seen order; only
// statuses that occur.
std::vector<std::pair<std::string, int>> status_counts(const std::vector<TrialRecord>& trials);

// One mesh's results (a mesh as format.h mesh() names it, split included). fastest: the measured trial with the highest tokens/s per rank; longest:
// the measured trial with the longest sequence (the faster one on a tie). Unset when no trial of
// the mesh was measured.
struct MeshBest {
  int64_t dp = 1, sp = 1;
  std::string mesh;  // mesh(): "1x4", "1x4 (2 a2a x 2 ring)", "1x3 uneven"
  int trials = 0;    // trials of this mesh, every status
  int measured = 0;  // is_measured() trials
  std::optional<TrialRecord> fastest;
  std::optional<TrialRecord> longest;
};
// One entry per mesh that occurs, ordered by sp, dp, then split.
std::vector<MeshBest> best_per_mesh(const std::vector<TrialRecord>& trials);

// Milliseconds per step by category, from the trial's phases "compute_ms", "comm_ms",
// "offload_ms", "optimizer_ms" (0 when absent); other = step_ms - their sum, 0 when the phases
// overlap to more than the step. REQUIRES: trial.step_ms set.
struct TimeBreakdown {
  double compute_ms = 0, comm_ms = 0, offload_ms = 0, optimizer_ms = 0, other_ms = 0;
};
TimeBreakdown time_breakdown(const TrialRecord& trial, const std::vector<TrialPhase>& phases);

// A measured point of the length / throughput plane.
struct LengthThroughput {
  int64_t seqlen = 0;
  double tokens_per_s_per_rank = 0.0;
  int64_t trial_id = 0;
};
// The points that no other point beats, taking longer and faster as better: p is dropped when
// some q has q.seqlen >= p.seqlen and q.tokens >= p.tokens with one of them strictly greater.
// Of points equal in both only the lowest trial id is kept. Sorted by seqlen ascending (so
// throughput descending). Points with a NaN throughput are ignored.
std::vector<LengthThroughput> pareto_front(std::vector<LengthThroughput> points);

}  // namespace ulysses::report
