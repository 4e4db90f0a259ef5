// CPU offload of checkpointed hidden states: a layer's saved input [bs, T, h] leaves
// the device right after the layer's forward and comes back for its recompute in backward.
//
// On CUDA the copies run on one side stream per offloader into page-locked host buffers, ordered
// against the compute stream with events, so that they overlap compute; backward prefetches the
// previous layer's input while the current layer recomputes. The host buffers are the
// offloader's own, of their exact size (PyTorch's pinned allocator would round each up to a power
// of two: up to twice the host memory), locked once and reused from step to step. On CPU the same
// code path runs synchronously (a copy into a separate host buffer and back), so it is testable
// without a GPU.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace ulysses::memory {

// Host blocks of exact sizes for one offloader, kept for reuse: a step takes the blocks the
// previous step gave back. Page-locked when `pinned` (CUDA builds with a GPU; see
// common/pinned_host.h), pageable otherwise. A block given back may still be read or written by a
// copy queued on the offloader's side stream; it is only handed out again to a copy queued on that
// same stream, which runs after it, so the pool serves one offloader (one stream) only.
class HostBlockPool {
 public:
  explicit HostBlockPool(bool pinned) : pinned_(pinned) {}

  // A flat uint8 host tensor of exactly `bytes` (contents undefined): a free block of that size,
  // else a new one. Free blocks of other sizes are released first (the length changed), so the
  // pool holds at most one step's blocks.
  at::Tensor take(int64_t bytes);
  // Returns a block from take() for reuse.
  void give_back(at::Tensor block);

  // Bytes of every block the pool made and has not released (in use or free).
  int64_t bytes_held() const;
  int64_t free_blocks() const;

 private:
  bool pinned_;
  mutable std::mutex mutex_;
  std::vector<at::Tensor> free_;  // each [bytes] uint8
  int64_t bytes_held_ = 0;
};

// One offloaded tensor; created by ActivationOffloader::stash.
// Invariants: until fetch(), host_ holds the value (CUDA: once on_host is reached); after
// prefetch(), fetched_ holds it on the device (CUDA: once on_device is reached).
class OffloadedTensor {
 public:
  // Use ActivationOffloader::stash. `side_stream` is the offload stream for CUDA values.
  OffloadedTensor(const at::Tensor& value, std::weak_ptr<OffloadedTensor> previous,
                  c10::optional<c10::Stream> side_stream, std::shared_ptr<HostBlockPool> pool);
  ~OffloadedTensor();

  // Starts copying the value back to its device (CUDA: asynchronously on the side stream, after
  // the host copy has finished and after the work queued so far on the current stream; CPU: at
  // once). No-op when already started.
  void prefetch();

  // The value on its original device with its dtype and shape, usable on the current stream
  // (CUDA: the current stream waits for the copy). Drops this object's references, so the host
  // buffer goes back to the allocator. Throws c10::Error when called twice (e.g. a second
  // backward through the same graph with retain_graph).
  at::Tensor fetch();

  // The tensor stashed just before this one by the same offloader (the previous layer's input
  // in the same forward pass), or null when it is gone.
  std::shared_ptr<OffloadedTensor> previous() const { return previous_.lock(); }

  int64_t bytes() const { return bytes_; }
  // The host copy: [value shape], pinned for CUDA values; undefined after fetch(). For tests.
  const at::Tensor& host_copy() const { return host_; }

 private:
  struct CudaCopies;  // events and stream, defined in the .cpp for CUDA builds

  at::Tensor host_;     // [value shape] host copy, a view of block_
  at::Tensor block_;    // [bytes] uint8 from pool_, given back by fetch() or the destructor
  std::shared_ptr<HostBlockPool> pool_;
  at::Tensor fetched_;  // [value shape] on the original device once prefetch() ran
  at::Device device_;
  int64_t bytes_ = 0;
  bool consumed_ = false;
  std::weak_ptr<OffloadedTensor> previous_;
  std::unique_ptr<CudaCopies> cuda_;  // null for CPU values
};

// Stashes hidden states in host memory. One per model; its stash() runs in the layers' forward,
// fetch()/prefetch() of the handles in their backward. Not for forward passes running at the same
// time on several threads.
class ActivationOffloader {
 public:
  // Starts moving `value` [bs, T, h] to host memory and returns its handle, linked to the
  // previously stashed tensor for prefetching. The caller may drop `value` at once (CUDA: the
  // allocator does not reuse its memory before the copy has finished).
  std::shared_ptr<OffloadedTensor> stash(const at::Tensor& value);

  // Bytes stashed so far.
  int64_t bytes_stashed() const { return bytes_stashed_.load(); }
  // The host blocks behind the stashes: exact sizes, reused from step to step.
  const HostBlockPool& host_blocks() const;

 private:
  std::shared_ptr<HostBlockPool> pool_;  // created on the first stash (pinned for CUDA values)
  std::weak_ptr<OffloadedTensor> last_;
  std::atomic<int64_t> bytes_stashed_{0};
  c10::optional<c10::Stream> side_stream_;  // CUDA offload stream, created on the first stash
};

}  // namespace ulysses::memory
