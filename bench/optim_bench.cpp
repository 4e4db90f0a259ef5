// The optimizer-offload step (AdamW kHost) at 1B-parameter scale: the pre-fused path (blocking
// gradient copy into a host buffer, 64K-element chunks of ATen ops, copy back) against the fused
// pass (optim/cpu_adam.h) as AdamW::step runs it, for fp32 and bf16 host parameters; and the
// gradient norm for clipping, ATen's per-tensor norm against the host pass's.
// Run: build/bin/optim_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Figures and method: reports/optimizer-offload/README.md. "GB/s" counts the state an update
// must touch, 28 bytes per parameter in both cases (see the README), over wall time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/adamw_aten.h"
#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"

namespace ulysses::train {
namespace {

constexpr int64_t kBufferElements = 256LL << 20;  // 256M elements per parameter tensor
constexpr double kBytesPerParam = 28.0;          // read w, m, v, g; write w, m, v (+ bf16 param)

config::OptimOptions options() {
  config::OptimOptions o;
  o.lr = 1e-4;
  o.betas = {0.9, 0.95};
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  return o;
}

// Parameters of `total` elements in kBufferElements-sized tensors, filled with small values,
// each with a gradient of its dtype.
std::vector<at::Tensor> make_params(int64_t total, at::ScalarType dtype) {
  std::vector<at::Tensor> params;
  for (int64_t done = 0; done < total; done += kBufferElements) {
    const int64_t n = std::min(kBufferElements, total - done);
    at::Tensor p = at::full({n}, 0.01, dtype).set_requires_grad(true);
    p.mutable_grad() = at::full({n}, 1e-3, dtype);
    params.push_back(p);
  }
  return params;
}

void set_counters(benchmark::State& state, int64_t total) {
  state.counters["params"] = static_cast<double>(total);
  state.counters["GB/s"] = benchmark::Counter(kBytesPerParam * static_cast<double>(total) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// Before: what AdamW kHost did up to the fused kernel, per step: each gradient copied (blocking,
// converted to fp32) into a host buffer, the chunked ATen update of the fp32 masters, and each
// master copied back into its parameter. Args: millions of parameters, 0 = fp32, 1 = bf16.
void BM_OffloadStepAtenChunked(benchmark::State& state) {
  const int64_t total = state.range(0) * 1'000'000;
  const at::ScalarType dtype = state.range(1) == 0 ? at::kFloat : at::kBFloat16;
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = make_params(total, dtype);
  std::vector<AtenHostBuffer> buffers;
  for (const at::Tensor& p : params) {
    buffers.push_back({p.to(at::kFloat, false, true), at::empty(p.sizes()), at::zeros(p.sizes()),
                       at::zeros(p.sizes()), 1});
  }
  for (auto _ : state) {
    for (size_t i = 0; i < params.size(); ++i) buffers[i].grad.copy_(params[i].grad());
    adamw_aten_chunked_update(buffers, 1e-4, options());
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(buffers[i].master);
    for (AtenHostBuffer& b : buffers) ++b.step;
  }
  set_counters(state, total);
}

// After: AdamW kHost's step on host parameters (the fused pass; no gradient copy; fp32
// parameters are their own masters, bf16 parameters are written by the pass), timed after one
// warm-up step (as bench/cpu_adam_vs_deepspeed.py times DeepSpeed's CPUAdam).
void BM_OffloadStepFused(benchmark::State& state) {
  const int64_t total = state.range(0) * 1'000'000;
  const at::ScalarType dtype = state.range(1) == 0 ? at::kFloat : at::kBFloat16;
  const std::vector<at::Tensor> params = make_params(total, dtype);
  NamedTensors named;
  for (size_t i = 0; i < params.size(); ++i) named.emplace_back(std::to_string(i), params[i]);
  AdamW adamw(named, options(), OptimizerPlacement::kHost);
  adamw.step(1e-4);  // warm-up
  for (auto _ : state) {
    adamw.step(1e-4);
  }
  state.SetLabel(fused_adamw_isa());
  set_counters(state, total);
}

// The gradient norm for clipping over fp32 host gradients (512M in two tensors), read once (4
// bytes per parameter in "GB/s"). Args: threads. Aten: gradient_norm (grad_clip.h), ATen's norm
// per tensor on at::set_num_threads(threads) intra-op threads, what optimizer offload took before;
// Host: host_gradient_norm (cpu_adam.h), the offloaded optimizer's norm now.
std::vector<at::Tensor> norm_grads() {
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 2; ++i) grads.push_back(at::full({kBufferElements}, 1e-3, at::kFloat));
  return grads;
}

void set_norm_counters(benchmark::State& state) {
  state.counters["GB/s"] = benchmark::Counter(4.0 * 2.0 * static_cast<double>(kBufferElements) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GradientNormAten(benchmark::State& state) {
  const std::vector<at::Tensor> grads = norm_grads();
  const int threads = at::get_num_threads();
  at::set_num_threads(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(gradient_norm(grads));
  at::set_num_threads(threads);
  set_norm_counters(state);
}

void BM_GradientNormHost(benchmark::State& state) {
  const std::vector<at::Tensor> grads = norm_grads();
  for (auto _ : state) benchmark::DoNotOptimize(host_gradient_norm(grads, state.range(0)));
  set_norm_counters(state);
}

BENCHMARK(BM_GradientNormAten)->Arg(1)->Arg(2)->Iterations(3)->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_GradientNormHost)->Arg(1)->Arg(2)->Iterations(3)->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Millions of parameters: the largest that fit in this machine's 24 GiB shared with others
// (before: 24 B/param fp32, 20 B/param bf16; after: 16 B/param), see the README.
BENCHMARK(BM_OffloadStepAtenChunked)->Args({512, 0})->Args({512, 1})
    ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_OffloadStepFused)->Args({512, 0})->Args({512, 1})->Args({1024, 0})->Args({1024, 1})
    ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ulysses::train

BENCHMARK_MAIN();
