// The multi-rank harness itself: every rank runs the body, a failing rank fails the run, and a
// child that runs no test body (its gtest filter matches nothing) fails the run instead of
// passing silently.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "support/multi_rank.h"
#include "common/remove_tree.h"

namespace ulysses::testing {
namespace {

// The failures `run` reports in this (parent) process, captured instead of failing this test.
std::vector<std::string> captured_failures(const std::function<void()>& run) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    run();
  }
  std::vector<std::string> messages;
  for (int i = 0; i < results.size(); ++i) {
    if (results.GetTestPartResult(i).failed()) {
      messages.push_back(results.GetTestPartResult(i).message());
    }
  }
  return messages;
}

std::string joined(const std::vector<std::string>& messages) {
  std::string out;
  for (const auto& m : messages) out += m + "\n";
  return out;
}

TEST(MultiRank, EveryRankRunsTheBodyWithItsRank) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "ulysses-multi-rank-test-every";
  if (!in_rank_child()) {
    ulysses::remove_tree(dir);
    std::filesystem::create_directories(dir);
  }
  run_ranks(3, [&](const RankContext& ctx) {
    EXPECT_EQ(ctx.world, 3);
    std::ofstream(dir / ("rank-" + std::to_string(ctx.rank))) << ctx.rank;
  });
  if (in_rank_child()) return;
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(std::filesystem::exists(dir / ("rank-" + std::to_string(r)))) << r;
  ulysses::remove_tree(dir);
}

TEST(MultiRank, AFailingRankFailsTheRun) {
  auto launch = [] {
    run_ranks(2, [](const RankContext& ctx) { EXPECT_NE(ctx.rank, 1) << "rank 1 fails on purpose"; });
  };
  if (in_rank_child()) return launch();  // the children report their failure through exit status
  // Rank 0 may be killed once rank 1 has failed, so it may fail too; rank 1 must.
  const std::string failures = joined(captured_failures(launch));
  EXPECT_NE(failures.find("rank 1 failed"), std::string::npos) << failures;
}

// gtest exits 0 when its filter matches no test: such a child must not count as a passing rank.
TEST(MultiRank, AChildWhoseFilterMatchesNoTestFailsTheRun) {
  if (in_rank_child()) return;  // never reached by the children: their filter matches nothing
  const auto failures = captured_failures([] {
    run_ranks_with_filter("NoSuchSuite.NoSuchTest", 2, [](const RankContext&) {});
  });
  ASSERT_EQ(failures.size(), 2u) << joined(failures);
  for (const auto& f : failures) EXPECT_NE(f.find("ran no test body"), std::string::npos) << f;
}

// The same filter the harness builds for a parameterized test reaches its body.
class MultiRankParam : public ::testing::TestWithParam<int> {};

TEST_P(MultiRankParam, ParameterizedTestsRunInTheChildren) {
  run_ranks(GetParam(), [](const RankContext& ctx) { EXPECT_LT(ctx.rank, ctx.world); });
}

INSTANTIATE_TEST_SUITE_P(Worlds, MultiRankParam, ::testing::Values(1, 2));

}  // namespace
}  // namespace ulysses::testing
