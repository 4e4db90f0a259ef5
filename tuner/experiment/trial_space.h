// From an experiment to what the search engine explores and what each trial runs: the space
// with `mesh.sp: auto` expanded and the known memory orders attached (data, below), shorthand
// axes expanded into run-config keys, and the full run config of a (point, length).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"
#include "tuner/experiment/experiment.h"
#include "tuner/search/space.h"

namespace ulysses::experiment {

// The search space of `e`. Axis keys must be run-config keys (config/field table) or shorthands
// (memory.offload: none|activations|optimizer|both); `mesh.sp: auto` becomes every sp that
// divides world_size and makes a valid mesh for some choice of the space's other mesh.* and
// model.* values (every mesh.sp_ring value it lists, auto included, and mesh.uneven_heads; the
// base's value where it lists none): its points with the other choices are invalid, each with its
// reason. Axes whose memory order is known
// (tiles, checkpointing, offloads, micro-batch, ZeRO stage) get it; others are unordered (the
// backend axis too, added first when the experiment lists more than native). ZeRO
// stage and tiled loss save memory without necessarily costing time (Axis::saving_costs_time
// false: no dominance along them).
// Throws UserError "<file>: space.<key>: ..." for an unknown key, mesh.dp (derived), or a base
// run config that no choice of the space's values makes valid ("<file>: base: <the base's own
// config error>"; a base that only the space's values make valid, such as mesh.sp 4 over 3 heads
// with mesh.sp_ring: [1, 2] in the space, is fine).
search::Space build_space(const Experiment& e);

// The axis of the trial backend, first in the space when the experiment lists another backend
// than native (experiment.h `backend`); its values are backend names, not run-config values.
inline constexpr const char* kBackendAxis = "backend";

// The backend of point `p`: its `backend` axis value, else "native".
std::string point_backend(const search::Space& space, const search::Point& p);

// The --set overrides of point `p` (shorthands expanded, the backend left out), in axis order.
std::vector<std::string> point_overrides(const search::Space& space, const search::Point& p);

// The per-rank memory limit a trial runs under (GiB, 0 = none). On CPU the kernel enforces it
// (RLIMIT_AS), so the head-room comes off it: (1 - headroom) x memory_limit_gib. On CUDA trials
// run under the whole device limit and the head-room is checked against their measured peak.
double trial_memory_limit_gib(const Experiment& e);

// One trial's run config: base + point + sequence.length + mesh.dp = world / sp + trial length
// (train.steps, profile.warmup_steps) + trial_memory_limit_gib + output.dir, and
// attention.skip_all_but_last for a memory probe; validated for the experiment's world size.
struct TrialPlan {
  config::RunConfig config;
  std::string yaml;  // config::to_yaml(config)
};
// Throws UserError naming the offending key when the point breaks a rule (the reason a point is
// `invalid`).
TrialPlan plan_trial(const Experiment& e, const search::Space& space, const search::Point& p,
                     int64_t length, bool probe, const std::string& output_dir);

}  // namespace ulysses::experiment
