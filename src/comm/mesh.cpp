// DeviceMesh construction: one store, one arrival barrier, then the world, SP and DP backends
// (see mesh.h).
#include "comm/mesh.h"

#include <atomic>
#include <iostream>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/errors.h"
#include "comm/rendezvous.h"
#include "common/error.h"

namespace ulysses::comm {
namespace {

// Numbers the meshes a process creates so that each gets its own keys in a shared store; every
// rank creates its meshes in the same order, so the numbers agree across ranks.
std::atomic<int> g_meshes_created{0};

std::string join(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

int index_of(const std::vector<int>& ranks, int rank) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank) return static_cast<int>(i);
  }
  TORCH_INTERNAL_ASSERT(false, "rank ", rank, " is not in its own group");
}

// Everything a subgroup needs from the mesh under construction.
struct GroupFactory {
  const DistEnv& env;
  const c10::intrusive_ptr<c10d::Store>& store;
  const std::string& key_prefix;  // "ulysses/mesh<k>"
  const std::string& backend;
  const at::Device& device;
  double timeout_s;
  c10::intrusive_ptr<c10d::Backend> world_backend;  // set once the world exists

  std::unique_ptr<Group> make(const std::string& name, int index, const std::vector<int>& ranks) {
    const int rank = index_of(ranks, env.rank);
    if (ranks.size() == 1) return std::make_unique<Group>(Group::single(name, env.rank, device));
    if (world_backend && static_cast<int>(ranks.size()) == env.world_size) {
      return std::make_unique<Group>(name, ranks, rank, world_backend, device, timeout_s);
    }
    auto group_store = c10::make_intrusive<c10d::PrefixStore>(
        key_prefix + "/" + name + "/" + std::to_string(index), store);
    auto group_backend =
        create_backend(backend, group_store, rank, static_cast<int>(ranks.size()), timeout_s, env);
    return std::make_unique<Group>(name, ranks, rank, std::move(group_backend), device, timeout_s);
  }
};

}  // namespace

DeviceMesh::DeviceMesh(DeviceMesh&&) noexcept = default;
DeviceMesh& DeviceMesh::operator=(DeviceMesh&& other) noexcept {
  if (this != &other) {
    stop_backends(/*graceful=*/false);
    store_ = std::move(other.store_);
    world_ = std::move(other.world_);
    sp_ = std::move(other.sp_);
    dp_ = std::move(other.dp_);
    sp_a2a_ = std::move(other.sp_a2a_);
    sp_ring_ = std::move(other.sp_ring_);
    sp_ring_size_ = other.sp_ring_size_;
    rank_ = other.rank_;
    dp_size_ = other.dp_size_;
    sp_size_ = other.sp_size_;
    device_ = other.device_;
    backend_ = std::move(other.backend_);
    finished_ = other.finished_;
  }
  return *this;
}

DeviceMesh::~DeviceMesh() { stop_backends(/*graceful=*/false); }

void DeviceMesh::finish() {
  if (finished_ || !world_) return;
  world_->barrier();  // every rank is done with the store and the backends
  stop_backends(/*graceful=*/true);
  finished_ = true;
}

void DeviceMesh::stop_backends(bool graceful) noexcept {
  if (finished_ || !world_) return;
  for (Group* group : {world_.get(), sp_.get(), dp_.get(), sp_a2a_.get(), sp_ring_.get()}) {
    if (group == nullptr || !group->backend_handle()) continue;
    if (group != world_.get() && group->backend_handle() == world_->backend_handle()) continue;
    try {  // NCCL: destroys (or, when a rank is failing, aborts) its communicators
      if (graceful) {
        group->backend_handle()->shutdown();
      } else {
        group->backend_handle()->abort();
      }
    } catch (const std::exception& e) {
      std::cerr << "warning: mesh: stopping the " << group->name() << " group's "
                << group->backend_name() << " backend failed: " << exception_text(e) << std::endl;
    }
  }
}

DeviceMesh DeviceMesh::create(const DistEnv& env, int64_t dp, int64_t sp,
                              const config::CommOptions& opts, const at::Device& device,
                              int64_t sp_ring) {
  check_shape(env.world_size, dp, sp);
  if (sp_ring < 1 || sp % sp_ring != 0) {
    throw UserError("mesh.sp_ring: " + std::to_string(sp_ring) + " does not divide mesh.sp " +
                    std::to_string(sp));
  }
  check_comm_options(opts);
  activate_local_device(device, env);
  const std::string backend = resolve_backend(opts.backend, device);

  DeviceMesh mesh;
  mesh.rank_ = env.rank;
  mesh.local_world_size_ = env.local_world_size;
  mesh.dp_size_ = dp;
  mesh.sp_size_ = sp;
  mesh.device_ = device;
  mesh.sp_ring_size_ = sp_ring;
  if (env.world_size == 1) {
    mesh.world_ = std::make_unique<Group>(Group::single("world", 0, device));
    mesh.sp_ = std::make_unique<Group>(Group::single("sp", 0, device));
    mesh.dp_ = std::make_unique<Group>(Group::single("dp", 0, device));
    mesh.sp_ring_ = std::make_unique<Group>(Group::single("sp_ring", 0, device));
    return mesh;
  }
  mesh.backend_ = backend;
  mesh.store_ = create_store(env, opts);
  const std::string key_prefix = "ulysses/mesh" + std::to_string(g_meshes_created++);
  wait_for_all_ranks(*mesh.store_, key_prefix, env.world_size, opts.timeout_s,
                     store_address(env, opts));

  GroupFactory factory{env, mesh.store_, key_prefix, backend, device, opts.collective_timeout_s,
                       {}};
  std::vector<int> everyone;
  for (int r = 0; r < env.world_size; ++r) everyone.push_back(r);
  mesh.world_ = factory.make("world", 0, everyone);
  factory.world_backend = mesh.world_->backend_handle();
  mesh.sp_ = factory.make("sp", env.rank / static_cast<int>(sp), sp_group_ranks(env.rank, dp, sp));
  mesh.dp_ = factory.make("dp", env.rank % static_cast<int>(sp), dp_group_ranks(env.rank, dp, sp));
  const int a2a = static_cast<int>(sp / sp_ring);
  const int sp_base = env.rank / static_cast<int>(sp) * static_cast<int>(sp);
  if (sp_ring > 1) {
    std::vector<int> a2a_ranks, ring_ranks;
    const int a2a_base = env.rank / a2a * a2a;
    for (int a = 0; a < a2a; ++a) a2a_ranks.push_back(a2a_base + a);
    for (int j = 0; j < sp_ring; ++j) ring_ranks.push_back(sp_base + env.rank % a2a + j * a2a);
    mesh.sp_a2a_ = factory.make("sp_a2a", env.rank / a2a, a2a_ranks);
    mesh.sp_ring_ = factory.make("sp_ring", sp_base + env.rank % a2a, ring_ranks);
  } else {
    mesh.sp_ring_ = std::make_unique<Group>(Group::single("sp_ring", env.rank, device));
  }
  return mesh;
}

DeviceMesh DeviceMesh::create_for_test(int rank, int world, const std::string& store_path,
                                       int64_t dp, int64_t sp, double timeout_s,
                                       const at::Device& device, int64_t sp_ring) {
  DistEnv env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  env.source = "test";
  config::CommOptions opts;
  opts.timeout_s = timeout_s;
  opts.collective_timeout_s = timeout_s;
  opts.store = "file:" + store_path;
  return create(env, dp, sp, opts, device, sp_ring);
}

std::string DeviceMesh::describe() const {
  std::ostringstream out;
  out << "mesh: world " << world_size() << " = dp " << dp_size_ << " x sp " << sp_size_
      << " (backend " << backend_ << ", device " << device_ << ")\n";
  out << "  rank " << rank_ << " sp group " << rank_ / sp_size_ << ": ranks ["
      << join(sp_->global_ranks()) << "], sp_rank " << sp_rank() << " of " << sp_size_ << "\n";
  out << "  rank " << rank_ << " dp group " << rank_ % sp_size_ << ": ranks ["
      << join(dp_->global_ranks()) << "], dp_rank " << dp_rank() << " of " << dp_size_ << "\n";
  if (sp_ring_size_ > 1) {
    const Group& a2a = sp_a2a_ ? *sp_a2a_ : *sp_;
    out << "  rank " << rank_ << " sp = a2a " << a2a.size() << " x ring " << sp_ring_size_
        << ": a2a ranks [" << join(a2a.global_ranks()) << "], ring ranks ["
        << join(sp_ring_->global_ranks()) << "]\n";
  }
  return out.str();
}

}  // namespace ulysses::comm
