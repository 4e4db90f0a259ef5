// Host <-> device copies from pinned and pageable host memory (CUDA only): the link that
// activation and optimizer offload use. GB/s = bytes / time (bandwidth.h). Registers nothing on
// CPU devices or in builds without CUDA.
#include <benchmark/benchmark.h>

#include "tuner/bench/bandwidth.h"
#include "tuner/bench/bench_context.h"

namespace ulysses::bench {
namespace {

void copy(benchmark::State& state, BenchContext* ctx, bool to_device, bool pinned, int64_t bytes) {
  const int64_t elements = bytes / 4;
  at::Tensor host = at::arange(elements, at::TensorOptions().dtype(at::kFloat));  // [n]
  if (pinned) host = host.pin_memory();
  at::Tensor device =
      at::empty({elements}, at::TensorOptions().dtype(at::kFloat).device(ctx->device));
  at::Tensor& source = to_device ? host : device;
  at::Tensor& destination = to_device ? device : host;
  if (!to_device) device.copy_(host);
  // Data first: one copy, compared with the source.
  at::Tensor scratch = at::empty_like(destination);
  scratch.copy_(source, /*non_blocking=*/pinned);
  synchronize(ctx->device);
  if (!scratch.cpu().equal(source.cpu())) {
    state.SkipWithError("copy delivered wrong data");
    return;
  }
  DeviceTimer timer(ctx->device);
  double total_s = 0.0;
  for (auto _ : state) {
    timer.start();
    destination.copy_(source, /*non_blocking=*/pinned);
    const double seconds = timer.stop_ms() / 1e3;
    state.SetIterationTime(seconds);
    total_s += seconds;
  }
  state.counters["bytes"] = static_cast<double>(elements * 4);
  state.counters["GBps"] =
      algbw_gbps(elements * 4, total_s / static_cast<double>(state.iterations()));
}

}  // namespace

void register_copy_benchmarks(BenchContext& ctx) {
  if (!ctx.device.is_cuda()) return;
  for (bool to_device : {true, false}) {
    for (bool pinned : {true, false}) {
      for (int64_t bytes : ctx.sizes.copy_bytes) {
        const std::string name = bench_name("Copy", {{"dir", to_device ? "h2d" : "d2h"},
                                                     {"host", pinned ? "pinned" : "pageable"},
                                                     {"bytes", std::to_string(bytes)}});
        benchmark::RegisterBenchmark(name.c_str(), copy, &ctx, to_device, pinned, bytes)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace ulysses::bench
