// The dp x sp device mesh of a job: the world group plus this rank's sequence-parallel (SP) and
// data-parallel (DP) groups, set up by one rendezvous. SP groups are contiguous ranks
// [i*sp, (i+1)*sp); DP groups are strided {j, j+sp, j+2*sp, ...}. With ring attention
// (sp = sp_a2a x sp_ring) each SP group splits further: its all-to-all groups are contiguous runs
// of sp_a2a ranks, its ring groups the ranks sp_a2a apart.
//
//   world 8, dp 2 x sp 4:   sp groups {0,1,2,3} {4,5,6,7}    dp groups {0,4} {1,5} {2,6} {3,7}
//   ... with sp_ring 2:     a2a groups {0,1} {2,3} {4,5} {6,7}  ring groups {0,2} {1,3} {4,6} {5,7}
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/dist_env.h"
#include "comm/group.h"
#include "config/options.h"

namespace ulysses::comm {

// Owns the store and the backends of its groups. Move-only; the Group objects keep their
// addresses for the mesh's lifetime (moving the mesh does not move them), so callers may keep
// Group& / Group* (e.g. in autograd contexts) while the mesh lives. When a job ends normally every
// rank calls finish() (the final barrier, then the backends shut down) before the mesh is
// destroyed; a mesh destroyed without finish() (a rank failing) aborts its backends without
// waiting for the others.
//
// Invariants: world().size() == dp_size() * sp_size(); sp().global_ranks() ==
// sp_group_ranks(rank()); dp().global_ranks() == dp_group_ranks(rank()).
class DeviceMesh {
 public:
  // Rendezvous with all env.world_size ranks and build the groups. Store: opts.store ("tcp" =
  // TCPStore at env.master_addr:master_port served by rank 0, or "file:PATH"); backend:
  // opts.backend (auto = gloo for CPU `device`, nccl for CUDA); collective timeout
  // opts.collective_timeout_s.
  // A world of 1 needs no store and no backend. Collective calls must come in the same order on
  // every rank, and so must calls to create() within one job (each gets its own store keys).
  // A CUDA `device` must be one of this node's devices and becomes the current device.
  // While ranks are missing, prints "rendezvous: waiting for N of M ranks at ADDR:PORT" (stderr).
  // Throws UserError("mesh: ...") when dp < 1, sp < 1 or dp * sp != env.world_size;
  // UserError("comm.<field>: ...") for bad options; UserError naming LOCAL_RANK when a CUDA
  // device is not on this node; CommError when the peers cannot be reached within
  // opts.timeout_s (the configured value, waited for once).
  // `sp_ring` (the resolved mesh.sp_ring) must divide sp; it adds the a2a and ring subgroups.
  static DeviceMesh create(const DistEnv& env, int64_t dp, int64_t sp,
                           const config::CommOptions& opts, const at::Device& device,
                           int64_t sp_ring = 1);

  // create() for tests: a single-node world of `world` ranks over a FileStore at `store_path`,
  // Gloo by default on CPU; `timeout_s` is both the rendezvous and the collective timeout.
  static DeviceMesh create_for_test(int rank, int world, const std::string& store_path, int64_t dp,
                                    int64_t sp, double timeout_s = 60.0,
                                    const at::Device& device = at::Device(at::kCPU),
                                    int64_t sp_ring = 1);

  DeviceMesh(DeviceMesh&&) noexcept;
  DeviceMesh& operator=(DeviceMesh&&) noexcept;
  ~DeviceMesh();

  // The final barrier over the world, then every backend shuts down (NCCL communicators are
  // destroyed); collectives may no longer be called. Call it on every rank once the job is done.
  // Idempotent; nothing to do for a world of 1. Throws CommError when a peer does not arrive
  // within the collective timeout.
  void finish();

  Group& world() { return *world_; }
  Group& sp() { return *sp_; }
  Group& dp() { return *dp_; }
  // The all-to-all part of the SP group (sp() itself without a ring) and the ring part (a group
  // of one without a ring).
  Group& sp_a2a() { return sp_a2a_ ? *sp_a2a_ : *sp_; }
  Group& sp_ring() { return *sp_ring_; }
  int64_t sp_ring_size() const { return sp_ring_size_; }

  int rank() const { return rank_; }
  // The ranks of this job on this process's node (DistEnv::local_world_size: the launcher's).
  int local_world_size() const { return local_world_size_; }
  int world_size() const { return static_cast<int>(dp_size_ * sp_size_); }
  int sp_rank() const { return rank_ % static_cast<int>(sp_size_); }
  int dp_rank() const { return rank_ / static_cast<int>(sp_size_); }
  int64_t sp_size() const { return sp_size_; }
  int64_t dp_size() const { return dp_size_; }
  const at::Device& device() const { return device_; }
  const std::string& backend() const { return backend_; }  // gloo | nccl | none (world of 1)

  // Three lines: the world and its dp x sp shape, backend and device, then this rank's SP and DP
  // groups with their global ranks and this rank's index in each, e.g.
  //   mesh: world 4 = dp 2 x sp 2 (backend gloo, device cpu)
  //     rank 3 sp group 1: ranks [2, 3], sp_rank 1 of 2
  //     rank 3 dp group 1: ranks [1, 3], dp_rank 1 of 2
  std::string describe() const;

  // --- Pure layout helpers (no processes needed) -------------------------------------------
  // Throws UserError("mesh: ...") unless dp >= 1, sp >= 1 and dp * sp == world.
  static void check_shape(int world, int64_t dp, int64_t sp);
  // The SP group holding `rank`: {i*sp, ..., i*sp + sp-1} with i = rank / sp.
  // REQUIRES: check_shape(dp*sp, dp, sp) passes, 0 <= rank < dp*sp (TORCH_CHECK).
  static std::vector<int> sp_group_ranks(int rank, int64_t dp, int64_t sp);
  // The DP group holding `rank`: {j, j+sp, ..., j+(dp-1)*sp} with j = rank % sp. REQUIRES as above.
  static std::vector<int> dp_group_ranks(int rank, int64_t dp, int64_t sp);
  // All dp SP groups, in order of their first rank; together a partition of 0..dp*sp-1.
  static std::vector<std::vector<int>> all_sp_groups(int64_t dp, int64_t sp);
  // All sp DP groups, in order of their first rank; together a partition of 0..dp*sp-1.
  static std::vector<std::vector<int>> all_dp_groups(int64_t dp, int64_t sp);
  // Every (dp, sp) with dp * sp == world, in increasing sp. REQUIRES: world >= 1.
  static std::vector<std::pair<int64_t, int64_t>> valid_shapes(int world);

 private:
  DeviceMesh() = default;
  // shutdown() (graceful) or abort() on each distinct backend, unless finished; never throws.
  void stop_backends(bool graceful) noexcept;

  c10::intrusive_ptr<c10d::Store> store_;  // declared first: destroyed after the groups
  std::unique_ptr<Group> world_;
  std::unique_ptr<Group> sp_;
  std::unique_ptr<Group> dp_;
  std::unique_ptr<Group> sp_a2a_;   // null without a ring (sp_a2a() is sp())
  std::unique_ptr<Group> sp_ring_;  // size sp_ring_size_
  int rank_ = 0;
  int local_world_size_ = 1;
  int64_t sp_ring_size_ = 1;
  int64_t dp_size_ = 1;
  int64_t sp_size_ = 1;
  at::Device device_ = at::Device(at::kCPU);
  std::string backend_ = "none";
  bool finished_ = false;  // finish() ran: backends are shut down
};

}  // namespace ulysses::comm
