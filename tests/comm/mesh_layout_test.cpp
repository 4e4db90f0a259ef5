// DeviceMesh's pure layout helpers for worlds 1, 2, 4, 8 and every (dp, sp); a world-of-one mesh;
// argument validation; CommError message formatting. No processes are started.
#include <gtest/gtest.h>

#include <set>

#include "comm/errors.h"
#include "comm/mesh.h"
#include "common/error.h"

namespace ulysses::comm {
namespace {

using Groups = std::vector<std::vector<int>>;

// Expects `fn` to throw UserError whose message starts with `prefix`.
template <typename Fn>
void expect_user_error(Fn&& fn, const std::string& prefix) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one starting with " << prefix;
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
  }
}

// Checks that `groups` partition 0..world-1 (every rank exactly once).
void expect_partition(const Groups& groups, int world) {
  std::multiset<int> seen;
  for (const auto& g : groups) seen.insert(g.begin(), g.end());
  ASSERT_EQ(static_cast<int>(seen.size()), world);
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen.count(r), 1u) << "rank " << r;
}

TEST(MeshLayout, ValidShapesAreAllFactorizations) {
  using Shapes = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(DeviceMesh::valid_shapes(1), (Shapes{{1, 1}}));
  EXPECT_EQ(DeviceMesh::valid_shapes(2), (Shapes{{2, 1}, {1, 2}}));
  EXPECT_EQ(DeviceMesh::valid_shapes(4), (Shapes{{4, 1}, {2, 2}, {1, 4}}));
  EXPECT_EQ(DeviceMesh::valid_shapes(8), (Shapes{{8, 1}, {4, 2}, {2, 4}, {1, 8}}));
  EXPECT_EQ(DeviceMesh::valid_shapes(6), (Shapes{{6, 1}, {3, 2}, {2, 3}, {1, 6}}));
}

TEST(MeshLayout, PartitionPropertiesForEveryShapeOfWorlds1To8) {
  for (int world : {1, 2, 4, 8}) {
    for (const auto& [dp, sp] : DeviceMesh::valid_shapes(world)) {
      SCOPED_TRACE("world " + std::to_string(world) + " dp " + std::to_string(dp) + " sp " +
                   std::to_string(sp));
      const Groups sp_groups = DeviceMesh::all_sp_groups(dp, sp);
      const Groups dp_groups = DeviceMesh::all_dp_groups(dp, sp);
      ASSERT_EQ(static_cast<int64_t>(sp_groups.size()), dp);
      ASSERT_EQ(static_cast<int64_t>(dp_groups.size()), sp);
      expect_partition(sp_groups, world);
      expect_partition(dp_groups, world);
      for (int64_t i = 0; i < dp; ++i) {  // SP group i: contiguous, starting at i*sp
        ASSERT_EQ(static_cast<int64_t>(sp_groups[i].size()), sp);
        for (int64_t k = 0; k < sp; ++k) EXPECT_EQ(sp_groups[i][k], i * sp + k);
      }
      for (int64_t j = 0; j < sp; ++j) {  // DP group j: strided by sp, starting at j
        ASSERT_EQ(static_cast<int64_t>(dp_groups[j].size()), dp);
        for (int64_t k = 0; k < dp; ++k) EXPECT_EQ(dp_groups[j][k], j + k * sp);
      }
      for (const auto& s : sp_groups) {  // each SP group meets each DP group in one rank
        for (const auto& d : dp_groups) {
          int common = 0;
          for (int r : s) common += static_cast<int>(std::count(d.begin(), d.end(), r));
          EXPECT_EQ(common, 1);
        }
      }
      for (int r = 0; r < world; ++r) {
        const auto mine_sp = DeviceMesh::sp_group_ranks(r, dp, sp);
        const auto mine_dp = DeviceMesh::dp_group_ranks(r, dp, sp);
        EXPECT_EQ(mine_sp, sp_groups[r / sp]);
        EXPECT_EQ(mine_dp, dp_groups[r % sp]);
        // sp_rank = r % sp and dp_rank = r / sp are the positions in those groups.
        EXPECT_EQ(mine_sp[r % sp], r);
        EXPECT_EQ(mine_dp[r / sp], r);
      }
    }
  }
}

TEST(MeshLayout, ExactGroups) {
  EXPECT_EQ(DeviceMesh::all_sp_groups(1, 1), (Groups{{0}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(1, 1), (Groups{{0}}));
  EXPECT_EQ(DeviceMesh::all_sp_groups(1, 2), (Groups{{0, 1}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(1, 2), (Groups{{0}, {1}}));
  EXPECT_EQ(DeviceMesh::all_sp_groups(2, 1), (Groups{{0}, {1}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(2, 1), (Groups{{0, 1}}));
  EXPECT_EQ(DeviceMesh::all_sp_groups(2, 2), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(2, 2), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(DeviceMesh::all_sp_groups(2, 4), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(2, 4), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(DeviceMesh::all_sp_groups(4, 2), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(4, 2), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(DeviceMesh::all_sp_groups(1, 8), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(DeviceMesh::all_dp_groups(8, 1), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(DeviceMesh::sp_group_ranks(6, 2, 4), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(DeviceMesh::dp_group_ranks(6, 2, 4), (std::vector<int>{2, 6}));
}

TEST(MeshLayout, BadShapesAreUserErrors) {
  expect_user_error([] { DeviceMesh::check_shape(4, 3, 1); }, "mesh: ");
  expect_user_error([] { DeviceMesh::check_shape(4, 0, 4); }, "mesh: ");
  expect_user_error([] { DeviceMesh::check_shape(4, 4, -1); }, "mesh: ");
  EXPECT_NO_THROW(DeviceMesh::check_shape(8, 2, 4));
  EXPECT_THROW(DeviceMesh::sp_group_ranks(4, 2, 2), c10::Error);  // rank outside the world

  DistEnv env;  // world 2, never reaches the rendezvous: arguments are checked first
  env.world_size = 2;
  const config::CommOptions opts;
  const at::Device cpu(at::kCPU);
  expect_user_error([&] { DeviceMesh::create(env, 1, 1, opts, cpu); }, "mesh: ");
  expect_user_error([&] { DeviceMesh::create(env, 2, 2, opts, cpu); }, "mesh: ");
  config::CommOptions bad = opts;
  bad.store = "redis://x";
  expect_user_error([&] { DeviceMesh::create(env, 1, 2, bad, cpu); }, "comm.store: ");
  bad = opts;
  bad.store = "file:";
  expect_user_error([&] { DeviceMesh::create(env, 1, 2, bad, cpu); }, "comm.store: ");
  bad = opts;
  bad.backend = "mpi";
  expect_user_error([&] { DeviceMesh::create(env, 1, 2, bad, cpu); }, "comm.backend: ");
  bad = opts;
  bad.backend = "nccl";
  expect_user_error([&] { DeviceMesh::create(env, 1, 2, bad, cpu); }, "comm.backend: ");
  bad = opts;
  bad.timeout_s = 0;
  expect_user_error([&] { DeviceMesh::create(env, 1, 2, bad, cpu); }, "comm.timeout_s: ");
  bad = opts;
  bad.collective_timeout_s = -1;
  expect_user_error([&] { DeviceMesh::create(env, 1, 2, bad, cpu); }, "comm.collective_timeout_s: ");
}

TEST(MeshLayout, WorldOfOneNeedsNoBackend) {
  DeviceMesh mesh =
      DeviceMesh::create(DistEnv{}, 1, 1, config::CommOptions{}, at::Device(at::kCPU));
  EXPECT_EQ(mesh.world_size(), 1);
  EXPECT_EQ(mesh.backend(), "none");
  EXPECT_EQ(mesh.sp().size(), 1);
  EXPECT_EQ(mesh.dp().size(), 1);
  EXPECT_EQ(mesh.sp().backend_name(), "none");
  EXPECT_NE(mesh.describe().find("dp 1 x sp 1"), std::string::npos) << mesh.describe();

  at::Tensor x = at::arange(6, at::kFloat).reshape({3, 2});  // [3, 2]
  const at::Tensor original = x.clone();
  mesh.world().all_reduce(x, ReduceOp::kMax);
  EXPECT_TRUE(at::equal(x, original));
  mesh.sp().broadcast(x, 0);
  EXPECT_TRUE(at::equal(x, original));
  at::Tensor exchanged = mesh.sp().all_to_all_single(x);  // [3, 2]
  EXPECT_TRUE(at::equal(exchanged, original));
  EXPECT_NE(exchanged.data_ptr(), x.data_ptr());  // a new tensor
  at::Tensor gathered = mesh.dp().all_gather(x);  // [1, 3, 2]
  EXPECT_EQ(gathered.sizes(), (std::vector<int64_t>{1, 3, 2}));
  EXPECT_TRUE(at::equal(gathered[0], original));
  EXPECT_NO_THROW(mesh.world().barrier());
  EXPECT_THROW(mesh.sp().broadcast(x, 1), c10::Error);  // root outside the group
  EXPECT_THROW(mesh.sp().all_to_all_single(x, {2}, {3}), c10::Error);
}

TEST(CommErrorText, ClassifiesBackendMessages) {
  EXPECT_EQ(describe_comm_failure("all_to_all", "sp", 30,
                                  "[gloo/pair.cc:598] Timed out waiting 30000ms for recv"),
            "collective all_to_all on group sp timed out after 30 s (comm.collective_timeout_s; a "
            "peer rank probably died or stopped calling collectives) [[gloo/pair.cc:598] Timed out "
            "waiting 30000ms for recv]");
  EXPECT_EQ(describe_comm_failure("all_reduce", "world", 3,
                                  "Connection closed by peer [127.0.0.1]:4711\nbacktrace..."),
            "collective all_reduce on group world lost its connection to a peer (a peer rank "
            "probably died) [Connection closed by peer [127.0.0.1]:4711]");
  EXPECT_EQ(describe_comm_failure("broadcast", "dp", 1.5, "\n  something odd  \nmore"),
            "collective broadcast on group dp failed [something odd]");
  const std::string long_detail(1000, 'x');
  EXPECT_LT(describe_comm_failure("barrier", "world", 1, long_detail).size(), 400u);
}

}  // namespace
}  // namespace ulysses::comm
