// The cost model (tuner/costmodel/): every memory component of a tiny model against a hand
// computation, how the components combine into the peak, the time model's work counts, and the
// least-squares calibration recovering known coefficients from synthetic measurements.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "common/error.h"
#include "config/presets.h"
#include "config/run_config.h"
#include "tuner/costmodel/calibration.h"
#include "tuner/costmodel/fit.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/costmodel/time_model.h"
#include "costmodel_test_util.h"

namespace ulysses::costmodel {
namespace {

// h 8, L 2, hq 2, hkv 1, hd 4, ffn 16, V 32. P = 32x8 (embeddings) + 2 x (8x8 + 2x8x4 + 8x8
// attention + 3x8x16 MLP + 2x8 norms = 592) + 8 (final norm) + 32x8 (LM head) = 1704.
// sl 16 over sp 2: T = 8 local tokens, qd = 8, kvd = max(1, 2) x 4 = 8 (KV head replicated).
// One RMSNorm saves per token (model/rms_norm.cpp) its input and its output in the model dtype
// (2h x d) and 1/rms in fp32 (4 B): fp32 2 x 8 x 4 + 4 = 68 B, bf16 2 x 8 x 2 + 4 = 36 B. A layer
// with a tiled MLP saves two norms and (3qd + 2kvd) = 40 elements: fp32 2 x 68 + 40 x 4 = 296 B
// per token.
config::RunConfig tiny() { return testing::tiny_run(); }

std::map<std::string, int64_t> by_name(const MemoryPrediction& p) {
  std::map<std::string, int64_t> m;
  for (const MemoryTerm& t : p.terms) m[t.name] = t.bytes;
  return m;
}

MemoryCoefficients k_test() {
  MemoryCoefficients k;
  k.runtime_bytes = 1000, k.allocator_fraction = 0.1;
  return k;
}

// ZeRO over a world of 4 (dp 2 x sp 2), fp32 on CPU: P = 1704, one layer 592 parameters.
config::RunConfig tiny_zero(int64_t stage) {
  config::RunConfig c = tiny();
  c.mesh.dp = 2;
  c.zero.stage = stage;
  return c;
}

TEST(CostModel, ParameterCountByHand) { EXPECT_EQ(parameter_count(tiny().model), 1704); }

TEST(CostModel, EveryComponentOfTheTinyModelByHand) {
  const MemoryPrediction p = predict_memory(tiny(), k_test());
  const std::map<std::string, int64_t> m = by_name(p);
  EXPECT_EQ(m.at("runtime"), 1000);
  EXPECT_EQ(m.at("weights"), 1704 * 4);                // fp32
  EXPECT_EQ(m.at("gradients"), 1704 * 4);              // fp32 flat buffers
  EXPECT_EQ(m.at("gradient reduction buffer"), 1704 * 4);  // one bucket > 4P: all of it
  EXPECT_EQ(m.at("adam moments"), 1704 * 8);
  EXPECT_EQ(m.count("fp32 master weights"), 0u);       // an fp32 parameter is its own master
  // No checkpointing, tiled MLP: L x 296 B x T.
  EXPECT_EQ(m.at("activations"), 2 * 296 * 8);
  EXPECT_EQ(m.at("layer backward"), (8 + 2 * 8 + 8) * 8 * 4);  // (qd + 2kvd + h) x T x 4
  // Embedding output and hidden-state gradient 2h x 4 B, and the final norm's 68 B, per token.
  EXPECT_EQ(m.at("residual stream"), (2 * 8 * 4 + 68) * 8);
  EXPECT_EQ(m.at("tiled MLP tile"), 6 * 16 * 4 * 4);   // 6 ffn x ceil(8 / 2) tokens x 4 B
  // Loss tile: fp32 logits and their softmax [4, 32] + grad W [32, 8] + grad hidden [8, 8].
  EXPECT_EQ(m.at("loss tile"), 8 * 4 * 32 + 32 * 8 * 4 + 8 * 8 * 4);
  EXPECT_EQ(m.at("all-to-all buffers"), 2 * 8 * (8 + 16) * 4);
  EXPECT_EQ(m.count("attention scores"), 0u);  // auto = SDPA: no [sl, sl] scores
  // The device AdamW off CUDA: two fp32 temporaries of min(4M, largest parameter [V, h] = 256).
  EXPECT_EQ(m.at("optimizer step"), 2 * 256 * 4);
  // Peak = static + saved + the largest transient (the loss tile) + 10 % of the dynamic part (the
  // optimizer step's 2048 B come after backward and stay below saved + tile).
  const int64_t stat = 1000 + 6816 + 6816 + 6816 + 13632, saved = 4736 + 1056, tile = 2304;
  EXPECT_EQ(p.largest_transient, "loss tile");
  EXPECT_EQ(m.at("allocator overhead"), static_cast<int64_t>(0.1 * (stat - 1000 + saved + tile)));
  EXPECT_EQ(p.peak_bytes, static_cast<int64_t>(stat + saved + tile + 0.1 * (stat - 1000 + saved + tile)));
  EXPECT_EQ(p.host_bytes, 0);
}

TEST(CostModel, CheckpointingKeepsLayerInputsAndRecomputesOneLayer) {
  config::RunConfig c = tiny();
  c.memory.offload_activations = true;  // implies checkpointing; on CPU it stays in memory
  const std::map<std::string, int64_t> m = by_name(predict_memory(c, k_test()));
  EXPECT_EQ(m.count("activations"), 0u);
  EXPECT_EQ(m.at("checkpoints"), 2 * 8 * 8 * 4);              // L x T x h x 4 B
  EXPECT_EQ(m.at("layer recompute"), (296 + 32 * 4) * 8);    // saved set + gradients
}

TEST(CostModel, UntiledLossMathAttentionAndPackedMask) {
  config::RunConfig c = tiny();
  c.memory.tiled_loss.value = 1;
  c.memory.tiled_mlp.value = 1;
  c.attention.backend = "math";
  c.data.pack = true;
  const MemoryPrediction p = predict_memory(c, k_test());
  const std::map<std::string, int64_t> m = by_name(p);
  EXPECT_EQ(m.at("logits"), 12 * 8 * 32);  // fp32 logits, log-softmax, gradient [8, 32]
  const int64_t probs = 1 * 1 * 16 * 16 * 4;  // bs x hq/sp x sl^2 x 4 B
  EXPECT_EQ(m.at("attention scores"), 2 * probs);
  // Untiled MLP adds 4 ffn per token and layer to the saved set, 2 ffn to the gradients.
  EXPECT_EQ(m.at("activations"), 2 * (296 + 64 * 4) * 8 + 2 * probs);
  EXPECT_EQ(m.at("layer backward"), (32 + 32) * 8 * 4 + probs);
  // Each layer's masked_fill_ keeps its bool mask [bs, sl, sl] (packed).
  EXPECT_EQ(m.at("attention masks"), 2 * 16 * 16);
  EXPECT_EQ(m.count("tiled MLP tile"), 0u);
  // Math attention computes in fp32 whatever the model dtype: bf16 keeps fp32 probabilities.
  c.memory.precision = "bf16";
  EXPECT_EQ(by_name(predict_memory(c, k_test())).at("attention scores"), 2 * probs);
  // Unpacked, each layer keeps the causal mask [sl, sl].
  c.data.pack = false;
  EXPECT_EQ(by_name(predict_memory(c, k_test())).at("attention masks"), 2 * 16 * 16);
}

// Packed batches through SDPA (model/sdpa_attention.cpp): while bs x sl^2 is within 64 Mi a dense
// bool mask [bs, 1, sl, sl] serves, which SDPA turns into an additive mask in the model dtype and
// keeps for backward, one per layer; beyond it each document runs on its own and no mask exists.
TEST(CostModel, PackedSdpaKeepsADenseMaskPerLayerUpTo64Mi) {
  config::RunConfig c = tiny();
  c.data.pack = true;
  std::map<std::string, int64_t> m = by_name(predict_memory(c, k_test()));
  EXPECT_EQ(m.at("attention masks"), 2 * 16 * 16 * 4);  // L x bs x sl^2 x 4 B (fp32)
  EXPECT_EQ(m.count("attention scores"), 0u);
  c.memory.precision = "bf16";
  EXPECT_EQ(by_name(predict_memory(c, k_test())).at("attention masks"), 2 * 16 * 16 * 2);
  // With checkpointing only the recomputed layer holds one.
  config::RunConfig ckpt = c;
  ckpt.memory.checkpointing = true;
  config::RunConfig ckpt_plain = ckpt;
  ckpt_plain.data.pack = false;
  EXPECT_EQ(by_name(predict_memory(ckpt, k_test())).count("attention masks"), 0u);
  EXPECT_EQ(by_name(predict_memory(ckpt, k_test())).at("layer recompute"),
            by_name(predict_memory(ckpt_plain, k_test())).at("layer recompute") + 16 * 16 * 2);
  // sl 8192 at bs 1 is exactly 64 Mi elements: dense; two more positions are not.
  c.sequence.length = 8192;
  EXPECT_EQ(by_name(predict_memory(c, k_test())).at("attention masks"),
            int64_t{2} * 8192 * 8192 * 2);
  c.sequence.length = 8194;
  EXPECT_EQ(by_name(predict_memory(c, k_test())).count("attention masks"), 0u);
  // Not packed: no mask (causal SDPA).
  c.sequence.length = 16;
  c.data.pack = false;
  EXPECT_EQ(by_name(predict_memory(c, k_test())).count("attention masks"), 0u);
}

TEST(CostModel, OptimizerAndCheckpointOffloadMoveToTheHostOnCuda) {
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  c.memory.offload_optimizer = true;
  c.memory.offload_activations = true;
  MemoryCoefficients k;
  k.allocator_fraction = 0;
  const MemoryPrediction p = predict_memory(c, k);
  const std::map<std::string, int64_t> m = by_name(p);
  EXPECT_EQ(m.at("weights"), 1704 * 2);
  EXPECT_EQ(m.at("gradients"), 1704 * 4);  // fp32 whatever the weights' dtype
  // Host: moments 8P + masters 4P + the gradients 4P + two 64 MiB buffers the bf16 weights go
  // back through + checkpoints L x T x h x 2 B, each checkpoint (8 x 8 x 2 = 128 B) in a
  // page-locked block of whole 4 KiB pages.
  constexpr int64_t kStagingBuffer = int64_t{64} << 20;
  EXPECT_EQ(p.host_bytes, 1704 * 16 + 2 * kStagingBuffer + 2 * 4096);
  EXPECT_EQ(m.at("checkpoints (offloaded)"), 2 * 4096);
  // memory.offload_gradients false: the gradients stay on the device (4P there), the host holds
  // 12P and two more buffers they stream through.
  c.memory.offload_gradients = false;
  const MemoryPrediction device_grads = predict_memory(c, k);
  EXPECT_EQ(device_grads.host_bytes, 1704 * 12 + 4 * kStagingBuffer + 2 * 4096);
  const auto gradients = std::find_if(device_grads.terms.begin(), device_grads.terms.end(),
                                      [](const auto& t) { return t.name == "gradients"; });
  ASSERT_NE(gradients, device_grads.terms.end());
  EXPECT_EQ(gradients->bytes, 1704 * 4);
  EXPECT_EQ(gradients->location, Location::kDevice);
}

// memory.precision bf16-states keeps transformers' numerics: bf16 gradient buffers and moments,
// no fp32 masters: 6 B per parameter beyond the bf16 weights where bf16 keeps 16.
TEST(CostModel, Bf16StatesCountBf16GradientsAndMomentsAndNoMasters) {
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  MemoryCoefficients k;
  k.allocator_fraction = 0;
  const std::map<std::string, int64_t> masters = by_name(predict_memory(c, k));
  EXPECT_EQ(masters.at("gradients"), 1704 * 4);
  EXPECT_EQ(masters.at("adam moments"), 1704 * 8);
  EXPECT_EQ(masters.at("fp32 master weights"), 1704 * 4);
  c.memory.precision = "bf16-states";
  const MemoryPrediction p = predict_memory(c, k);
  const std::map<std::string, int64_t> states = by_name(p);
  EXPECT_EQ(states.at("weights"), 1704 * 2);
  EXPECT_EQ(states.at("gradients"), 1704 * 2);
  EXPECT_EQ(states.at("adam moments"), 1704 * 4);
  EXPECT_EQ(states.count("fp32 master weights"), 0u);
  // sp 2: the sum over the ranks stages one bucket of the bf16 buffer (here all of it).
  EXPECT_EQ(masters.at("gradient reduction buffer"), 1704 * 4);
  EXPECT_EQ(states.at("gradient reduction buffer"), 1704 * 2);
  // Activations are those of bf16: every other term is the same.
  for (const auto& [name, bytes] : states) {
    if (name == "gradients" || name == "adam moments" || name == "gradient reduction buffer") {
      continue;
    }
    EXPECT_EQ(bytes, masters.at(name)) << name;
  }
  // The sweep's lower bound counts the same state.
  std::map<std::string, int64_t> lb;
  for (const MemoryTerm& t : lower_bound_peak(c).terms) lb[t.name] = t.bytes;
  EXPECT_EQ(lb.at("gradients"), 1704 * 2);
  EXPECT_EQ(lb.at("adam moments"), 1704 * 4);
  EXPECT_EQ(lb.count("fp32 master weights"), 0u);
  EXPECT_LE(lower_bound_peak(c).total_bytes(), p.peak_bytes);
}

TEST(CostModel, Bf16RmsNormSavesItsInputInBf16) {
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  const std::map<std::string, int64_t> m = by_name(predict_memory(c, k_test()));
  // A bf16 norm saves 36 B per token (its input and output 2 x 8 x 2 and 1/rms 4), not an fp32
  // copy of its input. Layer: 2 x 36 + 40 x 2 B = 152 B per token.
  EXPECT_EQ(m.at("activations"), 2 * 152 * 8);
  EXPECT_EQ(m.at("residual stream"), (2 * 8 * 2 + 36) * 8);
}

// bf16: the loss tile's weight gradient is still an fp32 sum over the tiles, plus one bf16
// product block of min(V, 8192) rows: fp32 logits and softmax [4, 32] (the bf16 logit gradient
// takes the freed logits' place) + fp32 grad W [32, 8] + bf16 block [32, 8] + bf16 grad hidden
// [8, 8].
TEST(CostModel, Bf16LossTileSumsTheWeightGradientInFp32) {
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  const std::map<std::string, int64_t> m = by_name(predict_memory(c, k_test()));
  EXPECT_EQ(m.at("loss tile"), 8 * 4 * 32 + 32 * 8 * 4 + 32 * 8 * 2 + 8 * 8 * 2);
}

// CUDA's caching allocator keeps the layers' blocks (at most fp32 [T, max(h, qd)] = 4 x 8 x 8 =
// 256 B here) while the loss asks for larger ones (a tile's fp32 logits, 4 x 4 x 32 = 512 B): the
// peak holds the largest layer working set beside the loss tile. Not on CPU, and not when the
// loss's tiles are as small as the layers' blocks (8 tiles of one row: 128 B).
TEST(CostModel, CudaKeepsTheLayerBlocksBesideLargerLossBlocks) {
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  MemoryCoefficients k;
  k.allocator_fraction = 0;
  const MemoryPrediction p = predict_memory(c, k);
  const std::map<std::string, int64_t> m = by_name(p);
  // The largest layer working set: the tiled MLP tile 6 ffn x 4 tokens x 2 B = 768 (the
  // all-to-all buffers 2 x 8 x 24 x 2 B are as large); the loss tile 2688.
  EXPECT_EQ(m.at("tiled MLP tile"), 768);
  EXPECT_EQ(m.at("cached layer blocks"), 768);
  EXPECT_EQ(p.largest_transient, "loss tile");
  int64_t stat = 0, saved = 0;
  for (const MemoryTerm& t : p.terms) {
    if (t.location != Location::kDevice) continue;
    if (t.lifetime == Lifetime::kStatic) stat += t.bytes;
    if (t.lifetime == Lifetime::kSaved) saved += t.bytes;
  }
  EXPECT_EQ(p.peak_bytes, stat + saved + 2688 + 768);
  config::RunConfig small_tiles = c;
  small_tiles.memory.tiled_loss.value = 8;
  EXPECT_EQ(by_name(predict_memory(small_tiles, k)).count("cached layer blocks"), 0u);
  config::RunConfig cpu = c;
  cpu.train.device = "cpu";
  EXPECT_EQ(by_name(predict_memory(cpu, k)).count("cached layer blocks"), 0u);
}

TEST(CostModel, OffloadedCheckpointsTakeWholePagesOfTheirOwnSize) {
  EXPECT_EQ(pinned_block_bytes(1), 4096);
  EXPECT_EQ(pinned_block_bytes(192), 4096);
  EXPECT_EQ(pinned_block_bytes(4096), 4096);
  EXPECT_EQ(pinned_block_bytes(4097), 8192);
  EXPECT_EQ(pinned_block_bytes(int64_t{3} << 30), int64_t{3} << 30);  // not 4 GiB
  EXPECT_EQ(pinned_block_bytes((int64_t{2} << 30) + 8192 * 2), (int64_t{2} << 30) + 16384);
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  c.memory.offload_activations = true;
  c.sequence.length = 24;  // T = 12: a layer input is 12 x 8 x 2 B = 192 B, locked as a page
  MemoryCoefficients k;
  k.allocator_fraction = 0;
  const MemoryPrediction p = predict_memory(c, k);
  EXPECT_EQ(by_name(p).at("checkpoints (offloaded)"), 2 * 4096);
  EXPECT_EQ(p.host_bytes, 2 * 4096);
  // The optimizer's page-locked buffers keep their own size (common/pinned_host.h): moments 8 P,
  // masters 4 P, the host gradients 4 P and the two 64 MiB staging buffers come on top unrounded.
  c.memory.offload_optimizer = true;
  EXPECT_EQ(predict_memory(c, k).host_bytes, 16 * 1704 + 2 * (int64_t{64} << 20) + 2 * 4096);
}

// The device AdamW's temporaries (optim/adamw.cpp): none on CUDA (one fused kernel), elsewhere
// two fp32 tensors of one piece, min(4M elements, the largest tensor updated at once).
TEST(CostModel, DeviceOptimizerStepTransient) {
  EXPECT_EQ(kOptimizerPieceElements, 4194304);
  EXPECT_EQ(by_name(predict_memory(tiny(), k_test())).at("optimizer step"), 2 * 256 * 4);
  // Stage 1 updates one flat fp32 shard, ceil(1704 / 4) = 426 elements; stages 2-3 a shard of
  // each parameter, the largest ceil(256 / 4) = 64.
  EXPECT_EQ(by_name(predict_memory(tiny_zero(1), k_test())).at("optimizer step"), 2 * 426 * 4);
  EXPECT_EQ(by_name(predict_memory(tiny_zero(2), k_test())).at("optimizer step"), 2 * 64 * 4);
  EXPECT_EQ(by_name(predict_memory(tiny_zero(3), k_test())).at("optimizer step"), 2 * 64 * 4);
  config::RunConfig big_vocab = tiny();
  big_vocab.model.vocab_size = 1 << 20;  // [V, h] = 8M elements: capped at one piece
  EXPECT_EQ(by_name(predict_memory(big_vocab, k_test())).at("optimizer step"), 2 * 4194304 * 4);
  config::RunConfig cuda = tiny();
  cuda.train.device = "cuda";
  EXPECT_EQ(by_name(predict_memory(cuda, k_test())).at("optimizer step"), 0);
  config::RunConfig offloaded = tiny();
  offloaded.memory.offload_optimizer = true;  // the host pass, in cache-sized chunks
  EXPECT_EQ(by_name(predict_memory(offloaded, k_test())).count("optimizer step"), 0u);
}

// The overlapped host update (optim.overlap_host_update true, or auto on a GPU) keeps each parameter's
// weights and moments aside while it updates during backward: 12 B per parameter of host memory,
// at stage 0 with the gradients on the host only; at stages 1-3 (true, on a CPU run, where the
// gradient shards are on the host) 12 B per parameter of the rank's shard.
TEST(CostModel, OverlappedHostUpdateKeepsTwelveBytesPerParameterOnTheHost) {
  config::RunConfig c = tiny();
  c.train.device = "cuda";
  c.memory.offload_optimizer = true;
  c.optim.overlap_host_update = "auto";
  const int64_t p = parameter_count(c.model);
  const std::map<std::string, int64_t> kept = by_name(predict_memory(c, k_test()));
  EXPECT_EQ(kept.at("overlapped update's kept state"), 12 * p);
  c.optim.overlap_host_update = "false";
  EXPECT_EQ(by_name(predict_memory(c, k_test())).count("overlapped update's kept state"), 0u);
  EXPECT_EQ(predict_memory(c, k_test()).host_bytes + 12 * p,
            [&] {
              config::RunConfig on = c;
              on.optim.overlap_host_update = "true";
              return predict_memory(on, k_test()).host_bytes;
            }());
  c.optim.overlap_host_update = "auto";
  c.memory.offload_gradients = false;  // the gradients stay on the device: no overlap
  EXPECT_EQ(by_name(predict_memory(c, k_test())).count("overlapped update's kept state"), 0u);
  config::RunConfig cpu = tiny();  // auto does not overlap on a CPU
  cpu.memory.offload_optimizer = true;
  cpu.optim.overlap_host_update = "auto";
  EXPECT_EQ(by_name(predict_memory(cpu, k_test())).count("overlapped update's kept state"), 0u);
  c.memory.offload_gradients = true;  // the default, false: after backward, nothing kept
  c.optim = config::OptimOptions{};
  EXPECT_EQ(by_name(predict_memory(c, k_test())).count("overlapped update's kept state"), 0u);
  cpu.optim.overlap_host_update = "true";  // a CPU run at stage 0: the whole model's state
  EXPECT_EQ(by_name(predict_memory(cpu, k_test())).at("overlapped update's kept state"), 12 * p);
  for (int64_t stage : {1, 2, 3}) {  // a world of 4: this rank's shard, a quarter of P
    config::RunConfig zero = tiny_zero(stage);
    zero.memory.offload_optimizer = true;
    zero.optim.overlap_host_update = "true";
    EXPECT_EQ(by_name(predict_memory(zero, k_test())).at("overlapped update's kept state"),
              12 * p / 4)
        << "stage " << stage;
    zero.optim.overlap_host_update = "auto";  // auto overlaps on a GPU only
    EXPECT_EQ(by_name(predict_memory(zero, k_test())).count("overlapped update's kept state"), 0u);
    zero.train.device = "cuda";  // the gradient shards stay on the GPU: no overlap there
    zero.optim.overlap_host_update = "true";
    EXPECT_EQ(by_name(predict_memory(zero, k_test())).count("overlapped update's kept state"), 0u);
  }
}

// The step runs after backward freed the activations: the peak is static + the larger of
// (saved + largest transient) and the step's transient.
TEST(CostModel, OptimizerStepSetsThePeakWhenLargerThanBackward) {
  config::RunConfig c = tiny();
  c.model.vocab_size = 4096;       // P = 2 x 4096 x 8 + 2 x 592 + 8 = 66728
  c.memory.tiled_loss.value = 8;   // one row per loss tile
  ASSERT_EQ(parameter_count(c.model), 66728);
  const MemoryPrediction p = predict_memory(c, k_test());
  const std::map<std::string, int64_t> m = by_name(p);
  // Static: runtime, weights 4 P, gradients 4 P, reduction bucket 4 P, moments 8 P.
  const int64_t stat = 1000 + 20 * 66728;
  // Saved 5760 + 1312; the largest transient, the loss tile: 8 B x 1 x 4096 + grad W
  // 4096 x 8 x 4 + grad hidden 8 x 8 x 4 = 164096.
  EXPECT_EQ(m.at("loss tile"), 164096);
  const int64_t backward = 5760 + 1312 + 164096;
  // The step: 2 x [V, h] = 32768 elements x 4 B = 262144 > 171168.
  const int64_t step = 2 * 32768 * 4;
  EXPECT_EQ(m.at("optimizer step"), step);
  EXPECT_GT(step, backward);
  EXPECT_EQ(p.largest_transient, "optimizer step");
  EXPECT_EQ(p.peak_bytes, static_cast<int64_t>(stat + step + 0.1 * (stat - 1000 + step)));
}

TEST(CostModel, LowerBoundIsBelowTheFullModel) {
  const config::RunConfig c = tiny();
  MemoryCoefficients k;
  k.allocator_fraction = 0;
  EXPECT_LE(lower_bound_peak(c).total_bytes(), predict_memory(c, k).peak_bytes);
}

TEST(CostModel, StepWorkByHand) {
  config::RunConfig c = tiny();
  c.memory.tiled_mlp.value = 1;
  const StepWork w = step_work(c);
  // Per token forward: layers 2 x (2 x (64 + 64 + 64) + 2 x 3 x 8 x 16) = 2 x 1152, head 2 x 8 x 32.
  EXPECT_DOUBLE_EQ(w.matmul_flops, 8.0 * 3 * (2 * 1152 + 512));
  // Causal core: 2 x 2 x sl x qd / 2 = 256 per token and layer, x3 for backward.
  EXPECT_DOUBLE_EQ(w.attention_flops, 8.0 * 3 * 2 * 256);
  // a2a: 2 layers x T x (qd + 2kvd + qd) x 4 B x (sp - 1) / sp, forward + backward.
  EXPECT_DOUBLE_EQ(w.a2a_bytes, 2 * (8.0 * 32 * 4 / 2) * 2);
  EXPECT_DOUBLE_EQ(w.allreduce_bytes, 2 * 0.5 * 4 * 1704);
  c.memory.checkpointing = true;
  EXPECT_DOUBLE_EQ(step_work(c).matmul_flops, 8.0 * (3 * (2 * 1152 + 512) + 2 * 1152));
}

// An uneven head split is charged by the rank with the most heads: Qwen2.5-7B's 28 query heads
// over 4 KV heads (group 7) at sp 8 put 4, 4, 4, 4, 3, 3, 3, 3 query heads and 1, 2, 1, 2, 1, 2,
// 1, 1 KV heads on the ranks, so attention and the all-to-alls cost as for 32 query heads over 16
// KV heads split evenly (4 and 2 per rank), while the GEMMs stay those of the real model.
TEST(CostModel, UnevenHeadsChargeTheRankWithTheMostHeads) {
  config::RunConfig uneven;
  uneven.model = config::load_model_preset("qwen2.5-7b");
  uneven.mesh.sp = 8;
  uneven.mesh.uneven_heads = true;
  uneven.sequence.length = 8192;
  config::RunConfig even_32 = uneven;
  even_32.model.num_heads = 32;
  even_32.model.num_kv_heads = 16;
  const sp::HeadLoad most = a2a_heads(uneven.model, 8);
  EXPECT_EQ(most.q, 4);
  EXPECT_EQ(most.kv, 2);
  const StepWork w = step_work(uneven), w32 = step_work(even_32);
  EXPECT_DOUBLE_EQ(w.attention_flops, w32.attention_flops);
  EXPECT_DOUBLE_EQ(w.a2a_bytes, w32.a2a_bytes);
  EXPECT_LT(w.matmul_flops, w32.matmul_flops);  // 28 and 4 heads' projections, not 32 and 16
  EXPECT_LT(w.model_flops, w32.model_flops);    // MFU counts the real model's attention
  // A rank's attention is sl^2 x its query heads: at sp 4 (7 each, even) 7/4 of sp 8's 4.
  config::RunConfig sp4 = uneven;
  sp4.mesh.sp = 4;
  EXPECT_DOUBLE_EQ(w.attention_flops * 7 / 4, step_work(sp4).attention_flops);
  // The memory terms after the all-to-all follow the same rank.
  const auto memory = [](const config::RunConfig& c) {
    MemoryCoefficients k;
    return predict_memory(c, k).peak_bytes;
  };
  EXPECT_GT(memory(uneven), 0);
  EXPECT_LT(memory(uneven), memory(even_32));
}

// Ring attention at sp 8 = 2 x 4 (Llama-3.1-8B, 32 query / 8 KV heads): the all-to-all runs over
// 2 ranks, the ring passes each rank's K/V block ((R - 1) forward, (R - 1) + R fp32 gradients
// backward, the forward again for the recompute), and attention per rank is the all-to-all's.
TEST(CostModel, RingChargesTheKvPassAndTheSmallerAllToAll) {
  config::RunConfig c;
  c.model = config::load_model_preset("llama-3.1-8b");
  c.mesh.sp = 8;
  c.sequence.length = 65536;
  c.memory.precision = "bf16";
  c.train.device = "cuda";
  c.memory.checkpointing = true;
  config::RunConfig ring = c;
  ring.mesh.sp_ring.value = 4;
  const StepWork a2a = step_work(c), w = step_work(ring);
  EXPECT_EQ(a2a.ring_bytes, 0);
  const double tokens = 65536.0 / 8, hd = 128, kvd = 2 * 4 * hd;  // sp_a2a 2 x 4 KV heads each
  const double block_kv = tokens * 2 * kvd;
  const double per_layer = 3 * block_kv * 2 /*fwd*/ * 2 /*recompute*/ + 3 * block_kv * 2 +
                           4 * block_kv * 4;  // backward: blocks, fp32 gradients
  EXPECT_DOUBLE_EQ(w.ring_bytes, 32 * per_layer);
  // The all-to-all over 2 ranks sends half of each tensor; over 8 ranks 7/8 of it.
  const double qd = 32 * hd;
  EXPECT_DOUBLE_EQ(w.a2a_bytes, 32 * tokens * (qd + 2 * kvd + qd) * 2 * 0.5 * 3);
  EXPECT_DOUBLE_EQ(w.attention_flops, a2a.attention_flops);
  EXPECT_DOUBLE_EQ(w.matmul_flops, a2a.matmul_flops);
  // The pass hides behind the blocks' attention when it is shorter.
  TimeCoefficients k;
  k.ms_per_tflop = k.ms_per_tflop_attention = 1.0;
  k.ms_per_gb_a2a = 1.0;
  k.ms_per_gb_ring = 1e-6;
  TimePrediction p = predict_time(w, k);
  EXPECT_GT(p.ring_ms, 0);
  EXPECT_EQ(p.ring_exposed_ms, 0);
  k.ms_per_gb_ring = 1e6;
  p = predict_time(w, k);
  EXPECT_NEAR(p.ring_exposed_ms, p.ring_ms - w.attention_flops / 1e12, 1e-6 * p.ring_ms);
  // Memory: the ring's buffers are a transient of their own.
  const auto terms = by_name(predict_memory(ring, MemoryCoefficients{}));
  EXPECT_EQ(terms.count("ring attention buffers"), 1u);
  EXPECT_EQ(by_name(predict_memory(c, MemoryCoefficients{})).count("ring attention buffers"), 0u);
}

// SDPA on CUDA (model/sdpa_attention.cpp): where the memory-efficient kernel runs (fp32, the
// efficient backend, a packed batch's dense mask) it refuses native GQA, so K/V are expanded to the
// query heads and the layer keeps them at qd each; bf16 flash keeps them at kvd.
TEST(CostModel, CudaEfficientKernelKeepsKvExpandedToTheQueryHeads) {
  config::RunConfig c;
  c.model = config::load_model_preset("llama-3.1-8b");  // 32 query / 8 KV heads, hd 128, 32 layers
  c.mesh.sp = 8;  // 4 query heads and 1 KV head per rank: qd = 8 x 4 x 128, kvd = 8 x 1 x 128
  c.sequence.length = 8192;
  c.train.device = "cuda";
  c.memory.precision = "bf16";
  auto activations = [](const config::RunConfig& r) {
    return by_name(predict_memory(r, MemoryCoefficients{})).at("activations");
  };
  const int64_t tokens = 1024, qd = 4096, kvd = 1024;
  config::RunConfig efficient = c;
  efficient.attention.backend = "efficient";
  EXPECT_EQ(activations(efficient) - activations(c), 32 * tokens * 2 * (qd - kvd) * 2);
  config::RunConfig packed = c;  // bs x sl^2 = 64 Mi: the dense mask
  packed.data.pack = true;
  EXPECT_EQ(activations(packed) - activations(c), 32 * tokens * 2 * (qd - kvd) * 2);
  EXPECT_EQ(by_name(predict_memory(packed, MemoryCoefficients{})).at("attention masks"),
            int64_t{32} * 8192 * 8192 * 2);
  config::RunConfig fp32 = c, fp32_cpu = c;
  fp32.memory.precision = fp32_cpu.memory.precision = "fp32";
  fp32_cpu.train.device = "cpu";  // the CPU flash kernel takes GQA natively
  EXPECT_EQ(activations(fp32) - activations(fp32_cpu), 32 * tokens * 2 * (qd - kvd) * 4);
}

// Ring pairs (sp/ring_attention.cpp) hold no scores on the flash kernels, packed ones included
// (the varlen kernel over the documents both chunks hold); the math path holds three blocks of
// query rows [bs, hq/sp_a2a, rows, C] in fp32, rows capped by a 256 MiB block.
TEST(CostModel, RingScoresOnlyOnTheMathPathInCappedBlocks) {
  EXPECT_EQ(kRingMathScoreBlockBytes, int64_t{256} << 20);
  config::RunConfig c;
  c.model = config::load_model_preset("llama-3.1-8b");  // 32 query / 8 KV heads, hd 128
  c.mesh.sp = 8;
  c.mesh.sp_ring.value = 4;  // sp_a2a 2: 16 query heads per rank
  c.sequence.length = 65536;
  c.memory.precision = "bf16";
  c.train.device = "cuda";
  c.memory.checkpointing = true;
  c.data.pack = true;
  auto terms = [](const config::RunConfig& r) {
    return by_name(predict_memory(r, MemoryCoefficients{}));
  };
  EXPECT_EQ(terms(c).count("ring score blocks"), 0u);  // packed bf16 on CUDA: varlen flash
  EXPECT_EQ(terms(c).count("attention masks"), 0u);    // the ring masks no [sl, sl]
  // C = sp_a2a x T / 2 = 2 x 8192 / 2 = 8192 positions; one query row 16 x 8192 x 4 B = 512 KiB,
  // so a block takes 512 rows of the chunk's 8192: 256 MiB, three of them (not 3 x 16 x C^2 x 4 B
  // = 12 GiB).
  const int64_t row = 16 * 8192 * 4;
  config::RunConfig math = c;
  math.attention.backend = "math";
  EXPECT_EQ(terms(math).at("ring score blocks"), 3 * 512 * row);
  // fp32 on CUDA and the efficient backend take the math path too; the CPU flash kernel does not.
  config::RunConfig fp32 = c;
  fp32.memory.precision = "fp32";
  EXPECT_EQ(terms(fp32).at("ring score blocks"), 3 * 512 * row);
  config::RunConfig efficient = c;
  efficient.attention.backend = "efficient";
  EXPECT_EQ(terms(efficient).at("ring score blocks"), 3 * 512 * row);
  config::RunConfig cpu = fp32;
  cpu.train.device = "cpu";
  EXPECT_EQ(terms(cpu).count("ring score blocks"), 0u);
  // A head size the CUDA kernels refuse (not a multiple of 8).
  config::RunConfig odd = c;
  odd.model.head_dim = 100;
  EXPECT_EQ(terms(odd).at("ring score blocks"), 3 * 512 * (16 * 8192 * 4));
  // A short sequence: the whole chunk fits one block, [bs, 16, C, C] with C = 256.
  math.sequence.length = 2048;
  EXPECT_EQ(terms(math).at("ring score blocks"), 3 * 16 * 256 * 256 * 4);
}

TEST(CostModelZero, Stage1ShardsMomentsAndMastersOverTheWorld) {
  const std::map<std::string, int64_t> m = by_name(predict_memory(tiny_zero(1), k_test()));
  EXPECT_EQ(m.at("weights"), 1704 * 4);
  EXPECT_EQ(m.at("gradients"), 1704 * 4);
  EXPECT_EQ(m.at("adam moments"), 1704 * 8 / 4);
  EXPECT_EQ(m.at("fp32 master weights"), 1704 * 4 / 4);  // a flat fp32 shard even for fp32
  EXPECT_EQ(m.count("zero-3 gathered weights"), 0u);
  const StepWork w = step_work(tiny_zero(1));
  EXPECT_DOUBLE_EQ(w.allreduce_bytes, 2 * 0.75 * 4 * 1704);  // stage 1 still all-reduces
  EXPECT_DOUBLE_EQ(w.zero_reduce_bytes, 0);
  EXPECT_DOUBLE_EQ(w.zero_gather_bytes, 0.75 * 4 * 1704);    // updated fp32 shards
}

TEST(CostModelZero, Stage2ShardsTheGradientsAsBuilt) {
  const std::map<std::string, int64_t> m = by_name(predict_memory(tiny_zero(2), k_test()));
  ASSERT_TRUE(kZero2ShardsGradientBuffer);
  EXPECT_EQ(m.at("gradients"), 1704 * 4 / 4);  // zero/zero_partition.h: this rank's shard
  // The fp32 contributions of the unit in backward and of the one being reduce-scattered:
  // layer 592 + max(layer 592, V x h 256) parameters x 4 B.
  EXPECT_EQ(m.at("zero pending gradients"), 2 * 592 * 4);
  EXPECT_EQ(m.count("zero-3 gathered weights"), 0u);
  EXPECT_EQ(m.at("adam moments"), 1704 * 8 / 4);
  EXPECT_EQ(m.at("fp32 master weights"), 1704 * 4 / 4);
  const StepWork w = step_work(tiny_zero(2));
  EXPECT_DOUBLE_EQ(w.allreduce_bytes, 0);
  EXPECT_DOUBLE_EQ(w.zero_reduce_bytes, 0.75 * 4 * 1704);  // reduce-scatter: half an all-reduce
  EXPECT_DOUBLE_EQ(w.zero_gather_bytes, 0.75 * 4 * 1704);
}

TEST(CostModelZero, Stage3ShardsWeightsAndGradientsAndGathersTwoUnits) {
  const MemoryPrediction p = predict_memory(tiny_zero(3), k_test());
  const std::map<std::string, int64_t> m = by_name(p);
  EXPECT_EQ(m.at("weights"), 1704 * 4 / 4);
  EXPECT_EQ(m.at("gradients"), 1704 * 4 / 4);
  EXPECT_EQ(m.at("adam moments"), 1704 * 8 / 4);
  EXPECT_EQ(m.count("fp32 master weights"), 0u);  // an fp32 weight shard is its own master
  // layer 592 + max(layer 592, V x h = 256) parameters x 4 B: the unit and the prefetched one.
  EXPECT_EQ(m.at("zero-3 gathered weights"), 2 * 592 * 4);
  EXPECT_EQ(m.at("zero pending gradients"), 2 * 592 * 4);
  // Stage 3 recomputes every layer (without memory.checkpointing): layer inputs L x T x h x 4 B
  // saved, one layer's saved set + gradients (296 + 32 x 4) B x T as the largest transient.
  EXPECT_EQ(m.count("activations"), 0u);
  EXPECT_EQ(m.at("checkpoints"), 2 * 8 * 8 * 4);
  EXPECT_EQ(m.at("layer recompute"), (296 + 32 * 4) * 8);
  EXPECT_EQ(p.largest_transient, "layer recompute");
  // Static: runtime, weights, gradients, moments, gathered layers, pending gradients,
  // reduction bucket. Saved: checkpoints 512 + residual stream 1056.
  const int64_t stat = 1000 + 1704 + 1704 + 3408 + 4736 + 4736 + 6816;
  const int64_t saved = 512 + 1056, recompute = 3392;
  EXPECT_EQ(p.peak_bytes, static_cast<int64_t>(stat + saved + recompute +
                                               0.1 * (stat - 1000 + saved + recompute)));
  config::RunConfig c = tiny_zero(3);
  const StepWork w = step_work(c);
  // Every unit's fp32 gradients once per micro-batch: embedding 256 + 2 layers x 592 + head
  // (final norm 8 + LM head 256) = 1704 = P, x (w - 1) / w x 4 B.
  EXPECT_DOUBLE_EQ(w.zero_reduce_bytes, 0.75 * 4 * 1704);
  // Gathers per micro-batch: the embedding 256, each layer twice (forward; recompute and backward
  // share one gather) 2 x 2 x 592, the head once 264: 2888 parameters x (w - 1) / w x 4 B (was
  // counted as (2 + recompute) x P = 2 x 1704 without checkpointing, 3 x 1704 with it).
  EXPECT_DOUBLE_EQ(w.zero_gather_bytes, 0.75 * 4 * 2888);
  // The recompute's FLOPs and all-to-alls, as with memory.checkpointing: per token the layers'
  // forward GEMMs 2 x 1152 once more; a2a 2 layers x 512 B x 3 (forward, backward, recompute).
  EXPECT_DOUBLE_EQ(w.matmul_flops, 8.0 * (3 * (2 * 1152 + 512) + 2 * 1152));
  EXPECT_DOUBLE_EQ(w.attention_flops, 8.0 * (3 * 2 * 256 + 2 * 256));
  EXPECT_DOUBLE_EQ(w.a2a_bytes, 2 * 512.0 * 3);
  c.memory.checkpointing = true;  // changes nothing: stage 3 recomputes anyway
  EXPECT_DOUBLE_EQ(step_work(c).zero_gather_bytes, 0.75 * 4 * 2888);
  EXPECT_DOUBLE_EQ(step_work(c).matmul_flops, w.matmul_flops);
  EXPECT_EQ(predict_memory(c, k_test()).peak_bytes, p.peak_bytes);
  // The lower bound shards the same terms (so pruning never drops a ZeRO run that fits).
  const std::map<std::string, int64_t> lb = [&] {
    std::map<std::string, int64_t> out;
    for (const MemoryTerm& t : lower_bound_peak(tiny_zero(3)).terms) out[t.name] = t.bytes;
    return out;
  }();
  EXPECT_EQ(lb.at("weights"), 1704);
  EXPECT_EQ(lb.at("gradients"), 1704);
  EXPECT_EQ(lb.at("adam moments"), 3408);
  MemoryCoefficients bare;
  bare.allocator_fraction = 0;
  for (int64_t stage : {0, 1, 2, 3}) {
    EXPECT_LE(lower_bound_peak(tiny_zero(stage)).total_bytes(),
              predict_memory(tiny_zero(stage), bare).peak_bytes) << "stage " << stage;
  }
}

// With G micro-batches per step, stages 2-3 reduce-scatter (and stage 3 gathers) after each one;
// stages 0-1 all-reduce the accumulated gradients once; stages 1-2 gather the updated shards once,
// in the parameters' dtype. bf16 (d = 2), G = 3, world 4: (w - 1) / w = 0.75.
TEST(CostModelZero, MicroBatchesScaleTheUnitCollectives) {
  auto bf16_zero = [](int64_t stage) {
    config::RunConfig c = tiny_zero(stage);
    c.train.device = "cuda";
    c.memory.precision = "bf16";
    c.sequence.grad_accum = 3;
    return c;
  };
  const StepWork s1 = step_work(bf16_zero(1));
  EXPECT_DOUBLE_EQ(s1.allreduce_bytes, 2 * 0.75 * 4 * 1704);
  EXPECT_DOUBLE_EQ(s1.zero_gather_bytes, 0.75 * 2 * 1704);      // was 0.75 x 4 x 1704
  const StepWork s2 = step_work(bf16_zero(2));
  EXPECT_DOUBLE_EQ(s2.zero_reduce_bytes, 3 * 0.75 * 4 * 1704);  // was 0.75 x 4 x 1704
  EXPECT_DOUBLE_EQ(s2.zero_gather_bytes, 0.75 * 2 * 1704);      // was 0.75 x 4 x 1704
  const StepWork s3 = step_work(bf16_zero(3));
  EXPECT_DOUBLE_EQ(s3.zero_reduce_bytes, 3 * 0.75 * 4 * 1704);  // was 0.75 x 4 x 1704
  EXPECT_DOUBLE_EQ(s3.zero_gather_bytes, 3 * 0.75 * 2 * 2888);  // was 0.75 x 2 x 1704 x 2
}

// Tied embeddings: the head unit is the final norm and the embedding weight, gathered and
// reduce-scattered again for the LM head (zero/zero_partition.cpp). P = 1704 - 256 = 1448;
// gathers 256 + 2 x 2 x 592 + (8 + 256) = 2888, reduces 256 + 2 x 592 + 264 = 1704 = P + V h.
TEST(CostModelZero, TiedEmbeddingIsGatheredAndReducedForTheHeadToo) {
  config::RunConfig c = tiny_zero(3);
  c.model.tie_embeddings = true;
  ASSERT_EQ(parameter_count(c.model), 1448);
  const StepWork w = step_work(c);
  EXPECT_DOUBLE_EQ(w.zero_gather_bytes, 0.75 * 4 * 2888);
  EXPECT_DOUBLE_EQ(w.zero_reduce_bytes, 0.75 * 4 * (1448 + 256));  // was 0.75 x 4 x 1448
}

// fp32 ZeRO-3 keeps no master copy beside the weight shards (zero/zero_optimizer.cpp uses the
// shard itself), so neither the lower bound nor the model counts one; bf16 or an offloaded
// optimizer keeps a separate fp32 master.
TEST(CostModelZero, Fp32Stage3WeightShardsAreTheirOwnMasters) {
  const config::RunConfig c = tiny_zero(3);
  std::map<std::string, int64_t> lb;
  for (const MemoryTerm& t : lower_bound_peak(c).terms) lb[t.name] = t.bytes;
  EXPECT_EQ(lb.count("fp32 master weights"), 0u);
  // What the trainer certainly holds per rank: weight, gradient and moment shards (16 P / 4)
  // and the layer inputs [T, h] of both layers in fp32. A limit of exactly that fits, so the
  // sweep must not prune it (prune_reason: lower bound > limit).
  const int64_t held = 16 * 1704 / 4 + 2 * 8 * 8 * 4;
  EXPECT_EQ(lower_bound_peak(c).total_bytes(), held);  // was held + 4 P / 4: pruned

  config::RunConfig bf16 = c;
  bf16.train.device = "cuda";
  bf16.memory.precision = "bf16";
  std::map<std::string, int64_t> lb16;
  for (const MemoryTerm& t : lower_bound_peak(bf16).terms) lb16[t.name] = t.bytes;
  EXPECT_EQ(lb16.at("fp32 master weights"), 1704 * 4 / 4);
  EXPECT_EQ(by_name(predict_memory(bf16, k_test())).at("fp32 master weights"), 1704 * 4 / 4);

  config::RunConfig offloaded = c;
  offloaded.train.device = "cuda";
  offloaded.memory.offload_optimizer = true;
  const MemoryPrediction p = predict_memory(offloaded, k_test());
  EXPECT_EQ(by_name(p).at("fp32 master weights"), 1704 * 4 / 4);  // on the host, apart
  MemoryCoefficients bare;
  bare.allocator_fraction = 0;
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int64_t stage : {0, 1, 2, 3}) {
      config::RunConfig x = tiny_zero(stage);
      x.memory.precision = precision;
      x.train.device = precision == "bf16" ? "cuda" : "cpu";
      EXPECT_LE(lower_bound_peak(x).total_bytes(), predict_memory(x, bare).peak_bytes)
          << precision << " stage " << stage;
    }
  }
}

TEST(CostModelZero, AWorldOfOneIsStageZero) {
  config::RunConfig c = tiny();
  c.mesh.sp = 1;
  c.zero.stage = 2;
  const std::map<std::string, int64_t> m = by_name(predict_memory(c, k_test()));
  EXPECT_EQ(m.at("adam moments"), 1704 * 8);
  EXPECT_EQ(m.count("fp32 master weights"), 0u);
  EXPECT_DOUBLE_EQ(step_work(c).zero_gather_bytes, 0);
}

TEST(CostModelFit, RecoversKnownMemoryCoefficients) {
  MemoryCoefficients truth;
  truth.runtime_bytes = 100 << 20, truth.allocator_fraction = 0.07;
  std::vector<Measured> trials;
  for (int64_t len : {16, 64, 256, 1024}) {
    config::RunConfig c = tiny();
    c.sequence.length = len;
    trials.push_back({c, static_cast<double>(predict_memory(c, truth).peak_bytes)});
  }
  LinearFit fit;
  const MemoryCoefficients k = fit_memory(trials, &fit);
  EXPECT_NEAR(k.runtime_bytes, truth.runtime_bytes, 1e-6 * truth.runtime_bytes);
  EXPECT_NEAR(k.allocator_fraction, 0.07, 1e-4);
  EXPECT_LT(fit.rms_relative_error, 1e-6);
}

TEST(CostModelFit, RecoversKnownTimeCoefficients) {
  TimeCoefficients truth;
  truth.ms_per_tflop = 4000, truth.ms_per_tflop_attention = 9000;
  truth.ms_per_gb_a2a = truth.ms_per_gb_allreduce = 300, truth.overhead_ms = 12;
  std::vector<Measured> trials;
  for (int64_t sp : {1, 2}) {
    for (int64_t len : {64, 256, 1024, 4096}) {
      for (bool ckpt : {false, true}) {
        config::RunConfig c = tiny();
        c.mesh.sp = sp, c.mesh.dp = 2 / sp, c.sequence.length = len;
        c.memory.checkpointing = ckpt;
        trials.push_back({c, predict_time(step_work(c), truth).step_ms});
      }
    }
  }
  const TimeCoefficients k = fit_time(trials, {});
  EXPECT_NEAR(k.ms_per_tflop, 4000, 1e-3 * 4000);
  EXPECT_NEAR(k.ms_per_tflop_attention, 9000, 1e-3 * 9000);
  EXPECT_NEAR(k.ms_per_gb_a2a, 300, 1e-3 * 300);
  EXPECT_NEAR(k.overhead_ms, 12, 1e-3 * 12);
}

TEST(CostModelFit, TimeCoefficientsAreNeverNegative) {
  // Measurements a plain least-squares fit explains with a negative per-step overhead.
  TimeCoefficients truth;
  truth.ms_per_tflop = 4e9, truth.ms_per_tflop_attention = 9e9, truth.overhead_ms = -50;
  std::vector<Measured> trials;
  for (int64_t len : {64, 256, 1024, 4096}) {
    for (bool ckpt : {false, true}) {
      config::RunConfig c = tiny();
      c.mesh.sp = 1, c.mesh.dp = 1, c.sequence.length = len, c.memory.checkpointing = ckpt;
      trials.push_back({c, predict_time(step_work(c), truth).step_ms});  // > 0: >= 1.8 s
    }
  }
  LinearFit fit;
  const TimeCoefficients k = fit_time(trials, {}, &fit);
  EXPECT_GE(k.ms_per_tflop, 0);
  EXPECT_GE(k.ms_per_tflop_attention, 0);
  EXPECT_GE(k.ms_per_gb_a2a, 0);
  EXPECT_EQ(k.overhead_ms, 0);  // dropped, the rest refitted
  // The reported fit is that of the returned coefficients (refitted, not merely clamped).
  double sum = 0;
  for (const Measured& m : trials) {
    sum += std::pow((predict_time(step_work(m.config), k).step_ms - m.value) / m.value, 2);
  }
  EXPECT_NEAR(std::sqrt(sum / static_cast<double>(trials.size())), fit.rms_relative_error, 1e-9);
}

TEST(CostModelFit, TrialsOfOneShapeFitGemmTimeAndNameWhatTheyCannotSeparate) {
  // One mesh and one length (a one-GPU sweep's whole-step trials, at its longest length): GEMM,
  // attention and overhead are in the same proportion in every trial.
  TimeCoefficients truth;
  truth.ms_per_tflop = 4000, truth.ms_per_tflop_attention = 9000, truth.overhead_ms = 12;
  config::RunConfig same = tiny();
  same.mesh.sp = 1, same.mesh.dp = 1, same.sequence.length = 1024;
  const double t = predict_time(step_work(same), truth).step_ms;
  const std::vector<Measured> trials = {{same, t}, {same, 1.05 * t}};  // two runs, 5 % apart
  LinearFit fit;
  std::vector<std::string> inseparable;
  const TimeCoefficients k = fit_time(trials, {}, &fit, &inseparable);
  EXPECT_EQ(inseparable, (std::vector<std::string>{"attention", "overhead"}));
  EXPECT_EQ(k.ms_per_tflop_attention, 0);
  EXPECT_EQ(k.overhead_ms, 0);
  // GEMM alone predicts the shape's time within the measurements' own spread.
  const double predicted = predict_time(step_work(same), k).step_ms;
  EXPECT_GT(predicted, trials[0].value);
  EXPECT_LT(predicted, trials[1].value);
  EXPECT_LT(fit.rms_relative_error, 0.03);
  EXPECT_THROW(fit_time({}, {}), UserError);
}

TEST(CostModelFit, IndependentColumnsKeepTheFirstOfEachDependentSet) {
  // Column 1 = 2 x column 0, column 2 is zero, column 3 is new, column 4 = column 0 + column 3.
  const std::vector<std::vector<double>> x = {{1, 2, 0, 5, 6}, {2, 4, 0, 1, 3}, {3, 6, 0, 2, 5}};
  EXPECT_EQ(independent_columns(x), (std::vector<size_t>{0, 3}));
  EXPECT_EQ(independent_columns({{1e-12, 1e12, 1}}), (std::vector<size_t>{0}));
  EXPECT_TRUE(independent_columns({}).empty());
  // Widely different scales are still told apart.
  EXPECT_EQ(independent_columns({{1e-9, 1}, {2e-9, 1}}), (std::vector<size_t>{0, 1}));
}

TEST(CostModelFit, DependentColumnsAndTooFewRowsAreUserErrors) {
  EXPECT_THROW(fit_relative_least_squares({{1, 2}, {2, 4}, {3, 6}}, {1, 2, 3}), UserError);
  EXPECT_THROW(fit_relative_least_squares({{1, 2}}, {1}), UserError);
  EXPECT_THROW(fit_relative_least_squares({{1}, {2}}, {1, 0}), UserError);
}

}  // namespace
}  // namespace ulysses::costmodel
