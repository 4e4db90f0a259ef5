// ZeRO-3's sharded build: each rank allocates, draws or reads only its own shards, and they are
// the whole model's values bit for bit whatever the world and mesh (the seeded init, drawn by
// ranges, equals the init drawn whole; a model.load checkpoint read by byte ranges equals the one
// loaded whole). Training, the streamed save and the sharded resume against stage 0 are in
// zero_test.cpp; transformers reads and writes them in tests/clients/hf_roundtrip.py.
#include <gtest/gtest.h>

#include <filesystem>

#include "comm/mesh.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"
#include "model/weight_init.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "zero/zero_partition.h"
#include "run_outputs.h"
#include "train_test_util.h"

namespace ulysses {
namespace {

// Drawing any split of a parameter into ranges gives the values of drawing it whole: a matrix of
// 2.4 chunks (model::kInitChunkElements) cut at uneven places, some inside a chunk, some on a
// chunk boundary; biases and norm weights too.
TEST(ShardedInit, AnyRangesEqualTheWholeDraw) {
  const std::vector<int64_t> shape = {2500, 64};  // [V, h]
  const int64_t numel = shape[0] * shape[1];
  at::Tensor whole = at::empty({numel});
  model::init_weight_range(3, "model.embed_tokens.weight", shape, 7, 0.2, 0, whole);
  EXPECT_NEAR(whole.std().item<double>(), 0.2, 0.01);
  const std::vector<int64_t> cuts = {0, 1, 17, model::kInitChunkElements - 5,
                                     model::kInitChunkElements, 2 * model::kInitChunkElements + 3,
                                     numel - 1, numel};
  at::Tensor pieces = at::empty({numel});
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    model::init_weight_range(3, "model.embed_tokens.weight", shape, 7, 0.2, cuts[k],
                             pieces.narrow(0, cuts[k], cuts[k + 1] - cuts[k]));
  }
  EXPECT_TRUE(at::equal(pieces, whole));
  // Another parameter index or seed draws other values.
  at::Tensor other = at::empty({numel});
  model::init_weight_range(4, "model.embed_tokens.weight", shape, 7, 0.2, 0, other);
  EXPECT_FALSE(at::equal(other, whole));
  model::init_weight_range(3, "model.embed_tokens.weight", shape, 8, 0.2, 0, other);
  EXPECT_FALSE(at::equal(other, whole));
  // A range drawn into bf16 is the fp32 draw rounded.
  at::Tensor half = at::empty({1000}, at::kBFloat16);
  model::init_weight_range(3, "model.embed_tokens.weight", shape, 7, 0.2, 65000, half);
  EXPECT_TRUE(at::equal(half, whole.narrow(0, 65000, 1000).to(at::kBFloat16)));
  at::Tensor bias = at::full({10}, 5.0f), norm = at::full({10}, 5.0f);
  model::init_weight_range(0, "model.layers.0.self_attn.q_proj.bias", {64}, 7, 0.2, 30, bias);
  model::init_weight_range(0, "model.layers.0.input_layernorm.weight", {64}, 7, 0.2, 30, norm);
  EXPECT_TRUE(at::equal(bias, at::zeros({10})));
  EXPECT_TRUE(at::equal(norm, at::ones({10})));
}

// A model whose embedding and LM head span several init chunks, so every rank's shard starts
// inside a chunk; norms of 64 elements do not divide by the world (padding).
config::RunConfig sharded_config(int64_t dp, int64_t sp) {
  config::RunConfig c = testing::tiny_run_config(8, 2, dp, sp);
  c.model.vocab_size = 2500;
  c.zero.stage = 3;
  return c;
}

constexpr int64_t kBucketBytes = 4096;  // parts of 4096 / 4 bytes / world fp32 elements per rank

// This rank's shard of `whole` ([S], zero padding), cut here without the partition's code: a
// parameter of n elements over `world` ranks goes in the fewest parts of equal size P that fit
// kBucketBytes / 4 / world elements per rank; padded to whole parts and viewed as
// [parts, world, P], the shard is column `rank`.
at::Tensor expected_shard(const at::Tensor& whole, int64_t rank, int64_t world) {
  const at::Tensor flat = whole.detach().reshape({-1});
  const int64_t n = flat.numel();
  const int64_t one_part = (n + world - 1) / world, fits = kBucketBytes / 4 / world;
  const int64_t parts = (one_part + fits - 1) / fits;
  const int64_t part = (one_part + parts - 1) / parts;
  const at::Tensor padded = at::constant_pad_nd(flat, {0, parts * world * part - n});
  return padded.view({parts, world, part}).select(1, rank).reshape({-1});
}

// On each of 4 ranks: the sharded build holds nothing of the whole model, and its shards (and
// the parameters gathered from them) equal the model built whole for stage 0 bit for bit: from the
// seeded init, then from an HF checkpoint of other weights read by ranges (model.load).
void expect_shards_equal_whole_model(int64_t dp, int64_t sp) {
  const std::string dir = testing::shared_dir(
      "zero3-sharded-test", "dp" + std::to_string(dp) + "sp" + std::to_string(sp));
  testing::run_ranks(static_cast<int>(dp * sp), [&](const testing::RankContext& ctx) {
    const at::Device cpu(at::kCPU);
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, dp, sp);
    config::RunConfig c = sharded_config(dp, sp);
    config::RunConfig other = c;  // the checkpoint's weights: another seed
    other.model.init_seed = 99;
    model::LlamaForCausalLM stored = train::build_model(other, mesh, cpu);
    const std::string weights = dir + "/hf";
    if (ctx.rank == 0) {
      std::filesystem::create_directories(weights);
      model::save_safetensors(weights + "/model.safetensors", model::hf_state(stored));
    }
    mesh.world().barrier();
    config::RunConfig loaded = c;
    loaded.model.load = weights;
    for (const config::RunConfig& run : {c, loaded}) {
      const std::string what = run.model.load.empty() ? "init" : "model.load";
      model::LlamaForCausalLM whole = train::build_model(run, mesh, cpu);  // what stage 0 trains
      model::LlamaForCausalLM sharded = train::build_model(run, mesh, cpu, nullptr, true);
      for (const auto& p : sharded->parameters()) EXPECT_LE(p.storage().nbytes(), 4u) << what;
      train::ZeroPartition partition(sharded, mesh.world(), kBucketBytes,
                                     at::TensorOptions(at::kFloat),
                                     train::shard_source(run.model, sharded));
      const std::vector<at::Tensor> expected = whole->parameters();
      ASSERT_EQ(partition.params().size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(partition.params()[i].storage().nbytes(), 0u) << what << " " << partition.names()[i];
        EXPECT_TRUE(at::equal(partition.weight_values(i),
                              expected_shard(expected[i], ctx.rank, ctx.world)))
            << what << " rank " << ctx.rank << " " << partition.names()[i];
      }
      partition.gather_all();
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_TRUE(at::equal(partition.params()[i], expected[i]))
            << what << " gathered " << partition.names()[i];
      }
      partition.release_all();
    }
  });
}

// The layout's pieces: over every rank they cover each element of the parameter exactly once, at
// the places the layout gives (element (j / P) * world * P + r * P + j % P), and with one part
// (P == S) rank r's shard is the contiguous range [r * S, (r + 1) * S).
TEST(Zero3Sharded, ShardPiecesCoverTheParameterOnce) {
  struct Case {
    int64_t numel, world, part;
  };
  for (const Case& k : {Case{1000, 4, 250}, Case{1000, 4, 64}, Case{7, 4, 2}, Case{1, 4, 1},
                        Case{80000, 3, 1000}}) {
    const int64_t shard = ((k.numel + k.world - 1) / k.world + k.part - 1) / k.part * k.part;
    std::vector<int> seen(static_cast<size_t>(k.numel), 0);
    for (int64_t r = 0; r < k.world; ++r) {
      int64_t expected_offset = 0;
      const auto pieces = train::ZeroPartition::shard_pieces(k.numel, shard, k.part, k.world, r);
      for (const auto& piece : pieces) {
        EXPECT_EQ(piece.shard_offset % k.part, 0) << k.numel << " rank " << r;
        EXPECT_GE(piece.shard_offset, expected_offset);
        expected_offset = piece.shard_offset + piece.length;
        for (int64_t j = 0; j < piece.length; ++j) {
          const int64_t element = piece.shard_offset + j;
          const int64_t at = (element / k.part) * k.world * k.part + r * k.part + element % k.part;
          ASSERT_EQ(piece.param_offset + j, at) << k.numel << " rank " << r;
          ++seen.at(static_cast<size_t>(at));
        }
      }
    }
    for (int64_t e = 0; e < k.numel; ++e) {
      ASSERT_EQ(seen[static_cast<size_t>(e)], 1) << k.numel << " " << e;
    }
  }
  const auto one_part = train::ZeroPartition::shard_pieces(1000, 250, 250, 4, 2);
  ASSERT_EQ(one_part.size(), 1u);
  EXPECT_EQ(one_part[0].param_offset, 500);
  EXPECT_EQ(one_part[0].length, 250);
}

TEST(Zero3Sharded, ShardsEqualTheWholeModelOnDp2Sp2) { expect_shards_equal_whole_model(2, 2); }
TEST(Zero3Sharded, ShardsEqualTheWholeModelOnFourRanks) { expect_shards_equal_whole_model(4, 1); }

}  // namespace
}  // namespace ulysses
