// Runs a test body on N real processes ("ranks"), for multi-process Gloo tests.
//
// run_ranks(world, body) in the parent re-executes this test binary `world` times with
// --gtest_filter=<the current test> and ULYSSES_TEST_RANK/WORLD/STORE in the environment, waits for
// all children (killing the rest when one fails or the deadline passes) and EXPECTs that every
// child exited 0. In a child it runs body(ctx) for that rank only and exits: 0 when the body
// raised no gtest failure and no exception, 1 otherwise. Children share a fresh FileStore path in
// a temp dir, so tests never clash on ports. A test may call run_ranks several times: a child runs
// only the call it was started for (the others return at once in it), so code between calls that
// must run once belongs under `if (!in_rank_child())`.
// A child that exits 0 without having run the body (its gtest filter matched no test, or the test
// did not reach this run_ranks call in the child) is a failure: each child leaves a marker file in
// the shared temp dir just before running the body, and the parent requires one per rank.
#pragma once
#include <functional>
#include <string>

namespace ulysses::testing {

struct RankContext {
  int rank = 0;
  int world = 1;
  std::string store_path;  // FileStore file shared by all ranks of this run
  std::string temp_dir;    // per-run temp dir, shared by all ranks (removed by the parent)
};

// REQUIRES: called from inside a TEST body; world >= 1. timeout_s bounds the whole run.
void run_ranks(int world, const std::function<void(const RankContext&)>& body,
               double timeout_s = 240.0);

// run_ranks with the children started as `--gtest_filter=<gtest_filter>` instead of the current
// test: for the harness's own tests (a filter matching nothing must fail the run).
// REQUIRES: called from inside a TEST body; world >= 1.
void run_ranks_with_filter(const std::string& gtest_filter, int world,
                           const std::function<void(const RankContext&)>& body,
                           double timeout_s = 240.0);

// True in a child process started by run_ranks.
bool in_rank_child();

}  // namespace ulysses::testing
