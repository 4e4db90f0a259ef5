// Who owns which device: a Group moves tensors to its device for a collective (to_wire) and knows
// that device; the mesh checks a CUDA device against the node and warns when `auto` falls back to
// Gloo for CUDA; finish() is the final barrier. Pure checks plus 2 real Gloo ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/group.h"
#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "common/error.h"
#include "common/torch_compat.h"
#include "support/multi_rank.h"

namespace ulysses::comm {
namespace {

using testing::RankContext;
using testing::run_ranks;

TEST(DeviceRule, ToWireMovesToTheGroupDevice) {
  const at::Tensor cpu_count = at::tensor({7.0}, at::kDouble);  // [1], as gradient_step makes
  // A group on another device gets a copy there (meta stands in for CUDA on this machine).
  const at::Tensor moved = to_wire(cpu_count, at::Device(at::kMeta), /*is_gloo=*/false);
  EXPECT_EQ(moved.device(), at::Device(at::kMeta));
  EXPECT_EQ(moved.scalar_type(), at::kDouble);
  // On the group's own device, contiguous: the caller's tensor itself (reduced in place).
  EXPECT_TRUE(to_wire(cpu_count, at::Device(at::kCPU), false).is_same(cpu_count));
  // Non-contiguous: a contiguous copy on the device.
  const at::Tensor strided = at::ones({4, 4}).t();  // [4, 4]
  EXPECT_TRUE(to_wire(strided, at::Device(at::kCPU), false).is_contiguous());
  // bfloat16 over Gloo travels as float32.
  EXPECT_EQ(to_wire(at::ones({2}, at::kBFloat16), at::Device(at::kCPU), true).scalar_type(),
            at::kFloat);
}

TEST(DeviceRule, GroupsKnowTheirDevice) {
  EXPECT_EQ(Group::single("sp", 0, at::Device(at::kCUDA, 1)).device(), at::Device(at::kCUDA, 1));
  DeviceMesh mesh = DeviceMesh::create(DistEnv{}, 1, 1, config::CommOptions{}, at::Device(at::kCPU));
  EXPECT_EQ(mesh.world().device(), at::Device(at::kCPU));
  run_ranks(2, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, 2, 30);
    for (Group* group : {&mesh.world(), &mesh.sp(), &mesh.dp()}) {
      EXPECT_EQ(group->device(), at::Device(at::kCPU)) << group->name();
    }
    // A CPU scalar on a CPU group: reduced in place, as before.
    at::Tensor count = at::tensor({static_cast<double>(ctx.rank + 1)}, at::kDouble);  // [1]
    mesh.world().all_reduce(count);
    EXPECT_EQ(count.item<double>(), 3.0);
    mesh.finish();
  });
}

TEST(DeviceRule, CudaDeviceMustBeOnThisNode) {
  DistEnv env;
  env.world_size = 4;
  env.local_world_size = 4;
  env.rank = env.local_rank = 2;
  EXPECT_NO_THROW(check_local_device(at::Device(at::kCPU), 0, env));
  EXPECT_NO_THROW(check_local_device(at::Device(at::kCUDA, 2), 4, env));
  try {
    check_local_device(at::Device(at::kCUDA, 2), 2, env);
    ADD_FAILURE() << "cuda:2 accepted on a node with 2 devices";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "LOCAL_RANK: 2 selects cuda:2 but this node has 2 CUDA device(s); start at most 2 "
              "ranks per node");
  }
  EXPECT_THROW(check_local_device(at::Device(at::kCUDA, 0), 0, env), UserError);
  if (!compat::kHasCuda) {  // no CUDA here: the mesh refuses a CUDA device before any rendezvous
    EXPECT_THROW(DeviceMesh::create(DistEnv{}, 1, 1, config::CommOptions{},
                                    at::Device(at::kCUDA, 0)),
                 UserError);
  }
}

TEST(DeviceRule, AutoWithoutNcclWarnsForCuda) {
  ::testing::internal::CaptureStderr();
  const std::string cpu_backend = resolve_backend("auto", at::Device(at::kCPU));
  const std::string cuda_backend = resolve_backend("auto", at::Device(at::kCUDA, 0));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cpu_backend, "gloo");
  if (ULYSSES_HAS_NCCL) {
    EXPECT_EQ(cuda_backend, "nccl");
    EXPECT_EQ(err, "");
  } else {
    EXPECT_EQ(cuda_backend, "gloo");
    EXPECT_EQ(err,
              "warning: comm.backend auto: this LibTorch has no NCCL; using gloo for cuda:0 "
              "tensors (copied through the host)\n");
  }
}

// finish() is a barrier: rank 0's finish() cannot return before rank 1 has entered its own, which
// rank 1 does only after writing a marker (after a pause that rank 0 would otherwise overtake).
TEST(DeviceRule, FinishIsTheFinalBarrier) {
  run_ranks(2, [](const RankContext& ctx) {
    DeviceMesh mesh = DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, 2, 60);
    const std::filesystem::path marker = std::filesystem::path(ctx.temp_dir) / "rank1-finishing";
    if (ctx.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      std::ofstream(marker) << "1";
    }
    mesh.finish();
    if (ctx.rank == 0) {
      EXPECT_TRUE(std::filesystem::exists(marker));
    }
    EXPECT_NO_THROW(mesh.finish());  // idempotent
  });
}

}  // namespace
}  // namespace ulysses::comm
