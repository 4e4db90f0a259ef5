// A process group over a subset of the job's ranks, with the few blocking collectives the
// training stack needs: all_reduce, all_to_all_single, all_gather, reduce_scatter,
// broadcast, barrier; and all_gather in two halves (start, wait) for ZeRO-3's prefetch.
// Backed by c10d ProcessGroupGloo (CPU tensors; CUDA tensors work too) or ProcessGroupNCCL (CUDA).
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace ulysses::comm {

enum class ReduceOp { kSum, kMax, kMin };

// Every collective must be called by all members of the group, in the same order, with tensors
// of the same dtype (and shapes as each call states).
// Device rule: the group owns its device (device()); a tensor elsewhere (e.g. a CPU scalar on a
// CUDA/NCCL group) is copied there for the collective and the result comes back on the caller's
// device (in place for all_reduce / broadcast), so ProcessGroupNCCL never sees a CPU tensor. Collectives block until the
// result can be used: on CPU the data is in place when they return; on CUDA with NCCL the
// caller's current stream is ordered after the collective (the host does not wait).
// Failures while the collective runs (peer died, connection lost, timeout after the group's
// timeout) throw CommError with a one-line message naming the collective and the group.
// With NCCL the host does not wait, so a hung collective is caught by ProcessGroupNCCL's watchdog
// after the timeout, which aborts the process (TORCH_NCCL_ASYNC_ERROR_HANDLING, the default);
// set TORCH_NCCL_BLOCKING_WAIT=1 to have the host wait and get CommError instead.
// Invalid arguments (splits not matching shapes, root out of range) trip TORCH_CHECK.
//
// A group of size 1 has no backend: all_reduce and broadcast leave the tensor unchanged,
// all_to_all_single and all_gather return copies.
// bfloat16 tensors travel as float32 over Gloo (which has no bfloat16 kernels); results keep the
// caller's dtype.
// Copies of a Group share its backend (like c10d process-group handles). Not thread-safe: the
// collectives of one group must be issued one after another. The trainer issues forward ones
// from its own thread and backward ones (all-to-alls, ZeRO gathers and reduces) from autograd's
// thread; that is safe only because backward runs while the trainer's thread waits for it.
//
// Invariants: 0 <= rank() < size() == global_ranks().size(); backend_ is null iff size() == 1.
// The tensor a group on `device` hands to its backend for caller tensor `t`: `t` itself when it is
// contiguous, on `device` and travels in its own dtype; else a contiguous copy on `device`, as
// float32 when `is_gloo` and `t` is bfloat16 (Gloo has no bfloat16 kernels). Pure.
at::Tensor to_wire(const at::Tensor& t, const at::Device& device, bool is_gloo);  // [any]

class Group {
 public:
  Group() = default;  // a group of one rank named "single" (global rank 0)

  // A group of one rank (global rank `global_rank`) on `device`, without any backend.
  static Group single(std::string name, int global_rank,
                      const at::Device& device = at::Device(at::kCPU));

  // A group over `global_ranks` (sorted, containing this process's rank at index `rank`),
  // running its collectives on `backend`, which was created for exactly these ranks; `device`
  // is where this rank's tensors live (barrier() uses it). `timeout_s` is the backend's
  // collective timeout, used in error messages.
  // REQUIRES: backend != nullptr, backend->getSize() == global_ranks.size() >= 2,
  // backend->getRank() == rank.
  Group(std::string name, std::vector<int> global_ranks, int rank,
        c10::intrusive_ptr<c10d::Backend> backend, const at::Device& device,
        double timeout_s);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  const std::string& name() const { return name_; }
  // Where the group's collectives run: the device given at construction.
  const at::Device& device() const { return device_; }
  // Backend name: "gloo", "nccl", or "none" for a group of size 1.
  std::string backend_name() const;
  // The c10d backend (null for a group of size 1), for a collective this class does not wrap.
  const c10::intrusive_ptr<c10d::Backend>& backend_handle() const { return backend_; }

  // In place: every member's `t` becomes the elementwise reduction over members.
  // `t` may be non-contiguous (a contiguous copy is reduced and copied back).
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum);  // [any]

  // Along dim 0: member r's chunk j (input_splits[j] rows, in order) goes to member j, and the
  // result holds the chunks received from members 0..size-1 in order (output_splits[i] rows
  // from member i). Empty splits mean equal chunks: input.size(0) % size() == 0 and the output
  // has input's shape. Returns a new contiguous tensor; `input` is not modified.
  // REQUIRES: input.dim() >= 1; splits empty or of length size() with sum(input_splits) ==
  // input.size(0); output_splits must match what the peers send.
  at::Tensor all_to_all_single(const at::Tensor& input,  // [n, ...]
                               const std::vector<int64_t>& output_splits = {},
                               const std::vector<int64_t>& input_splits = {});
  // returns [sum(output_splits) or n, ...]

  // all_to_all_single in two halves (ring attention passes K/V blocks while it computes):
  // Pending::wait() returns what all_to_all_single returns. `input` must stay unchanged until then.
  class Pending;
  Pending all_to_all_start(const at::Tensor& input,  // [n, ...]
                           const std::vector<int64_t>& output_splits = {},
                           const std::vector<int64_t>& input_splits = {});

  // Returns [size, ...t.shape]: slice i is member i's `t`. Shapes must be equal on all members.
  at::Tensor all_gather(const at::Tensor& t);  // [...] -> [size, ...]

  // all_gather in two halves, so that the caller computes while it runs (ZeRO-3's prefetch of the
  // next layer's weights): all_gather_start issues it now (members must issue their collectives
  // in the same order, as for the blocking ones) and Pending::wait() returns what all_gather
  // returns. `t` must stay unchanged until wait() returns.
  // `into`, when given, receives the result ([size, ...t.shape], contiguous, t's device and
  // dtype) and wait() returns it: NCCL gathers straight into it (no buffer of its own, no copy);
  // otherwise the result is copied into it at wait().
  Pending all_gather_start(const at::Tensor& t, at::Tensor into = at::Tensor());

  // Reduce-scatter (sum): returns input[rank()] summed over members, a new contiguous tensor;
  // `input` is not modified. A real reduce-scatter (each member receives only its slice: about
  // half an all-reduce's traffic), not an all-reduce. Shapes must be equal on all members.
  // REQUIRES: input.dim() >= 1 and input.size(0) == size().
  at::Tensor reduce_scatter(const at::Tensor& input);  // [size, ...] -> [...]

  // reduce_scatter in two halves, so that the caller computes while it runs (ZeRO-2/3 reduce a
  // layer's gradients during the backward of the layer before it): reduce_scatter_start issues
  // it now (members issue their collectives in the same order) and Pending::wait() returns what
  // reduce_scatter returns. `input` must stay unchanged until wait() returns.
  Pending reduce_scatter_start(const at::Tensor& input);

  // all_reduce in two halves (a layer's gradients summed while the layer before computes):
  // Pending::wait() leaves the result in `t` and returns it. `t` must not be read or written
  // until then.
  Pending all_reduce_start(at::Tensor& t, ReduceOp op = ReduceOp::kSum);

  // In place: every member's `t` becomes member `root`'s `t` (root is a group rank).
  // REQUIRES: 0 <= root < size().
  void broadcast(at::Tensor& t, int root);  // [any]

  // Returns once every member has called barrier() (host-side, also with NCCL).
  void barrier();

 private:
  // Starts a collective with `start` (argument errors propagate unchanged), waits for it and
  // turns a failure while waiting into CommError.
  template <typename StartFn>
  void run(const char* op, StartFn&& start);
  // The two halves of run(): start (a c10::DistError becomes CommError) and wait (a failure
  // becomes CommError, out-of-memory keeps its own type).
  template <typename StartFn>
  c10::intrusive_ptr<c10d::Work> start_work(const char* op, StartFn&& start);
  void wait_work(const char* op, const c10::intrusive_ptr<c10d::Work>& work);

  std::string name_ = "single";
  std::vector<int> global_ranks_ = {0};
  int rank_ = 0;
  c10::intrusive_ptr<c10d::Backend> backend_;  // null for size 1
  at::Device device_ = at::Device(at::kCPU);
  bool is_gloo_ = false;  // Gloo lacks bfloat16: such tensors travel as float32
  double timeout_s_ = 0.0;
};

// A collective in flight (Group::all_gather_start, reduce_scatter_start, all_reduce_start).
// Not copyable; movable.
class Group::Pending {
 public:
  Pending() = default;
  Pending(Pending&&) = default;
  Pending& operator=(Pending&&) = default;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

  // Waits for the collective (once) and returns its result on the caller's device in the
  // caller's dtype. Throws CommError as the blocking form does. REQUIRES: not waited before; the
  // Group that started it still exists.
  at::Tensor wait();

 private:
  friend class Group;
  Group* group_ = nullptr;  // null: finished at start (a group of one)
  const char* op_ = "";
  c10::intrusive_ptr<c10d::Work> work_;
  std::vector<std::vector<at::Tensor>> wire_;  // what the backend reads and writes, kept alive
  std::function<at::Tensor()> finish_;         // after the wait: the caller's result
  bool waited_ = false;
};

}  // namespace ulysses::comm
