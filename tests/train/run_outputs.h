// Helpers for tests that run whole training jobs on rank children: a directory every process
// shares, and the per-step records a run wrote to metrics.jsonl.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "support/multi_rank.h"

namespace ulysses::testing {

// <temp>/ulysses-<prefix>-<name>: the same path in the parent and its rank children, created
// fresh by the parent only.
inline std::string shared_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ulysses-" + prefix + "-" + name);
  if (!in_rank_child()) {
    remove_tree(dir);
    std::filesystem::create_directories(dir);
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

}  // namespace ulysses::testing
