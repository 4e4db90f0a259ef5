// Store, arrival barrier and backend creation (see rendezvous.h). Every use of Gloo types lives in
// this one file: Gloo's headers come from Debian's libgloo-dev (the PyTorch wheel ships none), and
// ProcessGroupGloo holds Gloo objects only through pointers, so its layout does not depend on the
// Gloo revision; the multi-rank tests prove the pairing works.
#include "comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/torch_compat.h"
#if ULYSSES_HAS_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#ifdef ULYSSES_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

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

// "3", "0.5": seconds as written in a config.
std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

}  // namespace

std::string resolve_backend(const std::string& requested, const at::Device& device) {
  if (requested == "gloo") return "gloo";
  if (requested == "auto") {
    if (!device.is_cuda()) return "gloo";
    if (ULYSSES_HAS_NCCL) return "nccl";
    std::cerr << "warning: comm.backend auto: this LibTorch has no NCCL; using gloo for " << device
              << " tensors (copied through the host)" << std::endl;
    return "gloo";
  }
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
  if (!(opts.collective_timeout_s > 0.0)) {
    throw UserError("comm.collective_timeout_s: must be > 0, got " +
                    std::to_string(opts.collective_timeout_s));
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

void check_local_device(const at::Device& device, int64_t device_count, const DistEnv& env) {
  if (!device.is_cuda()) return;
  const int64_t index = device.has_index() ? device.index() : env.local_rank;
  if (index < device_count) return;
  const std::string count = std::to_string(device_count);
  if (device_count == 0) throw UserError("train.device: cuda, but this node has no CUDA device");
  throw UserError("LOCAL_RANK: " + std::to_string(env.local_rank) + " selects cuda:" +
                  std::to_string(index) + " but this node has " + count +
                  " CUDA device(s); start at most " + count + " ranks per node");
}

void activate_local_device(const at::Device& device, const DistEnv& env) {
  if (!device.is_cuda()) return;
  check_local_device(device, static_cast<int64_t>(at::getNumGPUs()), env);
#ifdef ULYSSES_WITH_CUDA
  c10::cuda::set_device(device.has_index() ? device.index()
                                           : static_cast<c10::DeviceIndex>(env.local_rank));
#endif
}

std::string store_address(const DistEnv& env, const config::CommOptions& opts) {
  if (opts.store.rfind(kFileStorePrefix, 0) == 0) {
    return opts.store.substr(std::string(kFileStorePrefix).size());
  }
  return env.master_addr + ":" + std::to_string(env.master_port);
}

c10::intrusive_ptr<c10d::Store> create_store(const DistEnv& env, const config::CommOptions& opts) {
  const auto timeout = to_millis(opts.timeout_s);
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
  tcp.isServer = env.rank == 0 && !env.agent_store;
  tcp.numWorkers = static_cast<std::size_t>(env.world_size);
  tcp.waitWorkers = false;  // wait_for_all_ranks waits, once, and says for whom
  tcp.timeout = timeout;
  try {
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(env.master_addr, tcp);
    if (!env.agent_store) return store;
    // The agent's store outlives a restart of the ranks: each attempt gets its own keys.
    return c10::make_intrusive<c10d::PrefixStore>(
        "torchelastic/attempt" + std::to_string(env.restart_count), store);
  } catch (const std::exception& e) {
    throw CommError("rendezvous at " + store_address(env, opts) + " failed (" +
                    std::to_string(env.world_size) + " ranks, rank " + std::to_string(env.rank) +
                    (env.agent_store ? ", store served by torchrun's agent" : "") +
                    ", comm.timeout_s = " + seconds_text(opts.timeout_s) +
                    " s): " + exception_text(e));
  }
}

void wait_for_all_ranks(c10d::Store& store, const std::string& key, int world_size,
                        double timeout_s, const std::string& where) {
  using Clock = std::chrono::steady_clock;
  const std::string arrived_key = key + "/arrived";
  const std::string done_key = key + "/all_arrived";
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + to_millis(timeout_s);
  Clock::time_point next_report = start + std::chrono::seconds(1);
  int64_t arrived = -1;
  try {
    arrived = store.add(arrived_key, 1);
    if (arrived == world_size) store.set(done_key, std::vector<uint8_t>{1});
    while (!store.check({done_key})) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        arrived = store.add(arrived_key, 0);
        throw CommError("rendezvous at " + where + ": only " + std::to_string(arrived) + " of " +
                        std::to_string(world_size) + " ranks arrived within comm.timeout_s = " +
                        seconds_text(timeout_s) + " s (a rank did not start, or crashed)");
      }
      if (now >= next_report) {
        arrived = store.add(arrived_key, 0);
        std::cerr << "rendezvous: waiting for " << world_size - arrived << " of " << world_size
                  << " ranks at " << where << std::endl;
        next_report = now + std::chrono::seconds(10);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {  // the store itself failed (server gone, timeout)
    throw CommError("rendezvous at " + where + ": " + std::to_string(arrived) + " of " +
                    std::to_string(world_size) + " ranks arrived, then the store failed [" +
                    exception_text(e) + "]");
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
