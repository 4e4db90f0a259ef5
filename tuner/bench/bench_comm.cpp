// All-to-all over the SP group (the Ulysses exchange): algbw / busbw as nccl-tests define them
// (bandwidth.h), each iteration timed after a barrier, the slowest rank's time reported.
#include <benchmark/benchmark.h>

#include "tuner/bench/bandwidth.h"
#include "tuner/bench/bench_context.h"

namespace ulysses::bench {
namespace {

// Rank r's send buffer: chunk j (for rank j) holds r * n + j everywhere, so the received chunk
// i (from rank i) must hold i * n + r.
at::Tensor coded_input(int rank, int ranks, int64_t per_peer, const at::Device& device) {
  at::Tensor codes = at::arange(ranks, at::kFloat) + static_cast<float>(rank * ranks);  // [n]
  return codes.view({ranks, 1}).expand({ranks, per_peer}).contiguous().to(device);  // [n, per_peer]
}

bool check_received(const at::Tensor& received, int rank, int ranks) {  // [n, per_peer]
  at::Tensor expected = (at::arange(ranks, at::kFloat) * ranks + static_cast<float>(rank))
                            .view({ranks, 1})
                            .expand_as(received.cpu());
  return received.cpu().equal(expected);
}

void all_to_all(benchmark::State& state, BenchContext* ctx, int64_t bytes) {
  comm::Group& group = ctx->a2a_group();
  const int ranks = group.size();
  const int64_t per_peer = std::max<int64_t>(bytes / 4 / ranks, 1);  // float32 elements
  const int64_t send_bytes = per_peer * ranks * 4;
  at::Tensor input = coded_input(group.rank(), ranks, per_peer, ctx->device);  // [n, per_peer]

  // Data first: one exchange checked on every rank; all ranks skip together on a mismatch.
  const bool ok =
      ctx->all_ok(group, check_received(group.all_to_all_single(input), group.rank(), ranks));
  if (!ok) {
    state.SkipWithError("all_to_all_single delivered wrong data");
    return;
  }
  DeviceTimer timer(ctx->device);
  double total_s = 0.0;
  for (auto _ : state) {
    group.barrier();
    timer.start();
    at::Tensor received = group.all_to_all_single(input);  // [n, per_peer]
    const double slowest_s = ctx->max_over(group, timer.stop_ms()) / 1e3;
    state.SetIterationTime(slowest_s);
    total_s += slowest_s;
    benchmark::DoNotOptimize(received);
  }
  const double mean_s = total_s / static_cast<double>(state.iterations());
  const double algbw = algbw_gbps(send_bytes, mean_s);
  state.counters["bytes"] = static_cast<double>(send_bytes);
  state.counters["ranks"] = ranks;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = alltoall_busbw_gbps(algbw, ranks);
}

}  // namespace

void register_comm_benchmarks(BenchContext& ctx) {
  for (int64_t bytes : ctx.sizes.a2a_bytes) {
    const std::string name = bench_name(
        "AllToAll",
        {{"bytes", std::to_string(bytes)}, {"ranks", std::to_string(ctx.a2a_group().size())}});
    benchmark::RegisterBenchmark(name.c_str(), all_to_all, &ctx, bytes)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace ulysses::bench
