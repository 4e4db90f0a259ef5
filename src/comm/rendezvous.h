// How the ranks of a job find each other: the shared c10d store (TCPStore served by rank 0, or a
// FileStore on a shared path), a store-based arrival barrier, and the collective backends (Gloo,
// NCCL) created over it. DeviceMesh is the only intended caller.
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/dist_env.h"
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include "config/options.h"

namespace ulysses::comm {

// "gloo" or "nccl" for comm.backend `requested` (auto | gloo | nccl) on `device`: auto is nccl
// for CUDA devices when this LibTorch has NCCL, else gloo (for a CUDA device, with a one-line
// warning on stderr: Gloo moves CUDA tensors through the host).
// Throws UserError("comm.backend: ...") for an unknown name, nccl on a CPU device, or nccl in a
// build without NCCL.
std::string resolve_backend(const std::string& requested, const at::Device& device);

// Throws UserError("comm.<field>: ...") when `opts` is malformed: timeout_s <= 0, a store that is
// neither "tcp" nor "file:PATH" (non-empty PATH), an unknown backend.
void check_comm_options(const config::CommOptions& opts);

// Throws UserError naming LOCAL_RANK (or train.device) when a CUDA `device` is not one of the
// `device_count` devices of this node; a CPU device always passes. Pure.
void check_local_device(const at::Device& device, int64_t device_count, const DistEnv& env);

// check_local_device against this node's CUDA devices, then makes a CUDA `device` the current
// device of this thread (what NCCL and the caching allocator use). No-op for CPU.
void activate_local_device(const at::Device& device, const DistEnv& env);

// Where the ranks meet, for messages: "ADDR:PORT" for the TCP store, the path for a file store.
std::string store_address(const DistEnv& env, const config::CommOptions& opts);

// The store shared by every group of a world: opts.store "tcp" = c10d::TCPStore at
// env.master_addr:env.master_port (rank 0 serves it, or, with env.agent_store, torchrun's agent
// does and every rank is a client; then the keys live under "torchelastic/attempt<N>/"),
// "file:PATH" = c10d::FileStore(PATH). Returns without waiting for the other ranks (see
// wait_for_all_ranks). Store operations time out after opts.timeout_s.
// Throws CommError when the store cannot be set up in time (e.g. the master is unreachable or the
// port is taken). REQUIRES: env.world_size >= 2, check_comm_options(opts) passed.
c10::intrusive_ptr<c10d::Store> create_store(const DistEnv& env, const config::CommOptions& opts);

// Returns when all `world_size` ranks have called it with the same `key` (a counter in `store`).
// While ranks are missing, prints "rendezvous: waiting for N of M ranks at WHERE" to stderr after
// 1 s and then every 10 s. Throws CommError after `timeout_s` (once, no minimum): "rendezvous at
// WHERE: only K of M ranks arrived within comm.timeout_s = T s ...".
void wait_for_all_ranks(c10d::Store& store, const std::string& key, int world_size,
                        double timeout_s, const std::string& where);

// A collective backend of `backend` ("gloo" | "nccl") for group rank `rank` of `size` ranks, whose
// rendezvous keys live in `store` (give each group its own c10d::PrefixStore). Collectives time
// out after timeout_s. Gloo binds to 127.0.0.1 on a single node, to $GLOO_SOCKET_IFNAME when set,
// else to the address of this host's name. Blocks until all `size` ranks created theirs (Gloo).
// Throws CommError when the peers cannot be reached in time.
c10::intrusive_ptr<c10d::Backend> create_backend(
    const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    double timeout_s, const DistEnv& env);

}  // namespace ulysses::comm
