// The sequence-tiled paths of a training step against the untiled ones, forward + backward, at a
// small Llama-like shape that runs in seconds on a CPU: the LM head + loss (model::lm_loss_sum
// against sp::tiled_lm_loss_sum at several tile counts), the MLP alone (model::LlamaMLP against
// sp::tiled_mlp), and one decoder layer under activation checkpointing with its MLP untiled or
// tiled, as ulysses-train runs it with memory.checkpointing and memory.tiled_mlp.
// Run: build/bin/tiling_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Figures and method: reports/step-cpu-bench/README.md.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "memory/activation_checkpoint.h"
#include "model/attention_core.h"
#include "model/llama.h"
#include "model/lm_loss.h"
#include "sp/tiled_logits_loss.h"
#include "sp/tiled_mlp.h"

namespace ulysses {
namespace {

// Two shapes, bs 1. The head + loss: sl 1024, h 128, V 8192, so that the passes over the
// [sl, V] logits weigh beside the GEMMs about as they do on a GPU. The MLP and the layer: sl 512,
// h 256, ffn = 4 h (Llama-3.2-1B's ratio), 4 heads (2 KV heads), so that the MLP's GEMMs outweigh
// the attention core about as they do at 8K in Llama-3.2-1B.
constexpr int64_t kLossLength = 1024;  // sl
constexpr int64_t kLossHidden = 128;   // h
constexpr int64_t kVocab = 8192;       // V
constexpr int64_t kLength = 512;       // sl
constexpr int64_t kHidden = 256;       // h
constexpr int64_t kFfn = 4 * kHidden;  // ffn
constexpr int64_t kHeads = 4, kKvHeads = 2;

at::Tensor randn(at::IntArrayRef sizes, uint64_t seed, double scale) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, gen, at::kFloat).mul_(scale);
}

config::ModelOptions one_layer() {
  config::ModelOptions o;
  o.hidden_size = kHidden;
  o.num_layers = 1;
  o.num_heads = kHeads;
  o.num_kv_heads = kKvHeads;
  o.head_dim = kHidden / kHeads;
  o.intermediate_size = kFfn;
  o.vocab_size = kVocab;
  o.init_seed = 7;
  o.init_std = 0.02;
  return o;
}

void set_counters(benchmark::State& state, int64_t length) {
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(length),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------- LM head + loss

struct HeadLossInputs {
  at::Tensor hidden =
      randn({1, kLossLength, kLossHidden}, 1, 1.0).requires_grad_(true);          // [bs, sl, h]
  at::Tensor weight = randn({kVocab, kLossHidden}, 2, 0.05).requires_grad_(true);  // [V, h]
  at::Tensor labels;                                                                 // [bs, sl]
  HeadLossInputs() {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
    labels = at::randint(kVocab, {1, kLossLength}, gen, at::kLong);
    labels.narrow(1, kLossLength - 1, 1).fill_(model::kIgnoreLabel);  // the last position's label
  }
  void clear() {
    hidden.mutable_grad() = at::Tensor();
    weight.mutable_grad() = at::Tensor();
  }
};

// Untiled: [bs*sl, V] logits through autograd (model::lm_loss_sum), then backward.
void BM_HeadLossUntiled(benchmark::State& state) {
  HeadLossInputs in;
  for (auto _ : state) {
    model::LossSum loss = model::lm_loss_sum(in.hidden, in.weight, in.labels);
    loss.sum.backward();
    benchmark::DoNotOptimize(in.weight.grad().data_ptr());
    in.clear();
  }
  set_counters(state, kLossLength);
}

// Tiled: sp::tiled_lm_loss_sum with state.range(0) tiles, then backward.
void BM_HeadLossTiled(benchmark::State& state) {
  HeadLossInputs in;
  for (auto _ : state) {
    model::LossSum loss = sp::tiled_lm_loss_sum(in.hidden, in.weight, in.labels, state.range(0));
    loss.sum.backward();
    benchmark::DoNotOptimize(in.weight.grad().data_ptr());
    in.clear();
  }
  set_counters(state, kLossLength);
}

// ---------------------------------------------------------------- MLP

// The MLP of one layer, x [bs, sl, h], and a fixed upstream gradient [bs, sl, h].
struct MlpInputs {
  model::LlamaForCausalLM model{one_layer()};
  model::LlamaMLP mlp = model->model->layer(0)->mlp;
  at::Tensor x = randn({1, kLength, kHidden}, 4, 1.0).requires_grad_(true);
  at::Tensor upstream = randn({1, kLength, kHidden}, 5, 1.0);
  void clear() {
    x.mutable_grad() = at::Tensor();
    for (auto& p : mlp->parameters()) p.mutable_grad() = at::Tensor();
  }
};

// Untiled MLP forward + backward (no checkpointing).
void BM_MlpUntiled(benchmark::State& state) {
  MlpInputs in;
  for (auto _ : state) {
    in.mlp->forward(in.x).backward(in.upstream);
    in.clear();
  }
  set_counters(state, kLength);
}

// sp::tiled_mlp with state.range(0) tiles, forward + backward (no checkpointing).
void BM_MlpTiled(benchmark::State& state) {
  MlpInputs in;
  for (auto _ : state) {
    sp::tiled_mlp(*in.mlp, in.x, state.range(0)).backward(in.upstream);
    in.clear();
  }
  set_counters(state, kLength);
}

// ---------------------------------------------------------------- checkpointed decoder layer

// One decoder layer (SDPA attention as attention.backend auto picks on CPU) under activation
// checkpointing, its MLP untiled (state.range(0) == 1) or tiled with that many tiles: forward,
// then backward (the layer's recompute, with the tiles inside it).
void BM_CheckpointedLayer(benchmark::State& state) {
  model::LlamaForCausalLM model(one_layer());
  model->set_attention_core(
      std::make_shared<model::LocalAttentionCore>(model::AttentionBackend::kSdpaAuto));
  if (state.range(0) > 1) model->set_mlp_runner(sp::tiled_mlp_runner(state.range(0)));
  memory::enable_activation_checkpointing(model, /*offload=*/false);
  const at::Tensor x = randn({1, kLength, kHidden}, 6, 1.0).requires_grad_(true);  // [bs, sl, h]
  const at::Tensor positions = at::arange(kLength, at::kLong).unsqueeze(0);        // [bs, sl]
  const at::Tensor upstream = randn({1, kLength, kHidden}, 7, 1.0);
  for (auto _ : state) {
    model->model->forward_layers(x, positions, {}).backward(upstream);
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
  }
  set_counters(state, kLength);
}

BENCHMARK(BM_HeadLossUntiled)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_HeadLossTiled)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MlpUntiled)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MlpTiled)->Arg(2)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CheckpointedLayer)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ulysses

BENCHMARK_MAIN();
