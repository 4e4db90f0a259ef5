// The fused CUDA kernels' room: each op in a file of its own with the ATen path it replaces beside
// it (rms_norm.h: RMSNorm; swiglu.h: silu(gate) * up), the CUDA kernels in *_cuda.cu, compiled
// where the build has a CUDA LibTorch and nvcc. The model calls the ops with model.fused_kernels.
#pragma once

namespace ulysses::kernels {

// True when this build compiled the CUDA kernels (else every *_fusable predicate is false and the
// kernels' entry points throw "this build has no fused CUDA kernels").
bool fused_kernels_built();

}  // namespace ulysses::kernels
