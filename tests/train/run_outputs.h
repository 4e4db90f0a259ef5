// Helpers for tests that run whole training jobs on rank children: the run itself, a directory
// every process shares, and the per-step records a run wrote to metrics.jsonl.
#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "common/remove_tree.h"
#include "config/mesh_factors.h"
#include "config/options.h"
#include "support/multi_rank.h"
#include "train/trainer.h"

namespace ulysses::testing {

// Trains `c` on CPU over c.mesh.dp x c.mesh.sp real Gloo ranks (children of this process); each
// rank's run must return 0.
inline void train_on_ranks(const config::RunConfig& c) {
  run_ranks(static_cast<int>(c.mesh.dp * c.mesh.sp), [&](const RankContext& ctx) {
    auto mesh = comm::DeviceMesh::create_for_test(
        ctx.rank, ctx.world, ctx.store_path, c.mesh.dp, c.mesh.sp, 60.0, at::Device(at::kCPU),
        config::resolved_sp_ring(c.mesh, c.model.num_heads, c.model.num_kv_heads));
    EXPECT_EQ(train::run_training(c, mesh, at::Device(at::kCPU)), 0);
  });
}

// <temp>/ulysses-<prefix>-<name>-<pid>: the same path in the parent and its rank children
// (run_ranks spawns them itself, so <pid> is the parent's in both), created fresh by the parent
// only and removed when it exits; distinct between test processes that run the same case at once
// (the instruction-set variants of an executable run beside its own tests).
inline std::string shared_dir(const std::string& prefix, const std::string& name) {
  const bool child = in_rank_child();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("ulysses-" + prefix + "-" + name + "-" + std::to_string(child ? ::getppid() : ::getpid()));
  if (!child) {
    // Removes every directory made here when the test process exits.
    static struct Made {
      std::vector<std::filesystem::path> dirs;
      ~Made() {
        for (const auto& d : dirs) remove_tree(d);
      }
    } made;
    remove_tree(dir);
    std::filesystem::create_directories(dir);
    made.dirs.push_back(dir);
  }
  return dir.string();
}

struct StepRecord {
  double loss = 0.0, grad_norm = 0.0;
};

// The step records (those with a grad_norm) of a metrics.jsonl, in order.
inline std::vector<StepRecord> read_steps(const std::string& metrics_path) {
  std::vector<StepRecord> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("grad_norm")) {
      out.push_back({j["loss"].get<double>(), j["grad_norm"].get<double>()});
    }
  }
  return out;
}

// EXPECTs each step of `got` to match `want` (loss within relative loss_tol, grad_norm within
// norm_tol), naming `what` and the step; returns the worst relative differences.
struct StepsDiff {
  double loss = 0.0, grad_norm = 0.0;
};
inline StepsDiff expect_steps_match(const std::vector<StepRecord>& got,
                                    const std::vector<StepRecord>& want, double loss_tol,
                                    double norm_tol, const std::string& what) {
  StepsDiff worst;
  EXPECT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < std::min(got.size(), want.size()); ++s) {
    const std::string at = what + " step " + std::to_string(s + 1);
    EXPECT_NEAR(got[s].loss, want[s].loss, loss_tol * want[s].loss) << at;
    EXPECT_NEAR(got[s].grad_norm, want[s].grad_norm, norm_tol * want[s].grad_norm) << at;
    worst.loss = std::max(worst.loss, std::abs(got[s].loss / want[s].loss - 1));
    worst.grad_norm = std::max(worst.grad_norm, std::abs(got[s].grad_norm / want[s].grad_norm - 1));
  }
  return worst;
}

}  // namespace ulysses::testing
