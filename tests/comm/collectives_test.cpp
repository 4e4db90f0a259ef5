// Group collectives on 4 real Gloo ranks (one process each), checked against values each rank
// computes independently. All values are small integers, exact in float/double: no tolerance.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "comm/mesh.h"
#include "support/multi_rank.h"

namespace ulysses::comm {
namespace {

using testing::RankContext;
using testing::run_ranks;

constexpr int kWorld = 4;

// Rows rank `src` sends to rank `dst` in the uneven test: 1..3, not symmetric in (src, dst).
int64_t rows_sent(int src, int dst) { return 1 + (2 * src + dst) % 3; }

TEST(Collectives, AllToAllEqualSplitsExactValuesAndRoundTrip) {
  run_ranks(kWorld, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, kWorld);
    Group& group = mesh.world();
    const int r = ctx.rank;
    // Element [k, a, b] of rank r = r*1000 + k*10 + a*3 + b; built transposed so that the input
    // is not contiguous.
    at::Tensor base = at::arange(8 * 2 * 3, at::kDouble).reshape({8, 2, 3});  // [8, 2, 3]
    at::Tensor rows = at::arange(8, at::kDouble).reshape({8, 1, 1});
    at::Tensor values = r * 1000.0 + rows * 10.0 + (base - rows * 6.0);  // [8, 2, 3]
    at::Tensor input = values.permute({2, 1, 0}).contiguous().permute({2, 1, 0});
    ASSERT_FALSE(input.is_contiguous());

    at::Tensor out = group.all_to_all_single(input);  // [8, 2, 3] -> [8, 2, 3]
    ASSERT_EQ(out.sizes(), input.sizes());
    EXPECT_TRUE(out.is_contiguous());
    // Chunk i (rows 2i, 2i+1) comes from rank i: its rows 2r, 2r+1.
    for (int i = 0; i < kWorld; ++i) {
      for (int j = 0; j < 2; ++j) {
        for (int a = 0; a < 2; ++a) {
          for (int b = 0; b < 3; ++b) {
            const double expected = i * 1000.0 + (2 * r + j) * 10.0 + a * 3 + b;
            EXPECT_EQ(out[2 * i + j][a][b].item<double>(), expected)
                << "rank " << r << " chunk " << i << " row " << j;
          }
        }
      }
    }
    at::Tensor back = group.all_to_all_single(out);  // the exchange is its own inverse
    EXPECT_TRUE(at::equal(back, values));

    at::Tensor ids = at::full({kWorld}, r, at::kLong);  // [4] int64: row i goes to rank i
    at::Tensor got = group.all_to_all_single(ids);      // [4]: row i comes from rank i
    EXPECT_TRUE(at::equal(got, at::arange(kWorld, at::kLong)));
    at::Tensor half_ids = at::full({kWorld, 2}, r, at::kBFloat16);  // [4, 2] bf16
    at::Tensor half_got = group.all_to_all_single(half_ids);        // [4, 2]
    EXPECT_TRUE(
        at::equal(half_got, at::arange(kWorld, at::kBFloat16).unsqueeze(1).expand({kWorld, 2})));
  });
}

TEST(Collectives, AllToAllUnevenSplitsExactValuesAndRoundTrip) {
  run_ranks(kWorld, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, kWorld);
    Group& group = mesh.world();
    const int r = ctx.rank;
    std::vector<int64_t> input_splits, output_splits;
    std::vector<at::Tensor> chunks;
    for (int dst = 0; dst < kWorld; ++dst) {
      input_splits.push_back(rows_sent(r, dst));
      output_splits.push_back(rows_sent(dst, r));
      // Row k of the chunk for dst: {r*1000 + dst*100 + k, same + 0.5}.
      at::Tensor k = at::arange(rows_sent(r, dst), at::kFloat).unsqueeze(1);
      at::Tensor row = r * 1000.0 + dst * 100.0 + k;
      chunks.push_back(at::cat({row, row + 0.5}, 1));  // [rows_sent(r, dst), 2]
    }
    at::Tensor input = at::cat(chunks, 0);  // [sum_dst rows_sent(r, dst), 2]

    at::Tensor out = group.all_to_all_single(input, output_splits, input_splits);
    // out: [sum_src rows_sent(src, r), 2], chunks from src = 0..3 in order.
    std::vector<at::Tensor> expected_chunks;
    for (int src = 0; src < kWorld; ++src) {
      at::Tensor k = at::arange(rows_sent(src, r), at::kFloat).unsqueeze(1);
      at::Tensor row = src * 1000.0 + r * 100.0 + k;
      expected_chunks.push_back(at::cat({row, row + 0.5}, 1));
    }
    const at::Tensor expected = at::cat(expected_chunks, 0);
    ASSERT_EQ(out.sizes(), expected.sizes());
    EXPECT_TRUE(at::equal(out, expected)) << "rank " << r << "\n" << out << "\n" << expected;

    at::Tensor back = group.all_to_all_single(out, input_splits, output_splits);
    EXPECT_TRUE(at::equal(back, input));
  });
}

TEST(Collectives, AllReduceSumMaxMin) {
  run_ranks(kWorld, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, kWorld, 1);
    Group& group = mesh.world();
    const double r = ctx.rank;
    auto values = [&] { return at::tensor({r + 1, 10 * r, -r}, at::kDouble); };  // [3]

    at::Tensor t = values();
    group.all_reduce(t);  // sum over r = 0..3
    EXPECT_TRUE(at::equal(t, at::tensor({10.0, 60.0, -6.0}, at::kDouble))) << t;
    t = values();
    group.all_reduce(t, ReduceOp::kMax);
    EXPECT_TRUE(at::equal(t, at::tensor({4.0, 30.0, 0.0}, at::kDouble))) << t;
    t = values();
    group.all_reduce(t, ReduceOp::kMin);
    EXPECT_TRUE(at::equal(t, at::tensor({1.0, 0.0, -3.0}, at::kDouble))) << t;

    // A non-contiguous view is reduced in place: column 1 of a [3, 2] float tensor.
    at::Tensor matrix = at::zeros({3, 2}, at::kFloat);  // [3, 2]
    matrix.select(1, 1).fill_(static_cast<float>(r));
    at::Tensor column = matrix.select(1, 1);  // [3], stride 2
    ASSERT_FALSE(column.is_contiguous());
    group.all_reduce(column);
    EXPECT_TRUE(at::equal(matrix.select(1, 1), at::full({3}, 6.0f)));
    EXPECT_TRUE(at::equal(matrix.select(1, 0), at::zeros({3})));

    // bf16, as used with precision: bf16 (small integers are exact).
    at::Tensor half = at::full({3}, r + 1, at::kBFloat16);  // [3]
    group.all_reduce(half);
    EXPECT_EQ(half.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(half, at::full({3}, 10, at::kBFloat16))) << half;
  });
}

TEST(Collectives, ReduceScatterSumsOnlyThisRanksSlice) {
  run_ranks(kWorld, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 2, 2);
    Group& group = mesh.world();
    const int r = ctx.rank;
    // Element [i, k] of rank r = (r + 1) * (100 * i + k): slice i summed over ranks is
    // 10 * (100 * i + k).
    at::Tensor rows = at::arange(kWorld, at::kFloat).reshape({kWorld, 1});
    at::Tensor input = (r + 1.0) * (100.0 * rows + at::arange(5, at::kFloat));  // [4, 5]
    const at::Tensor before = input.clone();
    at::Tensor out = group.reduce_scatter(input);  // [5]
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{5}));
    EXPECT_TRUE(at::equal(out, 10.0 * (100.0 * r + at::arange(5, at::kFloat)))) << out;
    EXPECT_TRUE(at::equal(input, before));
    EXPECT_THROW(group.reduce_scatter(at::zeros({3, 5})), c10::Error);

    // Two in flight at once with a blocking collective between start and wait, waited out of
    // order (ZeRO-2/3 reduce a unit while the next computes); bf16 comes back as bf16.
    Group::Pending first = group.reduce_scatter_start(input);
    Group::Pending second = group.reduce_scatter_start(input.to(at::kBFloat16));
    at::Tensor sum = at::ones({1});
    group.all_reduce(sum, ReduceOp::kSum);
    EXPECT_EQ(sum.item<float>(), static_cast<float>(kWorld));
    const at::Tensor later = second.wait();
    EXPECT_TRUE(at::equal(first.wait(), out));
    EXPECT_EQ(later.scalar_type(), at::kBFloat16);
    // Gloo sums the bf16 inputs in fp32; the result is rounded to bf16 once.
    const at::Tensor rounded = input.to(at::kBFloat16).to(at::kFloat);
    EXPECT_TRUE(at::equal(later, group.reduce_scatter(rounded).to(at::kBFloat16))) << later;
  });
}

TEST(Collectives, AllGatherBroadcastBarrier) {
  run_ranks(kWorld, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 2, 2);
    Group& group = mesh.world();
    const int r = ctx.rank;

    at::Tensor mine = r * 10.0 + at::arange(6, at::kFloat).reshape({2, 3});  // [2, 3]
    at::Tensor gathered = group.all_gather(mine);                            // [4, 2, 3]
    ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{kWorld, 2, 3}));
    for (int i = 0; i < kWorld; ++i) {
      EXPECT_TRUE(at::equal(gathered[i], i * 10.0 + at::arange(6, at::kFloat).reshape({2, 3})));
    }

    // Two gathers in flight at once, and a blocking collective issued between start and wait
    // (ZeRO-3's prefetch); bf16 travels as fp32 over Gloo and comes back as bf16.
    Group::Pending first = group.all_gather_start(mine);
    Group::Pending second = group.all_gather_start(mine.to(at::kBFloat16) + 1);
    at::Tensor sum = at::ones({1});
    group.all_reduce(sum, ReduceOp::kSum);
    EXPECT_EQ(sum.item<float>(), static_cast<float>(kWorld));
    const at::Tensor later = second.wait();  // [4, 2, 3] bf16, waited out of order
    EXPECT_TRUE(at::equal(first.wait(), gathered));
    EXPECT_EQ(later.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(later.to(at::kFloat), gathered + 1));

    // Into the caller's tensor (ZeRO-3 gathers a parameter into its full buffer this way); a
    // tensor of another shape is refused before anything is issued.
    at::Tensor into = at::full({kWorld, 2, 3}, -1.0, at::kBFloat16);
    at::Tensor filled = group.all_gather_start(mine.to(at::kBFloat16), into).wait();
    EXPECT_TRUE(filled.is_same(into));
    EXPECT_TRUE(at::equal(into.to(at::kFloat), gathered));
    EXPECT_THROW(group.all_gather_start(mine, at::empty({kWorld, 6})), c10::Error);

    at::Tensor b = at::full({5}, static_cast<double>(r), at::kDouble);  // [5]
    group.broadcast(b, 2);
    EXPECT_TRUE(at::equal(b, at::full({5}, 2.0, at::kDouble)));

    // Every rank leaves a file before the barrier; after it, all files must exist.
    const std::filesystem::path dir(ctx.temp_dir);
    std::ofstream(dir / ("arrived-" + std::to_string(r))) << r;
    group.barrier();
    for (int i = 0; i < kWorld; ++i) {
      EXPECT_TRUE(std::filesystem::exists(dir / ("arrived-" + std::to_string(i)))) << i;
    }
    group.barrier();  // nobody leaves (and the parent cleans up) while others still check
  });
}

}  // namespace
}  // namespace ulysses::comm
