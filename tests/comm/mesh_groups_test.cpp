// A 2 x 2 mesh on 4 real Gloo ranks: collectives on the SP and DP subgroups reach exactly the
// expected members; a 1 x 2 mesh rendezvous over TCPStore.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/mesh.h"
#include "support/multi_rank.h"

namespace ulysses::comm {
namespace {

using testing::RankContext;
using testing::run_ranks;

// A TCP port that was free a moment ago (bound to port 0, then released).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

at::Tensor scalar(double v) { return at::tensor({v}, at::kDouble); }  // [1]

TEST(MeshGroups, TwoByTwoSubgroupCollectives) {
  run_ranks(4, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 2, 2);
    const int r = ctx.rank;
    // Independent expectations: SP group {2*(r/2), 2*(r/2)+1}, DP group {r%2, r%2+2}.
    const int sp_first = 2 * (r / 2);
    const int dp_first = r % 2;
    EXPECT_EQ(mesh.rank(), r);
    EXPECT_EQ(mesh.sp_size(), 2);
    EXPECT_EQ(mesh.dp_size(), 2);
    EXPECT_EQ(mesh.sp_rank(), r - sp_first);
    EXPECT_EQ(mesh.dp_rank(), r / 2);
    EXPECT_EQ(mesh.sp().global_ranks(), (std::vector<int>{sp_first, sp_first + 1}));
    EXPECT_EQ(mesh.dp().global_ranks(), (std::vector<int>{dp_first, dp_first + 2}));
    EXPECT_EQ(mesh.sp().rank(), mesh.sp_rank());
    EXPECT_EQ(mesh.dp().rank(), mesh.dp_rank());
    EXPECT_EQ(mesh.world().size(), 4);
    EXPECT_EQ(mesh.sp().backend_name(), "gloo");
    const std::string text = mesh.describe();
    EXPECT_NE(text.find("world 4 = dp 2 x sp 2"), std::string::npos) << text;
    EXPECT_NE(text.find("sp group " + std::to_string(r / 2) + ": ranks [" +
                        std::to_string(sp_first) + ", " + std::to_string(sp_first + 1) + "]"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("dp group " + std::to_string(r % 2) + ": ranks [" +
                        std::to_string(dp_first) + ", " + std::to_string(dp_first + 2) + "]"),
              std::string::npos)
        << text;

    at::Tensor t = scalar(r);
    mesh.sp().all_reduce(t);
    EXPECT_EQ(t.item<double>(), sp_first + (sp_first + 1));
    t = scalar(r);
    mesh.dp().all_reduce(t);
    EXPECT_EQ(t.item<double>(), dp_first + (dp_first + 2));
    t = scalar(r);
    mesh.sp().all_reduce(t, ReduceOp::kMax);
    EXPECT_EQ(t.item<double>(), sp_first + 1);
    t = scalar(r);
    mesh.dp().all_reduce(t, ReduceOp::kMin);
    EXPECT_EQ(t.item<double>(), dp_first);
    t = scalar(r);
    mesh.world().all_reduce(t);
    EXPECT_EQ(t.item<double>(), 0 + 1 + 2 + 3);

    at::Tensor gathered = mesh.dp().all_gather(scalar(r));  // [2, 1]
    EXPECT_TRUE(at::equal(
        gathered,
        at::tensor({double(dp_first), double(dp_first + 2)}, at::kDouble).reshape({2, 1})));
    t = scalar(r);
    mesh.sp().broadcast(t, 1);  // group rank 1 = global sp_first + 1
    EXPECT_EQ(t.item<double>(), sp_first + 1);

    // SP all-to-all: row i goes to SP member i; row i received comes from member i.
    at::Tensor rows = at::tensor({r * 10.0, r * 10.0 + 1}, at::kDouble);  // [2]
    at::Tensor got = mesh.sp().all_to_all_single(rows);                   // [2]
    const int me = r - sp_first;
    EXPECT_TRUE(
        at::equal(got, at::tensor({sp_first * 10.0 + me, (sp_first + 1) * 10.0 + me}, at::kDouble)))
        << got;
    mesh.world().barrier();
  });
}

// The mesh carries the launcher's local world size (what the host threads are shared by): one
// rank per node over a world of 2 (as SLURM with one task per node gives) says 1; the test
// harness's single-node world says 2.
TEST(MeshGroups, LocalWorldSizeIsTheLaunchers) {
  run_ranks(2, [](const RankContext& ctx) {
    DistEnv env;
    env.rank = ctx.rank;
    env.world_size = 2;
    env.local_rank = 0;
    env.local_world_size = 1;
    env.source = "slurm";
    config::CommOptions opts;
    opts.timeout_s = 30;
    opts.store = "file:" + ctx.store_path + "-one-per-node";
    DeviceMesh spread = DeviceMesh::create(env, 2, 1, opts, at::Device(at::kCPU));
    EXPECT_EQ(spread.local_world_size(), 1);
    EXPECT_EQ(spread.world_size(), 2);
    DeviceMesh one_node = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 2, 1);
    EXPECT_EQ(one_node.local_world_size(), 2);
    spread.world().barrier();
  });
}

TEST(MeshGroups, TcpStoreRendezvous) {
  run_ranks(2, [](const RankContext& ctx) {
    // Rank 0 picks a free port and tells rank 1 through a file.
    const std::filesystem::path port_file = std::filesystem::path(ctx.temp_dir) / "port";
    int port = -1;
    if (ctx.rank == 0) {
      port = free_port();
      ASSERT_GT(port, 0);
      std::ofstream(port_file.string() + ".tmp") << port;
      std::filesystem::rename(port_file.string() + ".tmp", port_file);
    } else {
      for (int tries = 0; tries < 6000 && !std::filesystem::exists(port_file); ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::ifstream(port_file) >> port;
      ASSERT_GT(port, 0);
    }
    DistEnv env;
    env.rank = ctx.rank;
    env.world_size = 2;
    env.local_rank = ctx.rank;
    env.local_world_size = 2;
    env.master_port = port;
    config::CommOptions opts;
    opts.timeout_s = 30;
    DeviceMesh mesh = DeviceMesh::create(env, 1, 2, opts, at::Device(at::kCPU));
    at::Tensor t = scalar(ctx.rank + 1);
    mesh.sp().all_reduce(t);
    EXPECT_EQ(t.item<double>(), 3.0);
    mesh.world().barrier();
  });
}

}  // namespace
}  // namespace ulysses::comm
