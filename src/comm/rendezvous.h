// How the ranks of a job find each other: the shared c10d store (TCPStore served by rank 0, or a
// FileStore on a shared path), a store-based arrival barrier, and the collective backends (Gloo,
// NCCL) created over it. DeviceMesh is the only intended caller.
#pragma once
#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/dist_env.h"
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include "config/options.h"

namespace ulysses::comm {

// "gloo" or "nccl" for comm.backend `requested` (auto | gloo | nccl) on `device`: auto is nccl
// for CUDA devices when this LibTorch has NCCL, else gloo.
// Throws UserError("comm.backend: ...") for an unknown name, nccl on a CPU device, or nccl in a
// build without NCCL.
std::string resolve_backend(const std::string& requested, const at::Device& device);

// Throws UserError("comm.<field>: ...") when `opts` is malformed: timeout_s <= 0, a store that is
// neither "tcp" nor "file:PATH" (non-empty PATH), an unknown backend.
void check_comm_options(const config::CommOptions& opts);

// How long rank startup may take: max(opts.timeout_s, 60 s). Used for the store, not for
// collectives.
std::chrono::milliseconds rendezvous_timeout(const config::CommOptions& opts);

// The store shared by every group of a world: opts.store "tcp" = c10d::TCPStore at
// env.master_addr:env.master_port (rank 0 is the server and waits for all ranks to connect),
// "file:PATH" = c10d::FileStore(PATH). Store operations time out after rendezvous_timeout(opts).
// Throws CommError when the store cannot be set up in time (e.g. the master is unreachable or the
// port is taken). REQUIRES: env.world_size >= 2, check_comm_options(opts) passed.
c10::intrusive_ptr<c10d::Store> create_store(const DistEnv& env, const config::CommOptions& opts);

// Returns when all `world_size` ranks have called it with the same `key` (a counter in `store`).
// Throws CommError after `timeout` naming how many ranks are missing.
void wait_for_all_ranks(c10d::Store& store, const std::string& key, int world_size,
                        std::chrono::milliseconds timeout);

// A collective backend of `backend` ("gloo" | "nccl") for group rank `rank` of `size` ranks, whose
// rendezvous keys live in `store` (give each group its own c10d::PrefixStore). Collectives time
// out after timeout_s. Gloo binds to 127.0.0.1 on a single node, to $GLOO_SOCKET_IFNAME when set,
// else to the address of this host's name. Blocks until all `size` ranks created theirs (Gloo).
// Throws CommError when the peers cannot be reached in time.
c10::intrusive_ptr<c10d::Backend> create_backend(
    const std::string& backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    double timeout_s, const DistEnv& env);

}  // namespace ulysses::comm
