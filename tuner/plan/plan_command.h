// `ulysses-tune plan`: predicted memory, step time, tokens/s, MFU and longest fitting sequence
// for meshes x memory features of a model on a hardware profile (planner.h), as a terminal table
// or --json; and `plan --fit DB`: the cost model calibrated on a sweep's own trials, predicted
// beside measured for every ok trial, stored in the database's calibrations table with the trials
// it was fitted on (calibration_trials) and optionally written as JSON with the same data.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ulysses::plan {

struct PlanOptions {
  std::string model = "llama-3.1-8b";  // preset name or a model YAML path
  std::string hardware = "h100-sxm";   // profiles/hardware/<name>.yaml or a path
  int64_t world = 0;                   // 0 = the profile's nodes x devices_per_node
  int64_t nodes = 0;                   // 0 = the profile's
  int64_t seqlen = 0;                  // 0 = --max-seqlen
  bool max_seqlen = false;
  std::vector<std::string> features;   // each one feature set; empty = the default sets
  int64_t micro_batch = 1;
  int64_t zero = 0;                    // zero.stage of every row whose features name none
  std::string precision;               // "" = bf16 on cuda, fp32 on cpu
  std::string calibration;             // JSON written by --fit (memory + time coefficients)
  std::string db;                      // results database holding a fit (plan --fit stores it)
  bool json = false;
  bool what_if_deepspeed = false;      // bf16 gradients, all states sharded (ZeRO-3)
  bool uneven_heads = false;           // also meshes whose sp splits the heads unevenly
  bool ring = false;                   // also meshes with ring attention (mesh.sp_ring)
  bool components = false;             // also print each row's memory terms with their formulas
  std::string config;                  // a run config to predict as written ("" = the plan)
  // --fit mode
  std::string fit_db;
  std::string sweep;
  std::string out;                     // calibration JSON to write ("" = none)
  bool force = false;                  // replace an existing `out`
};

CLI::App* add_plan_command(CLI::App& app, PlanOptions* options);

// Prints the plan (or the fit). Returns kExitOk; throws UserError for bad input.
int run_plan(const PlanOptions& options);

}  // namespace ulysses::plan
