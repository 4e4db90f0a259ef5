// Store, arrival barrier and backend creation (see rendezvous.h). Every use of Gloo types lives in
// this one file: Gloo's headers come from Debian's libgloo-dev (the PyTorch wheel ships none), and
// ProcessGroupGloo holds Gloo objects only through pointers, so its layout does not depend on the
// Gloo revision; the multi-rank tests prove the pairing works.
#include "comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/torch_compat.h"
#if ULYSSES_HAS_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>

#include "comm/errors.h"
#include "common/error.h"

namespace ulysses::comm {
namespace {

constexpr const char* kFileStorePrefix = "file:";

std::chrono::milliseconds to_millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

bool is_loopback(const std::string& addr) {
  return addr == "127.0.0.1" || addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    std::string first(ifname);
    first = first.substr(0, first.find(','));
    return c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  if (env.local_world_size == env.world_size || is_loopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

std::string resolve_backend(const std::string& requested, const at::Device& device) {
  if (requested == "gloo") return "gloo";
  if (requested == "auto") return device.is_cuda() && ULYSSES_HAS_NCCL ? "nccl" : "gloo";
  if (requested == "nccl") {
    if (!device.is_cuda()) throw UserError("comm.backend: nccl needs train.device: cuda");
    if (!ULYSSES_HAS_NCCL) {
      throw UserError("comm.backend: nccl is not available in this LibTorch build (no CUDA/NCCL)");
    }
    return "nccl";
  }
  throw UserError("comm.backend: '" + requested + "' is not one of auto, gloo, nccl");
}

void check_comm_options(const config::CommOptions& opts) {
  if (!(opts.timeout_s > 0.0)) {
    throw UserError("comm.timeout_s: must be > 0, got " + std::to_string(opts.timeout_s));
  }
  const bool file_store = opts.store.rfind(kFileStorePrefix, 0) == 0;
  if (opts.store != "tcp" && !file_store) {
    throw UserError("comm.store: '" + opts.store + "' is neither tcp nor file:PATH");
  }
  if (file_store && opts.store.size() == std::string(kFileStorePrefix).size()) {
    throw UserError("comm.store: 'file:' needs a path, e.g. file:/shared/job.store");
  }
  if (opts.backend != "auto" && opts.backend != "gloo" && opts.backend != "nccl") {
    throw UserError("comm.backend: '" + opts.backend + "' is not one of auto, gloo, nccl");
  }
}

std::chrono::milliseconds rendezvous_timeout(const config::CommOptions& opts) {
  return to_millis(std::max(opts.timeout_s, 60.0));
}

c10::intrusive_ptr<c10d::Store> create_store(const DistEnv& env, const config::CommOptions& opts) {
  const auto timeout = rendezvous_timeout(opts);
  if (opts.store.rfind(kFileStorePrefix, 0) == 0) {
    const std::string path = opts.store.substr(std::string(kFileStorePrefix).size());
    try {
      auto store = c10::make_intrusive<c10d::FileStore>(path, env.world_size);
      store->setTimeout(timeout);
      return store;
    } catch (const std::exception& e) {
      throw CommError("rendezvous: cannot open file store " + path + ": " + exception_text(e));
    }
  }
  c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<std::uint16_t>(env.master_port);
  tcp.isServer = env.rank == 0;
  tcp.numWorkers = static_cast<std::size_t>(env.world_size);
  tcp.waitWorkers = true;
  tcp.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, tcp);
  } catch (const std::exception& e) {
    throw CommError("rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) +
                    " failed (" + std::to_string(env.world_size) + " ranks, rank " +
                    std::to_string(env.rank) + "): " + exception_text(e));
  }
}

void wait_for_all_ranks(c10d::Store& store, const std::string& key, int world_size,
                        std::chrono::milliseconds timeout) {
  const std::string done_key = key + "/all_arrived";
  try {
    if (store.add(key + "/arrived", 1) == world_size) store.set(done_key, std::vector<uint8_t>{1});
    store.wait({done_key}, timeout);
  } catch (const std::exception& e) {
    int64_t arrived = -1;
    try {
      arrived = store.add(key + "/arrived", 0);
    } catch (const std::exception&) {
    }
    throw CommError("rendezvous: only " + std::to_string(arrived) + " of " +
                    std::to_string(world_size) + " ranks arrived within " +
                    std::to_string(timeout.count() / 1000) + " s [" + exception_text(e) + "]");
  }
}

c10::intrusive_ptr<c10d::Backend> create_backend(
    const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    double timeout_s, const DistEnv& env) {
  TORCH_INTERNAL_ASSERT(backend == "gloo" || (backend == "nccl" && ULYSSES_HAS_NCCL), "backend ",
                        backend, " is not available in this build");
  try {
#if ULYSSES_HAS_NCCL
    if (backend == "nccl") {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = to_millis(timeout_s);
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
    }
#endif
    auto options = c10d::ProcessGroupGloo::Options::create(to_millis(timeout_s));
    options->devices.push_back(gloo_device(env));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  } catch (const std::exception& e) {
    throw CommError("rendezvous: connecting " + backend + " rank " + std::to_string(rank) + " of " +
                    std::to_string(size) + " failed [" + exception_text(e) + "]");
  }
}

}  // namespace ulysses::comm
