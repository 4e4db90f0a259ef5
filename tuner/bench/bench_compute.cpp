// Compute at the model's shapes: causal attention forward + backward per backend and sequence
// length (the per-rank work after the Ulysses exchange: the full sequence, hq/sp heads), the
// GEMMs of one decoder layer and the LM head, and the SwiGLU MLP forward + backward, plain and
// as TiledMLP.
// Each result is checked (against the math backend, or a float64 reference) before timing.
#include <benchmark/benchmark.h>

#include <algorithm>

#include "common/error.h"
#include "model/attention_core.h"
#include "model/llama_mlp.h"
#include "profile/flops.h"
#include "sp/tiled_mlp.h"
#include "tuner/bench/bench_context.h"

namespace ulysses::bench {
namespace {

// Relative L2 error of a against b, in float64.
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.to(at::kCPU, at::kDouble), b64 = b.to(at::kCPU, at::kDouble);
  return (a64 - b64).norm().item<double>() / std::max(b64.norm().item<double>(), 1e-30);
}

double tolerance(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 3e-2 : 1e-4; }

// Times `fn` per iteration (manual time) and reports FLOP/s of `flops` per call as "tflops".
template <typename Fn>
void timed(benchmark::State& state, BenchContext* ctx, double flops, Fn&& fn) {
  DeviceTimer timer(ctx->device);
  double total_s = 0.0;
  for (auto _ : state) {
    timer.start();
    fn();
    const double seconds = timer.stop_ms() / 1e3;
    state.SetIterationTime(seconds);
    total_s += seconds;
  }
  state.counters["tflops"] = flops / (total_s / static_cast<double>(state.iterations())) / 1e12;
}

// Longest prefix the math reference checks a fused kernel's output on.
constexpr int64_t kReferencePrefix = 2048;

struct AttentionShape {
  int64_t seq_len, heads_q, heads_kv, head_dim;
};

void attention(benchmark::State& state, BenchContext* ctx, model::AttentionBackend backend,
               AttentionShape shape) {
  const auto options = at::TensorOptions().dtype(ctx->dtype).device(ctx->device);
  at::manual_seed(0);
  at::Tensor q =
      at::randn({1, shape.seq_len, shape.heads_q, shape.head_dim}, options)  // [1, sl, hq/sp, hd]
          .requires_grad_(true);
  at::Tensor k =
      at::randn({1, shape.seq_len, shape.heads_kv, shape.head_dim}, options)  // [1, sl, hkv', hd]
          .requires_grad_(true);
  at::Tensor v = at::randn_like(k).requires_grad_(true);
  try {
    at::Tensor out = model::local_attention(q, k, v, at::Tensor(), backend);  // [1, sl, hq/sp, hd]
    if (!out.isfinite().all().item<bool>()) {
      state.SkipWithError("attention output is not finite");
      return;
    }
    if (backend != model::AttentionBackend::kMath) {
      // Causal attention of the first n positions does not depend on the later ones, so the math
      // reference runs on a prefix: its [hq, n, n] scores stay small at any sequence length.
      const int64_t n = std::min<int64_t>(shape.seq_len, kReferencePrefix);
      at::Tensor reference = model::local_attention(q.narrow(1, 0, n), k.narrow(1, 0, n),
                                                    v.narrow(1, 0, n), at::Tensor(),
                                                    model::AttentionBackend::kMath);
      if (relative_error(out.narrow(1, 0, n), reference) > tolerance(ctx->dtype)) {
        state.SkipWithError("attention output differs from the math backend");
        return;
      }
    }
  } catch (const UserError& e) {
    state.SkipWithError(e.what());
    return;
  } catch (const c10::Error& e) {
    // Out of memory at this length is a result (the row says so), not the end of the run.
    const std::string what = e.what_without_backtrace();
    if (!is_out_of_memory_text(what)) throw;
    state.SkipWithError(("out of memory at sl " + std::to_string(shape.seq_len)).c_str());
    return;
  }
  at::Tensor grad = at::ones({1, shape.seq_len, shape.heads_q, shape.head_dim}, options);
  const double flops =
      3.0 * profile::causal_attention_forward_flops(shape.seq_len, shape.heads_q, shape.head_dim);
  try {
    timed(state, ctx, flops, [&] {
      at::Tensor out = model::local_attention(q, k, v, at::Tensor(), backend);
      out.backward(grad);
    });
  } catch (const c10::Error& e) {
    if (!is_out_of_memory_text(e.what_without_backtrace())) throw;
    state.SkipWithError(("out of memory at sl " + std::to_string(shape.seq_len) + " (backward)").c_str());
  }
}

void gemm(benchmark::State& state, BenchContext* ctx, int64_t tokens, int64_t in, int64_t out) {
  const auto options = at::TensorOptions().dtype(ctx->dtype).device(ctx->device);
  at::manual_seed(0);
  at::Tensor x = at::randn({tokens, in}, options);    // [T, in]
  at::Tensor weight = at::randn({out, in}, options);  // [out, in]
  at::Tensor y = at::linear(x, weight);               // [T, out]
  at::Tensor reference = at::matmul(x.narrow(0, 0, 4).to(at::kCPU, at::kDouble),
                                    weight.to(at::kCPU, at::kDouble).t());  // [4, out]
  if (relative_error(y.narrow(0, 0, 4), reference) > tolerance(ctx->dtype)) {
    state.SkipWithError("linear differs from the float64 reference");
    return;
  }
  timed(state, ctx, 2.0 * tokens * in * out, [&] { y = at::linear(x, weight); });
}

// The SwiGLU MLP forward + backward on [1, T, h], plain (tiles = 1) or TiledMLP over `tiles`
// sequence tiles; the tiled output is checked against the plain one first. FLOPs are the
// model's (TiledMLP's recompute is not counted).
void mlp(benchmark::State& state, BenchContext* ctx, int64_t tokens, int64_t tiles) {
  const config::ModelOptions& m = ctx->config.model;
  model::LlamaMLP layer(m);
  at::manual_seed(0);
  for (auto& p : layer->parameters()) p.data().normal_(0.0, 0.02);
  layer->to(ctx->device, ctx->dtype);
  const auto options = at::TensorOptions().dtype(ctx->dtype).device(ctx->device);
  at::Tensor x = at::randn({1, tokens, m.hidden_size}, options).requires_grad_(true);  // [1, T, h]
  auto run = [&] { return tiles == 1 ? layer->forward(x) : sp::tiled_mlp(*layer, x, tiles); };
  const at::Tensor plain = layer->forward(x);  // [1, T, h]
  if (relative_error(run(), plain) > tolerance(ctx->dtype)) {
    state.SkipWithError("tiled MLP differs from the plain MLP");
    return;
  }
  const double flops = 6.0 * tokens * 3.0 * m.hidden_size * m.intermediate_size;
  timed(state, ctx, flops, [&] { run().sum().backward(); });
}

}  // namespace

void register_compute_benchmarks(BenchContext& ctx) {
  const config::ModelOptions& m = ctx.config.model;
  const int64_t sp = ctx.world_size();
  // At least one head a rank: beyond the head count a ring (mesh.sp_ring) splits the sequence.
  const int64_t hq_local = std::max<int64_t>(1, m.num_heads / sp);
  const int64_t hkv_local = m.num_kv_heads % sp == 0 ? m.num_kv_heads / sp : 1;  // replicated KV
  // What attention.backend can run here; "auto" is SDPA's own choice (the default).
  std::vector<std::string> backends = {"math", "flash", "auto"};
  if (ctx.device.is_cuda()) backends = {"math", "flash", "efficient", "cudnn", "auto"};
  for (const std::string& name : backends) {
    model::AttentionBackend backend;
    try {
      backend = model::resolve_attention_backend(name, ctx.device);
    } catch (const UserError&) {
      continue;  // not available in this build
    }
    for (int64_t sl : ctx.sizes.seqlens) {
      const std::string bench = bench_name("Attention", {{"backend", name},
                                                         {"sl", std::to_string(sl)},
                                                         {"heads", std::to_string(hq_local)},
                                                         {"hd", std::to_string(m.head_dim)}});
      benchmark::RegisterBenchmark(bench.c_str(), attention, &ctx, backend,
                                   AttentionShape{sl, hq_local, hkv_local, m.head_dim})
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }

  const int64_t t = ctx.sizes.tokens;
  const int64_t h = m.hidden_size, attn = m.num_heads * m.head_dim,
                kv = m.num_kv_heads * m.head_dim;
  const std::vector<std::tuple<std::string, int64_t, int64_t>> gemms = {
      {"q_proj", h, attn},
      {"kv_proj", h, 2 * kv},
      {"o_proj", attn, h},
      {"gate_up", h, 2 * m.intermediate_size},
      {"down_proj", m.intermediate_size, h},
      {"lm_head", h, m.vocab_size}};
  for (const auto& [op, in, out] : gemms) {
    const std::string bench = bench_name("Gemm", {{"op", op},
                                                  {"tokens", std::to_string(t)},
                                                  {"in", std::to_string(in)},
                                                  {"out", std::to_string(out)}});
    benchmark::RegisterBenchmark(bench.c_str(), gemm, &ctx, t, in, out)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  const int64_t auto_tiles = sp::auto_mlp_tiles(t, m.hidden_size);
  for (int64_t tiles : {int64_t{1}, auto_tiles > 1 ? auto_tiles : int64_t{4}}) {
    const std::string bench = bench_name("Mlp", {{"impl", tiles == 1 ? "plain" : "tiled"},
                                                 {"tiles", std::to_string(tiles)},
                                                 {"tokens", std::to_string(t)}});
    benchmark::RegisterBenchmark(bench.c_str(), mlp, &ctx, t, tiles)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace ulysses::bench
