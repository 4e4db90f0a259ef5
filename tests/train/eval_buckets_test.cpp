// position_bucket_edges: halves of the context from its end at every length, so CPU-sized runs get
// several buckets too (fixed 1K edges gave a 256-token run one bucket).
#include <gtest/gtest.h>

#include "train/evaluator.h"

namespace ulysses::train {
namespace {

using Edges = std::vector<int64_t>;

TEST(EvalBuckets, EdgesHalveFromTheEnd) {
  EXPECT_EQ(position_bucket_edges(4096), (Edges{0, 128, 256, 512, 1024, 2048, 4096}));
  EXPECT_EQ(position_bucket_edges(131072), (Edges{0, 4096, 8192, 16384, 32768, 65536, 131072}));
  EXPECT_EQ(position_bucket_edges(256), (Edges{0, 8, 16, 32, 64, 128, 256}));
}

TEST(EvalBuckets, ShortAndOddLengthsKeepIncreasingEdges) {
  EXPECT_EQ(position_bucket_edges(1), (Edges{0, 1}));
  EXPECT_EQ(position_bucket_edges(3), (Edges{0, 1, 3}));
  EXPECT_EQ(position_bucket_edges(1000), (Edges{0, 31, 62, 125, 250, 500, 1000}));
}

}  // namespace
}  // namespace ulysses::train
