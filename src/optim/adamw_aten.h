// AdamW as a sequence of ATen ops, in torch::optim::AdamW's op order: the kDevice update, the
// op order the fused host kernel (cpu_adam.h) follows, and the pre-fused offload path
// (chunked ATen ops), kept as the benchmark's baseline.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "config/options.h"

namespace ulysses::train {

// One update of `weights` in place, op for op as adamw.h documents. `step` is the parameter's
// update count including this one (1-based). All tensors have one shape, dtype and device
// (grad: converted by the ops' type promotion if it differs).
void adamw_aten_update(at::Tensor weights, const at::Tensor& grad, at::Tensor exp_avg,
                       at::Tensor exp_avg_sq, double lr, int64_t step,
                       const config::OptimOptions& options);

// adamw_aten_update over contiguous pieces of kDevicePiece elements in turn, so the temporaries
// of the update (the denominator: two at a time) are a piece's size, not the parameter's (4 GB for
// a 128K x 8K embedding in fp32). The same results, element for element (elementwise ops; a piece
// is a multiple of 64 elements, so ATen's vectorized/tail split lines up). Non-contiguous tensors
// are updated whole.
inline constexpr int64_t kDevicePiece = int64_t{1} << 22;  // 4M elements: 16 MiB in fp32
void adamw_aten_update_in_pieces(at::Tensor weights, const at::Tensor& grad, at::Tensor exp_avg,
                                 at::Tensor exp_avg_sq, double lr, int64_t step,
                                 const config::OptimOptions& options);

// The same update as one fused kernel per call (ATen's _fused_adamw_, what
// torch.optim.AdamW(fused=True) runs): one pass over memory, no temporaries. Equal to
// adamw_aten_update up to rounding (it computes in a different order). The trainer uses it on
// CUDA. REQUIRES: fused_adamw_applies(weights, grad, exp_avg, exp_avg_sq).
void adamw_fused_update(at::Tensor weights, const at::Tensor& grad, at::Tensor exp_avg,
                        at::Tensor exp_avg_sq, double lr, int64_t step,
                        const config::OptimOptions& options);
// One parameter of adamw_fused_update_many.
struct FusedAdamWEntry {
  at::Tensor weights, grad, exp_avg, exp_avg_sq;  // as adamw_fused_update's
  int64_t step = 1;                               // this parameter's update count, this one included
};
// adamw_fused_update on every entry, with one kernel call per (device, dtype) group instead of
// one per parameter (ATen's multi-tensor launches: a few per group instead of one or two per
// parameter, and the steps copied to the device at once). The same results bit for bit: the
// kernel is elementwise. REQUIRES: every entry fused_adamw_applies (TORCH_CHECK).
void adamw_fused_update_many(const std::vector<FusedAdamWEntry>& entries, double lr,
                             const config::OptimOptions& options);
// The fused kernel's conditions: one device, one floating dtype (fp32, fp64, bf16, fp16) for all
// four, all contiguous.
bool fused_adamw_applies(const at::Tensor& weights, const at::Tensor& grad,
                         const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

// One buffer of the chunked host update: all [n] contiguous CPU tensors of the master dtype.
struct AtenHostBuffer {
  at::Tensor master;      // [n] updated in place
  at::Tensor grad;        // [n] read
  at::Tensor exp_avg;     // [n] updated in place
  at::Tensor exp_avg_sq;  // [n] updated in place
  int64_t step = 1;       // update count including this one
};

// The optimizer-offload update before the fused kernel: every buffer cut into 64K-element
// chunks, adamw_aten_update on each chunk, chunks spread over threads with at::parallel_for
// (7 ATen ops per chunk). Kept for the benchmark baseline (bench/) and as a test reference.
void adamw_aten_chunked_update(const std::vector<AtenHostBuffer>& buffers, double lr,
                               const config::OptimOptions& options);

}  // namespace ulysses::train
