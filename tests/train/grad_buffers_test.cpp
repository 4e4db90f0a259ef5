// GradientBuffers: fp32 accumulation of bf16 gradients across backward passes (where bf16
// accumulation loses the small contributions), fp32 gradients as views of the flat buffer, and the
// bucketed in-place all-reduce on real Gloo ranks. Values are small integers or powers of two:
// exact in fp32, so no tolerance. Also the way ZeRO's offloaded optimizer returns the updated
// weights (through AdamW's staging buffers), counted per step.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/mesh.h"
#include "data/data_loader.h"
#include "memory/activation_checkpoint.h"
#include "sp/contribution_window.h"
#include "sp/sequence_tiled_compute.h"
#include "support/multi_rank.h"
#include "train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "zero/grad_buffers.h"
#include "zero/gradient_step.h"
#include "zero/layer_all_reduce.h"
#include "zero/zero_optimizer.h"
#include "zero/zero_partition.h"

namespace ulysses::train {
namespace {

using testing::RankContext;
using testing::run_ranks;

// Backward of sum(w * scale): adds `scale` to every element of w's gradient.
void contribute(const at::Tensor& w, double scale) { (w * scale).sum().backward(); }

TEST(GradientBuffers, Bf16ContributionsAccumulateInFp32) {
  // 256 + 255 contributions of 1: in bf16 (8 significant bits) 256 + 1 rounds back to 256, so a
  // bf16 .grad stays at 256; the fp32 buffer holds the exact 511.
  at::Tensor w = at::zeros({4}, at::kBFloat16).requires_grad_(true);  // [4]
  {
    at::Tensor plain = at::zeros({4}, at::kBFloat16).requires_grad_(true);
    contribute(plain, 256.0);
    for (int i = 0; i < 255; ++i) contribute(plain, 1.0);
    ASSERT_EQ(plain.grad()[0].item<float>(), 256.0f) << "bf16 accumulation no longer loses these";
  }
  GradientBuffers buffers({w});
  contribute(w, 256.0);
  for (int i = 0; i < 255; ++i) contribute(w, 1.0);
  const at::Tensor& g = buffers.grads()[0];
  EXPECT_EQ(g.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(g, at::full({4}, 511.0f))) << g;
  EXPECT_FALSE(w.grad().defined()) << "the bf16 contribution must be released after each add";

  buffers.copy_to_param_grads();
  EXPECT_EQ(w.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(w.grad(), at::full({4}, 511.0, at::kBFloat16)));  // 511 -> 512 in bf16

  buffers.zero();  // releases the bf16 copy: the next contribution must not add it again
  EXPECT_FALSE(w.grad().defined());
  contribute(w, 2.0);
  EXPECT_TRUE(at::equal(buffers.grads()[0], at::full({4}, 2.0f)));
}

// memory.precision bf16-states: the buffer is bf16 and IS .grad(), so contributions add as
// torch's own AccumulateGrad adds them into a bf16 .grad: 256 + 1 stays 256, as above.
TEST(GradientBuffers, InParameterDtypeSumsAsTorchsBf16Grad) {
  at::Tensor plain = at::zeros({4}, at::kBFloat16).requires_grad_(true);
  at::Tensor w = at::zeros({4}, at::kBFloat16).requires_grad_(true);  // [4]
  GradientBuffers buffers({w}, /*shards=*/1, /*on_host=*/false, /*sum_in_parameter_dtype=*/true);
  const at::Tensor& g = buffers.grads()[0];
  EXPECT_EQ(g.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(w.grad().is_same(g));
  for (double scale : {256.0, 1.0, 1.0, 0.75, -3.0}) {
    contribute(plain, scale);
    contribute(w, scale);
  }
  EXPECT_TRUE(at::equal(g, plain.grad())) << g << plain.grad();
  // 256 + 1, + 1 and + 0.75 each round back to 256 in bf16; - 3 gives 253 (an fp32 sum: 255.75).
  EXPECT_TRUE(at::equal(g, at::full({4}, 253.0, at::kBFloat16))) << g;
  EXPECT_EQ(buffers.bytes(), 4 * 2);
  buffers.zero();
  contribute(w, 2.0);
  EXPECT_TRUE(at::equal(buffers.grads()[0], at::full({4}, 2.0, at::kBFloat16)));
  EXPECT_THROW(GradientBuffers({plain}, 1, /*on_host=*/true, /*sum_in_parameter_dtype=*/true),
               c10::Error);
}

TEST(GradientBuffers, Fp32GradIsTheBufferViewAndSurvivesReplacement) {
  at::Tensor a = at::zeros({2, 3}, at::kFloat).requires_grad_(true);  // [2, 3]
  at::Tensor b = at::zeros({5}, at::kFloat).requires_grad_(true);     // [5]
  at::Tensor frozen = at::zeros({7}, at::kFloat);                     // no grad: no buffer
  GradientBuffers buffers({a, b, frozen});
  EXPECT_EQ(buffers.bytes(), 11 * 4);
  EXPECT_FALSE(buffers.grads()[2].defined());
  EXPECT_TRUE(a.grad().is_same(buffers.grads()[0]));
  contribute(a, 3.0);
  contribute(a, 4.0);
  contribute(b, 1.0);
  EXPECT_TRUE(at::equal(buffers.grads()[0], at::full({2, 3}, 7.0f)));
  EXPECT_TRUE(at::equal(buffers.grads()[1], at::full({5}, 1.0f)));
  EXPECT_EQ(a.grad().data_ptr(), buffers.grads()[0].data_ptr()) << "accumulated in place";

  a.mutable_grad() = at::full({2, 3}, 9.0f);  // someone replaced it
  buffers.zero();
  EXPECT_TRUE(a.grad().is_same(buffers.grads()[0]));
  EXPECT_TRUE(at::equal(buffers.grads()[0], at::zeros({2, 3})));
}

TEST(GradientBuffers, DestructionRemovesTheHook) {
  at::Tensor w = at::zeros({3}, at::kBFloat16).requires_grad_(true);
  { GradientBuffers buffers({w}); }
  contribute(w, 1.0);
  ASSERT_TRUE(w.grad().defined()) << "a hook outlived its buffers";
  EXPECT_TRUE(at::equal(w.grad(), at::ones({3}, at::kBFloat16)));
}

// The bucketed all-reduce sums every element once, with buckets that cross parameters (3
// floats). In the second step a range is started early (a layer's gradients during backward):
// all_reduce waits for it and sums only the rest, also where the range splits a flat and a
// bucket; starting a range twice is refused.
TEST(GradientBuffers, BucketedAllReduceSumsEveryElementOnceEvenWithARangeStartedEarly) {
  constexpr int kWorld = 3;
  run_ranks(kWorld, [](const RankContext& ctx) {
    comm::DeviceMesh mesh =
        comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, kWorld, 1);
    // fp32 and bf16 parameters (two flat buffers: [a, c, d] and [b]), sizes that do not divide
    // the bucket.
    at::Tensor a = at::zeros({7}, at::kFloat).requires_grad_(true);
    at::Tensor b = at::zeros({2, 5}, at::kBFloat16).requires_grad_(true);
    at::Tensor c = at::zeros({3}, at::kFloat).requires_grad_(true);
    at::Tensor d = at::zeros({4}, at::kFloat).requires_grad_(true);
    GradientBuffers buffers({a, b, c, d});
    for (bool start_early : {false, true}) {
      buffers.zero();
      const double r = ctx.rank + 1;
      contribute(a, r);
      contribute(b, 2 * r);
      contribute(c, 4 * r);
      contribute(d, 8 * r);
      if (start_early) {  // b and c: all of the bf16 flat, the middle of the fp32 one
        buffers.all_reduce_start(mesh.world(), 1, 3, /*bucket_bytes=*/8);
        EXPECT_THROW(buffers.all_reduce_start(mesh.world(), 2, 3, 8), c10::Error);
      }
      buffers.all_reduce(mesh.world(), /*bucket_bytes=*/12);
      EXPECT_TRUE(at::equal(buffers.grads()[0], at::full({7}, 6.0f))) << buffers.grads()[0];
      EXPECT_TRUE(at::equal(buffers.grads()[1], at::full({2, 5}, 12.0f))) << buffers.grads()[1];
      EXPECT_TRUE(at::equal(buffers.grads()[2], at::full({3}, 24.0f))) << buffers.grads()[2];
      EXPECT_TRUE(at::equal(buffers.grads()[3], at::full({4}, 48.0f))) << buffers.grads()[3];
    }
    EXPECT_EQ(buffers.ranges_started(), 1);
  });
}

// Stage 0 on 2 data-parallel ranks, 2 micro-batches: with LayerAllReduce each layer's sum
// starts during the last micro-batch's backward (L ranges per step, none in the first
// micro-batch), with and without checkpointing, and the summed gradients and the loss are those of
// the sum after backward. Two ranks add a + b either way, so the comparison is exact. Stage 1
// leaves the rest to its optimizer (reduce = false, then GradientBuffers::all_reduce): the same.
TEST(LayerAllReduce, LayersAreSummedDuringTheLastBackwardWithTheSameResult) {
  constexpr int kWorld = 2;
  run_ranks(kWorld, [](const RankContext& ctx) {
    for (bool checkpointing : {false, true}) {
      config::RunConfig c = testing::tiny_run_config(4, 2, kWorld, 1);
      c.sequence.length = 16;
      c.sequence.grad_accum = 2;
      auto mesh = comm::DeviceMesh::create_for_test(
          ctx.rank, ctx.world, ctx.store_path + (checkpointing ? "-ckpt" : ""), kWorld, 1);
      data::DataLoader loader(c.data, c.sequence, c.model.vocab_size, kWorld, ctx.rank, 1, 0);
      const std::vector<data::Batch> batches = {loader.micro_batch(1, 0), loader.micro_batch(1, 1)};
      std::vector<at::Tensor> want;
      double want_loss = 0;
      for (bool overlap : {false, true}) {
        model::LlamaForCausalLM model = train::build_model(c, mesh, at::Device(at::kCPU), nullptr);
        GradientBuffers buffers(model->parameters());
        std::shared_ptr<LayerAllReduce> hooks;
        GradientOptions options;
        options.buffers = &buffers;
        if (overlap) {
          hooks = std::make_shared<LayerAllReduce>(model, buffers, mesh.world(), 64);
          memory::enable_layer_hooks(model, false, checkpointing, hooks);
          options.layer_all_reduce = hooks.get();
        }
        options.reduce = !checkpointing;  // as stage 1 does: the sum comes after
        const StepLoss loss = compute_gradients(model, batches, mesh, options);
        if (!options.reduce) buffers.all_reduce(mesh.world(), 64);
        if (!overlap) {
          for (const auto& g : buffers.grads()) want.push_back(g.clone());
          want_loss = loss.loss;
          continue;
        }
        EXPECT_EQ(buffers.ranges_started(), c.model.num_layers);
        EXPECT_EQ(loss.loss, want_loss);
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_TRUE(at::equal(buffers.grads()[i], want[i])) << i << " ckpt " << checkpointing;
        }
      }
    }
  });
}

// on_host (optimizer offload, stage 0) over 3 real Gloo ranks with 256-byte buckets (more than
// 10 of them): the end-of-step all-reduce keeps at most 2 buckets (512 bytes) on the wire at once,
// bucket i + 2 starting after bucket i came back, and its sums and loss equal those of on-device
// buffers reduced with every bucket started at once, bit for bit (both sum the same three fp32
// values per element; Gloo's order is the same).
constexpr int64_t kHostBucketBytes = 256;

TEST(GradientBuffers, OnHostAllReduceKeepsAtMostTwoBucketsOnTheWireWithTheSameSums) {
  constexpr int kWorld = 3;
  run_ranks(kWorld, [](const RankContext& ctx) {
    config::RunConfig c = testing::tiny_run_config(4, 2, kWorld, 1);
    c.sequence.length = 16;
    c.sequence.grad_accum = 2;
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, kWorld, 1);
    data::DataLoader loader(c.data, c.sequence, c.model.vocab_size, kWorld, ctx.rank, 1, 0);
    const std::vector<data::Batch> batches = {loader.micro_batch(1, 0), loader.micro_batch(1, 1)};
    model::LlamaForCausalLM device_model =
        train::build_model(c, mesh, at::Device(at::kCPU), nullptr);
    model::LlamaForCausalLM host_model = train::build_model(c, mesh, at::Device(at::kCPU), nullptr);
    GradientBuffers device_buffers(device_model->parameters());
    GradientBuffers host_buffers(host_model->parameters(), /*shards=*/1, /*on_host=*/true);
    GradientOptions options;
    options.bucket_bytes = kHostBucketBytes;
    options.buffers = &device_buffers;
    const StepLoss want = compute_gradients(device_model, batches, mesh, options);
    options.buffers = &host_buffers;
    EXPECT_EQ(host_buffers.host_buckets_in_flight_max(), 0);
    const StepLoss got = compute_gradients(host_model, batches, mesh, options);
    ASSERT_GT(host_buffers.bytes(), 10 * kHostBucketBytes) << "the case needs many buckets";
    EXPECT_EQ(host_buffers.host_buckets_in_flight_max(), 2);
    EXPECT_LE(host_buffers.host_bytes_in_flight_max(), 2 * kHostBucketBytes);
    EXPECT_GT(host_buffers.host_bytes_in_flight_max(), kHostBucketBytes);
    EXPECT_EQ(got.loss, want.loss);
    ASSERT_EQ(host_buffers.grads().size(), device_buffers.grads().size());
    for (size_t i = 0; i < host_buffers.grads().size(); ++i) {
      EXPECT_TRUE(host_buffers.grads()[i].is_cpu());
      EXPECT_TRUE(at::equal(host_buffers.grads()[i], device_buffers.grads()[i])) << "param " << i;
    }
  });
}

// on_host (optimizer offload): every parameter, fp32 ones too, goes through the hook, so .grad()
// is released after each contribution and the sums live in the host buffers. The sums equal the
// on-device buffers' bit for bit (same fp32 adds in the same order; random values, no tolerance).
// With host parameters the sums beside the parameters and their moves to the host buffers are
// plain copies; with CUDA parameters the same steps are asynchronous copies on a side stream.
TEST(GradientBuffers, OnHostSumsEqualTheDeviceBuffersBitForBit) {
  at::manual_seed(5);
  const at::Tensor init32 = at::randn({5, 3});
  const at::Tensor init16 = at::randn({7}).to(at::kBFloat16);
  at::Tensor a = init32.clone().requires_grad_(true), b = init16.clone().requires_grad_(true);
  at::Tensor a_host = init32.clone().requires_grad_(true);
  at::Tensor b_host = init16.clone().requires_grad_(true);
  GradientBuffers device_buffers({a, b});
  GradientBuffers host_buffers({a_host, b_host}, /*shards=*/1, /*on_host=*/true);
  for (int k = 0; k < 4; ++k) {
    const at::Tensor x = at::randn({5, 3}), y = at::randn({7}).to(at::kBFloat16);
    ((a * a * x).sum() + (b * y).sum().to(at::kFloat)).backward();
    ((a_host * a_host * x).sum() + (b_host * y).sum().to(at::kFloat)).backward();
    EXPECT_FALSE(a_host.grad().defined()) << "an on-host fp32 gradient must not stay in .grad()";
  }
  ASSERT_TRUE(a.grad().is_same(device_buffers.grads()[0])) << "device fp32: .grad() is the view";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(host_buffers.grads()[i].is_cpu());
    EXPECT_EQ(host_buffers.grads()[i].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(host_buffers.grads()[i], device_buffers.grads()[i])) << "param " << i;
  }
  // The next step, in which only `a` gets a gradient: zero() leaves the host buffers as they are
  // (each first sum of a step replaces what is there), settle() zeros what got no sum.
  host_buffers.zero();
  device_buffers.zero();
  const at::Tensor x = at::randn({5, 3});
  (a * a * x).sum().backward();
  (a_host * a_host * x).sum().backward();
  host_buffers.settle();
  EXPECT_TRUE(at::equal(host_buffers.grads()[0], device_buffers.grads()[0]));
  EXPECT_EQ(host_buffers.grads()[1].abs().sum().item<float>(), 0.0f) << "no sum: zeroed";
  host_buffers.zero();
  host_buffers.settle();  // a step without any gradient
  EXPECT_EQ(host_buffers.grads()[0].abs().sum().item<float>(), 0.0f);
  host_buffers.copy_to_param_grads();  // the parameter's device and dtype
  EXPECT_EQ(a_host.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(b_host.grad().scalar_type(), at::kBFloat16);
}

// Contributions that arrive while a ContributionWindow is open are summed beside the parameter and
// reach the host buffer once, when the outermost window closes; outside a window each one reaches
// it at once. The sums stay equal to the device buffers' bit for bit, starting from the host sum
// so far. (256 + 255 ones: 511 is exact in fp32, where bf16 accumulation would stop at 256.)
TEST(GradientBuffers, OnHostContributionsOfAWindowReachTheHostOnceItCloses) {
  at::Tensor w = at::zeros({4}, at::kBFloat16).requires_grad_(true);
  at::Tensor reference = at::zeros({4}, at::kBFloat16).requires_grad_(true);
  GradientBuffers host({w}, /*shards=*/1, /*on_host=*/true);
  GradientBuffers device({reference});
  const auto both = [&](double scale) {
    contribute(w, scale);
    contribute(reference, scale);
  };
  both(1.0);
  EXPECT_TRUE(at::equal(host.grads()[0], at::full({4}, 1.0f))) << "outside a window: at once";
  {
    sp::ContributionWindow outer;
    both(256.0);
    {
      sp::ContributionWindow inner;
      for (int i = 0; i < 255; ++i) both(1.0);
    }
    EXPECT_TRUE(at::equal(host.grads()[0], at::full({4}, 1.0f)))
        << "moved before the outermost window closed";
    EXPECT_FALSE(w.grad().defined());
  }
  EXPECT_TRUE(at::equal(host.grads()[0], at::full({4}, 512.0f))) << host.grads()[0];
  EXPECT_TRUE(at::equal(host.grads()[0], device.grads()[0]));

  // A window closed by an exception moves nothing; settle() moves what it left.
  try {
    sp::ContributionWindow window;
    both(2.0);
    throw std::runtime_error("backward failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(at::equal(host.grads()[0], at::full({4}, 512.0f)));
  host.settle();
  EXPECT_TRUE(at::equal(host.grads()[0], at::full({4}, 514.0f)));
  EXPECT_TRUE(at::equal(host.grads()[0], device.grads()[0]));
  both(1.0);  // the next window registers again
  EXPECT_TRUE(at::equal(host.grads()[0], at::full({4}, 515.0f)));
}

// A tiled computation (one backward per tile) opens the window itself: its weight gets the tiles'
// sum in one move, equal bit for bit to the device buffers' tile-by-tile sum (random values).
TEST(GradientBuffers, OnHostTiledWeightsMatchTheDeviceBuffersBitForBit) {
  at::manual_seed(11);
  const at::Tensor init = at::randn({6, 6}).to(at::kBFloat16);  // [h, h]
  const at::Tensor x = at::randn({2, 10, 6}).to(at::kBFloat16);  // [bs, T, h]
  at::Tensor w_host = init.clone().requires_grad_(true);
  at::Tensor w_device = init.clone().requires_grad_(true);
  GradientBuffers host({w_host}, /*shards=*/1, /*on_host=*/true);
  GradientBuffers device({w_device});
  for (at::Tensor* w : {&w_host, &w_device}) {
    const at::Tensor weight = *w;
    const sp::TiledFn fn = [weight](const std::vector<at::Tensor>& shards,
                                    const std::vector<at::Tensor>&) {
      return at::matmul(shards[0], weight).tanh();  // [bs, T_i, h]
    };
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      sp::sequence_tiled_compute(fn, /*shards=*/4, {x}).to(at::kFloat).sum().backward();
    }
  }
  EXPECT_FALSE(w_host.grad().defined());
  EXPECT_TRUE(at::equal(host.grads()[0], device.grads()[0]))
      << (host.grads()[0] - device.grads()[0]).abs().max();
}

// A ZeRO optimizer with optimizer offload over a tiny bf16 model on the CPU, with what it holds.
struct OffloadedZero {
  model::LlamaForCausalLM model;
  std::unique_ptr<GradientBuffers> buffers;  // stage 1
  std::unique_ptr<ZeroPartition> partition;  // stages 2 and 3
  std::unique_ptr<ZeroOptimizer> zero;
};

constexpr int64_t kZeroBucketBytes = 512;  // stage 1: several gathers; 2/3: parameters in parts

std::unique_ptr<OffloadedZero> offloaded_zero(const config::RunConfig& c, comm::DeviceMesh& mesh,
                                              int stage, const ZeroStaging& staging) {
  auto z = std::make_unique<OffloadedZero>(
      OffloadedZero{build_model(c, mesh, at::Device(at::kCPU)), nullptr, nullptr, nullptr});
  if (stage == 1) {
    z->buffers = std::make_unique<GradientBuffers>(z->model->parameters(), mesh.world().size());
    z->zero = std::make_unique<ZeroOptimizer>(*z->buffers, mesh.world(), c.optim,
                                              OptimizerPlacement::kHost, kZeroBucketBytes, staging);
  } else {
    z->partition = std::make_unique<ZeroPartition>(z->model, mesh.world(), stage, kZeroBucketBytes);
    z->partition->release_all();  // stage 3: shards only
    z->zero = std::make_unique<ZeroOptimizer>(*z->partition, c.optim, OptimizerPlacement::kHost,
                                              staging);
  }
  return z;
}

// Optimizer offload at ZeRO stages 1, 2 and 3 on 2 Gloo ranks with bf16 weights. With
// stage_host_parameters a CPU run takes the device path: every updated weight reaches the weights
// through AdamW's staging buffers (converted there, in pieces of at most 256 bytes), so the staged
// bytes are exactly this rank's shards in bf16, and no copy goes around them (none from the fp32
// masters, none blocking). Weights and optimizer state equal the plain CPU path's bit for bit
// after two steps of random gradient shards, and the stage-2/3 weight shards are the fp32 masters
// rounded to bf16 (what a copy_ from the masters gave). The plain path copies nothing: its
// masters and weights share the host.
TEST(ZeroOffload, UpdatedWeightsGoThroughTheStagingBuffersAtStages1To3) {
  constexpr int kWorld = 2;
  run_ranks(kWorld, [](const RankContext& ctx) {
    config::RunConfig c = testing::tiny_run_config(4, 2, kWorld, 1);
    c.memory.precision = "bf16";
    c.optim.lr = 1e-2;
    c.optim.weight_decay = 0.1;
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, kWorld, 1);
    for (int stage : {1, 2, 3}) {
      const std::string what = "stage " + std::to_string(stage);
      auto plain = offloaded_zero(c, mesh, stage, ZeroStaging{});
      auto staged = offloaded_zero(c, mesh, stage, ZeroStaging{256, true});
      for (int64_t step = 1; step <= 2; ++step) {
        for (OffloadedZero* z : {plain.get(), staged.get()}) {
          at::manual_seed(100 * stage + 10 * step + ctx.rank);  // the same for both
          for (const at::Tensor& g : z->zero->shard_grads()) g.copy_(at::randn(g.sizes()));
          z->zero->step(c.optim.lr);
        }
      }
      int64_t shard_bf16_bytes = 0;
      for (const at::Tensor& g : staged->zero->shard_grads()) shard_bf16_bytes += g.numel() * 2;
      for (const at::Tensor& p : staged->model->parameters()) {
        ASSERT_EQ(p.scalar_type(), at::kBFloat16) << what;
      }
      const UploadStats& up = staged->zero->last_step_uploads();
      EXPECT_EQ(up.staged_bytes, shard_bf16_bytes) << what;
      EXPECT_GE(up.staged, shard_bf16_bytes / 256) << what;
      EXPECT_EQ(up.direct, 0) << what;
      EXPECT_EQ(up.blocking, 0) << what;
      EXPECT_EQ(up.blocking_bytes, 0) << what;
      const UploadStats& none = plain->zero->last_step_uploads();
      EXPECT_EQ(none.staged + none.direct + none.blocking, 0) << what;

      if (stage == 3) {
        plain->partition->gather_all();
        staged->partition->gather_all();
      }
      const std::vector<at::Tensor> want = plain->model->parameters();
      const std::vector<at::Tensor> got = staged->model->parameters();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(at::equal(got[i], want[i])) << what << " parameter " << i;
      }
      const NamedTensors want_state = plain->zero->state_tensors();
      const NamedTensors got_state = staged->zero->state_tensors();
      ASSERT_EQ(got_state.size(), want_state.size()) << what;
      std::map<std::string, at::Tensor> masters;
      for (size_t k = 0; k < want_state.size(); ++k) {
        EXPECT_EQ(got_state[k].first, want_state[k].first) << what;
        EXPECT_TRUE(at::equal(got_state[k].second, want_state[k].second))
            << what << " " << want_state[k].first;
        const std::string& name = want_state[k].first;
        if (name.size() > 7 && name.compare(name.size() - 7, 7, ".master") == 0) {
          EXPECT_TRUE(masters.emplace(name, want_state[k].second).second) << what << " " << name;
        }
      }
      EXPECT_EQ(masters.size(), plain->zero->shard_grads().size()) << what << ": one master each";
      if (stage == 3) {
        plain->partition->release_all();
        staged->partition->release_all();
        // A streamed save: every rank joins each part's gather, only rank 0 (the writer) copies
        // the parts to the host, the model's bf16 bytes.
        int64_t weight_bytes = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          weight_bytes += staged->partition->param_numel(i) * 2;
        }
        const int64_t before = streamed_save_host_bytes();
        save_checkpoint(ctx.temp_dir + "/step-2", staged->model, c.model, nullptr, TrainerState{},
                        mesh.world(), staged->zero.get());
        EXPECT_EQ(streamed_save_host_bytes() - before, ctx.rank == 0 ? weight_bytes : 0);
      }
      if (stage == 1) continue;
      for (size_t i = 0; i < want.size(); ++i) {
        const at::Tensor master = masters.at("zero.param" + std::to_string(i) + ".master");
        const at::Tensor shard = staged->partition->weight_values(i);  // [S_i] bf16
        for (const ZeroPartition::ShardPiece& piece : staged->partition->shard_pieces(i)) {
          EXPECT_TRUE(at::equal(shard.narrow(0, piece.shard_offset, piece.length),
                                master.narrow(0, piece.shard_offset, piece.length)
                                    .to(at::kBFloat16)))
              << what << " parameter " << i;
        }
      }
    }
  });
}

}  // namespace
}  // namespace ulysses::train
