// Fused CPU AdamW: one multi-threaded, vectorized pass over host buffers that reads each
// gradient (fp32, or bf16/fp16 converted inline), updates the master weights and both moments in
// place and optionally writes the new weights into a host parameter of another dtype.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "config/options.h"

namespace ulysses::train {

// One parameter's buffers. All [n] (any shape, n elements), contiguous, on the CPU.
struct FusedAdamWBuffer {
  at::Tensor master;      // [n] fp32 or fp64 master weights, updated in place
  at::Tensor exp_avg;     // [n] master dtype, first moment, updated in place
  at::Tensor exp_avg_sq;  // [n] master dtype, second moment, updated in place
  at::Tensor grad;        // [n] read only: master dtype, or bf16/fp16 with an fp32 master
  at::Tensor param_out;   // [n] undefined, or a tensor that does not overlap master, of the
                          // master dtype or (fp32 master) bf16/fp16: receives the updated master
                          // converted as copy_ converts it (round to nearest even)
  int64_t step = 1;       // this parameter's update count including this update (1-based)
};

// Applies one AdamW update (the op order and rounding of adamw.h, see adamw_aten_update) to every
// buffer: per element, in the master dtype, with every scalar rounded to it as ATen rounds them
// and a correctly rounded sqrt, so that the result equals the ATen ops' with an exact sqrt bit for
// bit (tested):
//   g  = grad (converted to the master dtype) * grad_scale
//                                                     (grad.mul_(grad_scale) on a master-dtype
//                                                      gradient: clip_gradients' scaling, folded
//                                                      in so nobody writes the gradients)
//   m  = fma(g, 1 - b1, m * b1)                       (Tensor.add_(g, alpha) is an fma)
//   v  = fma((1 - b2) * g, g, v * b2)                 (addcmul_'s kernel, as compiled in
//                                                      LibTorch 2.x, contracts to an fma)
//   w  = w * (1 - lr*wd) + (-lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// sqrt is correctly rounded (IEEE 754, as CUDA's sqrtf and NumPy's). ATen's CPU sqrt of a float
// tensor is not (about 1 in 5 results is 1 ulp off), so on a CPU kDevice's ATen ops and this pass
// differ in the last bits of w (about 1 ulp per step where it does); what this pass computes is
// the formula's correctly rounded evaluation, one pass over memory (read w, m, v, g; write w, m,
// v), as fast as the memory allows. The buffers are cut into 64K-element chunks, spread over
// options.host_threads threads (at::get_num_threads() when it is 0). The inner loop is compiled for
// AVX-512, AVX2+FMA and the baseline ISA and picked at run time (fused_adamw_isa; the same results
// in each, tested with each capped through ULYSSES_CPU_ISA).
// REQUIRES (checked, TORCH_CHECK): the shapes/dtypes/devices above; lr >= 0; grad_scale finite
// and > 0. REQUIRES (not checked): no two buffers share memory (threads update them at once).
void fused_adamw_cpu(const std::vector<FusedAdamWBuffer>& buffers, double lr,
                     const config::OptimOptions& options, double grad_scale = 1.0);

// The L2 norm of every element of `grads` (undefined entries skipped): sqrt of the sum of x^2,
// each x converted to fp64 (exactly), summed in fp64 per 64K-element chunk over `threads` threads
// (at::get_num_threads() when 0), the chunks' sums added in order, so the result does not depend
// on the thread count. It differs from clip_gradients' norm (fp32 per-tensor norms, grad_clip.h)
// only in rounding, being the more accurate of the two.
// REQUIRES (TORCH_CHECK): each defined grad contiguous on the CPU, fp32, fp64, bf16 or fp16.
double host_gradient_norm(const std::vector<at::Tensor>& grads, int64_t threads = 0);

// host_gradient_norm in parts, for gradients that become final one at a time: the sums of x^2 of
// `grad`'s 64K-element chunks, in order (empty for an undefined or empty grad), on `threads`
// threads as above. host_gradient_norm_of_sums(s) with s[i] = host_gradient_square_sums(grads[i])
// equals host_gradient_norm(grads) bit for bit (the same chunk sums, added in the same order).
// REQUIRES: as host_gradient_norm's.
std::vector<double> host_gradient_square_sums(const at::Tensor& grad, int64_t threads = 0);
double host_gradient_norm_of_sums(const std::vector<std::vector<double>>& sums);

// OS threads the host passes (fused_adamw_cpu, host_gradient_norm) have started since the process
// began: they keep their workers, so this grows to the largest thread count used, minus one, and
// no further.
int64_t host_threads_started();

// The CPUs this process may run on (its affinity mask; the hardware's count if that is unknown),
// at least 1.
int64_t available_host_cpus();

// optim.host_threads resolved (config/options.h): `configured` when > 0; else, where the host is
// the device (a CPU run), `intra_op_threads`; else the `cpus` this process may run on shared among
// the `ranks_on_node` ranks of its node (the launcher's local world size, from torchrun, SLURM or
// Open MPI alike), at least 1. Pure.
int64_t resolve_host_threads(int64_t configured, bool host_is_device, int64_t intra_op_threads,
                             int64_t cpus, int64_t ranks_on_node);

// The instruction set the inner loop runs with on this machine: "avx512", "avx2" or "baseline":
// the best the CPU has, capped by the environment variable ULYSSES_CPU_ISA (baseline, avx2 or
// avx512) where it is set. Throws c10::Error naming the variable for any other value.
const char* fused_adamw_isa();

}  // namespace ulysses::train
