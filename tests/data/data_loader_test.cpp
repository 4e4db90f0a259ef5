// DataLoader against single-process references: for several (dp, sp, micro_batch, grad_accum) and
// L not divisible by sp, the shards of all ranks and micro-steps reassemble exactly the dp=1, sp=1,
// mb=G batch of the same step; labels are shifted before sharding; packing, padding and the global
// valid-token count follow the data rules. All comparisons are exact (integer tensors).
#include "data/data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset_writer.h"
#include "data/sequence_layout.h"
#include "data/token_source.h"
#include "data_test_util.h"

namespace ulysses::data {
namespace {

using test::expect_user_error;
using test::TempDir;

constexpr int64_t kVocab = 97;
constexpr int64_t kEod = 3;

struct Layout {
  int64_t dp, sp, micro_batch, grad_accum;
};

// One step's global batch put back together from every rank's shards.
struct Assembled {
  at::Tensor inputs;                  // [G, sl]
  at::Tensor labels;                  // [G, sl]
  at::Tensor positions;               // [G, sl]
  at::Tensor doc_ids;                 // [G, sl], packed only
  int64_t valid_sum = 0;              // sum of every shard's valid_tokens
  std::vector<int64_t> global_valid;  // global_valid_tokens(step) of every rank's loader
};

Assembled assemble(const config::DataOptions& data, int64_t length, const Layout& layout,
                   int64_t step) {
  const config::SequenceOptions seq{length, layout.micro_batch, layout.grad_accum};
  const int64_t padded = (length + layout.sp - 1) / layout.sp * layout.sp;  // P
  const int64_t local = padded / layout.sp;
  const int64_t global = layout.dp * layout.micro_batch * layout.grad_accum;  // G
  Assembled out;
  const auto options = at::TensorOptions().dtype(at::kLong);
  out.inputs = at::full({global, padded}, -7, options);
  out.labels = at::full({global, padded}, -7, options);
  out.positions = at::full({global, padded}, -7, options);
  if (data.pack) out.doc_ids = at::full({global, padded}, -7, options);
  for (int64_t d = 0; d < layout.dp; ++d) {
    for (int64_t r = 0; r < layout.sp; ++r) {
      DataLoader loader(data, seq, kVocab, layout.dp, d, layout.sp, r);
      EXPECT_EQ(loader.padded_length(), padded);
      EXPECT_EQ(loader.global_batch_size(), global);
      out.global_valid.push_back(loader.global_valid_tokens(step));
      for (int64_t m = 0; m < layout.grad_accum; ++m) {
        const Batch batch = loader.micro_batch(step, m);
        EXPECT_EQ(batch.input_ids.sizes(), (at::IntArrayRef{layout.micro_batch, local}));
        EXPECT_EQ(batch.labels.sizes(), (at::IntArrayRef{layout.micro_batch, local}));
        EXPECT_EQ(batch.position_ids.sizes(), (at::IntArrayRef{layout.micro_batch, local}));
        EXPECT_EQ(batch.input_ids.scalar_type(), at::kLong);
        EXPECT_EQ(batch.valid_tokens, batch.labels.ne(-100).sum().item<int64_t>());
        EXPECT_EQ(batch.doc_ids.defined(), data.pack);
        out.valid_sum += batch.valid_tokens;
        for (int64_t b = 0; b < layout.micro_batch; ++b) {
          // Row b of micro-step m on dp rank d is sample d*mb*ga + m*mb + b of the step.
          const int64_t g = d * layout.micro_batch * layout.grad_accum + m * layout.micro_batch + b;
          out.inputs[g].narrow(0, r * local, local).copy_(batch.input_ids[b]);
          out.labels[g].narrow(0, r * local, local).copy_(batch.labels[b]);
          out.positions[g].narrow(0, r * local, local).copy_(batch.position_ids[b]);
          if (data.pack) {
            EXPECT_EQ(batch.doc_ids.sizes(), (at::IntArrayRef{layout.micro_batch, padded}));
            if (r == 0) out.doc_ids[g].copy_(batch.doc_ids[b]);
            EXPECT_TRUE(out.doc_ids[g].equal(batch.doc_ids[b])) << "sp ranks disagree on doc_ids";
          }
        }
      }
    }
  }
  return out;
}

// The data rules checked on a reference batch [G, L] from its own inputs, independently of
// how the loader computes them: a label is the next input unless the position is the last or the
// next one restarts its position count (with a loss mask, `masked`, it may also be -100: the mask
// is checked against the data by the tests that use one); positions restart exactly where doc ids
// change.
void expect_consistent_rows(const Batch& reference, bool packed, bool masked) {
  const auto inputs = reference.input_ids.accessor<int64_t, 2>();
  const auto labels = reference.labels.accessor<int64_t, 2>();
  const auto positions = reference.position_ids.accessor<int64_t, 2>();
  const int64_t length = reference.input_ids.size(1);
  for (int64_t g = 0; g < reference.input_ids.size(0); ++g) {
    for (int64_t j = 0; j < length; ++j) {
      ASSERT_GE(inputs[g][j], 0);
      ASSERT_LT(inputs[g][j], kVocab);
      const bool next_restarts = j + 1 < length && positions[g][j + 1] == 0;
      if (j + 1 == length || next_restarts) {
        ASSERT_EQ(labels[g][j], -100) << "row " << g << " pos " << j;
      } else if (!masked || labels[g][j] != -100) {
        ASSERT_EQ(labels[g][j], inputs[g][j + 1]) << "row " << g << " pos " << j;
      }
      if (!packed) {
        ASSERT_EQ(positions[g][j], j);
      }
      if (packed && j > 0) {
        const bool new_document =
            reference.doc_ids[g][j].item<int64_t>() != reference.doc_ids[g][j - 1].item<int64_t>();
        ASSERT_EQ(positions[g][j] == 0, new_document) << "row " << g << " pos " << j;
        ASSERT_EQ(positions[g][j], new_document ? 0 : positions[g][j - 1] + 1);
      }
    }
  }
}

// Checks every layout and steps 1 and 3 against the single-process batch. `masked`: the source
// has a loss mask.
void check_reassembly(const config::DataOptions& data, int64_t length, bool masked = false) {
  const std::vector<Layout> layouts = {{1, 2, 1, 1}, {2, 2, 2, 3}, {3, 4, 1, 2},
                                       {1, 3, 2, 2}, {4, 1, 1, 1}, {2, 5, 1, 2}};
  for (const Layout& layout : layouts) {
    for (int64_t step : {1, 3}) {
      SCOPED_TRACE("dp=" + std::to_string(layout.dp) + " sp=" + std::to_string(layout.sp) +
                   " mb=" + std::to_string(layout.micro_batch) +
                   " ga=" + std::to_string(layout.grad_accum) + " step=" + std::to_string(step));
      const int64_t global = layout.dp * layout.micro_batch * layout.grad_accum;
      DataLoader single(data, {length, global, 1}, kVocab, 1, 0, 1, 0);
      ASSERT_EQ(single.padded_length(), length);
      const Batch reference = single.micro_batch(step, 0);  // [G, L]
      expect_consistent_rows(reference, data.pack, masked);
      const Assembled all = assemble(data, length, layout, step);
      const int64_t padded = all.inputs.size(1);
      if (layout.sp > 1) {
        ASSERT_GT(padded, length) << "L is chosen to need padding";
      }

      EXPECT_TRUE(all.inputs.narrow(1, 0, length).equal(reference.input_ids));
      EXPECT_TRUE(all.labels.narrow(1, 0, length).equal(reference.labels));
      EXPECT_TRUE(all.positions.narrow(1, 0, length).equal(reference.position_ids));
      // Padding: input 0, label -100, positions continue from the last real one.
      const int64_t pad = padded - length;
      EXPECT_TRUE(all.inputs.narrow(1, length, pad).eq(0).all().item<bool>());
      EXPECT_TRUE(all.labels.narrow(1, length, pad).eq(-100).all().item<bool>());
      const at::Tensor continued = reference.position_ids.narrow(1, length - 1, 1) +
                                   at::arange(1, pad + 1, at::kLong).unsqueeze(0);
      EXPECT_TRUE(all.positions.narrow(1, length, pad).equal(continued));
      if (data.pack) {
        EXPECT_TRUE(all.doc_ids.narrow(1, 0, length).equal(reference.doc_ids));
        const at::Tensor pad_doc = reference.doc_ids.narrow(1, length - 1, 1) + 1;
        EXPECT_TRUE(all.doc_ids.narrow(1, length, pad).equal(pad_doc.expand({global, pad})));
      }
      // The loss denominator: every shard's count sums to it, and every rank knows it.
      const int64_t expected_valid = reference.labels.ne(-100).sum().item<int64_t>();
      EXPECT_EQ(reference.valid_tokens, expected_valid);
      EXPECT_EQ(all.valid_sum, expected_valid);
      EXPECT_EQ(single.global_valid_tokens(step), expected_valid);
      for (int64_t count : all.global_valid) EXPECT_EQ(count, expected_valid);
      if (!data.pack && !masked) {
        EXPECT_EQ(expected_valid, global * (length - 1));
      }
    }
  }
}

// A flat token stream with eod tokens every few positions; `stream` receives it.
std::string write_eod_stream(const TempDir& dir, TokenDType dtype, int64_t n,
                             std::vector<int64_t>* stream) {
  stream->clear();
  for (int64_t i = 0; i < n; ++i) {
    stream->push_back((i * 7919) % 11 == 0 ? kEod : 4 + (i * 31) % (kVocab - 4));
  }
  const std::string path = dir.file(dtype == TokenDType::kUInt16 ? "u16.bin" : "u32.bin");
  write_token_file(path, *stream, dtype);
  return path;
}

TEST(DataLoaderSharding, SyntheticUnpacked) {
  config::DataOptions data;
  data.seed = 5;
  check_reassembly(data, 13);
}

TEST(DataLoaderSharding, SyntheticPacked) {
  config::DataOptions data;
  data.seed = 6;
  data.pack = true;
  check_reassembly(data, 13);
}

TEST(DataLoaderSharding, FlatUint32UnpackedMatchesTheFile) {
  TempDir dir;
  std::vector<int64_t> stream;
  config::DataOptions data;
  data.token_dtype = "uint32";
  data.source = "tokens:" + write_eod_stream(dir, TokenDType::kUInt32, 5 * 13 + 6, &stream);
  check_reassembly(data, 13);
  // Sample i is file tokens [i*L, (i+1)*L), i wrapped over the 5 whole samples.
  DataLoader single(data, {13, 24, 1}, kVocab, 1, 0, 1, 0);
  const Batch step2 = single.micro_batch(2, 0);  // samples 24..47
  for (int64_t g = 0; g < 24; ++g) {
    const int64_t first = ((24 + g) % 5) * 13;
    const at::Tensor expected =
        at::tensor(std::vector<int64_t>(stream.begin() + first, stream.begin() + first + 13));
    EXPECT_TRUE(step2.input_ids[g].equal(expected)) << "row " << g;
  }
}

TEST(DataLoaderSharding, FlatUint16PackedWithEod) {
  TempDir dir;
  std::vector<int64_t> stream;
  config::DataOptions data;
  data.pack = true;
  data.eod_token = kEod;
  data.source = "tokens:" + write_eod_stream(dir, TokenDType::kUInt16, 7 * 13, &stream);
  check_reassembly(data, 13);
  // Documents end at each eod: in the reference, a position restarts right after an eod only.
  DataLoader single(data, {13, 7, 1}, kVocab, 1, 0, 1, 0);
  const Batch batch = single.micro_batch(1, 0);
  for (int64_t g = 0; g < 7; ++g) {
    for (int64_t j = 1; j < 13; ++j) {
      EXPECT_EQ(batch.position_ids[g][j].item<int64_t>() == 0, stream[g * 13 + j - 1] == kEod);
    }
  }
}

TEST(DataLoaderSharding, MegatronPacked) {
  TempDir dir;
  std::vector<std::vector<int64_t>> documents;
  for (int64_t d = 0; d < 20; ++d) {
    documents.emplace_back();
    for (int64_t t = 0; t < 1 + (d * 5) % 9; ++t) documents.back().push_back((d * 17 + t) % kVocab);
  }
  write_megatron_dataset(dir.file("corpus"), documents, TokenDType::kUInt16);
  config::DataOptions data;
  data.pack = true;
  data.source = "megatron:" + dir.file("corpus");
  check_reassembly(data, 13);
}

// Each SP shard's last label is the first input of the next shard: labels are shifted before
// sharding, only the very last real position is ignored.
TEST(DataLoaderLabels, ShiftedBeforeSharding) {
  config::DataOptions data;
  data.seed = 11;
  const int64_t sp = 4;
  for (int64_t length : {16, 15}) {
    SCOPED_TRACE("L=" + std::to_string(length));
    std::vector<Batch> shards;
    for (int64_t r = 0; r < sp; ++r) {
      shards.push_back(DataLoader(data, {length, 2, 1}, kVocab, 1, 0, sp, r).micro_batch(1, 0));
    }
    const int64_t local = shards[0].input_ids.size(1);
    EXPECT_EQ(local, 4);
    for (int64_t r = 0; r + 1 < sp; ++r) {
      EXPECT_TRUE(shards[r].labels.select(1, local - 1).equal(shards[r + 1].input_ids.select(1, 0)))
          << "shard " << r;
      EXPECT_EQ(shards[r].valid_tokens, 2 * local);
    }
    // The last shard: real positions [12, L) then padding; only L-1 onwards is ignored.
    const at::Tensor last_labels = shards[sp - 1].labels;
    const int64_t real = length - (sp - 1) * local;
    for (int64_t j = 0; j < local; ++j) {
      EXPECT_EQ(last_labels[0][j].item<int64_t>() == -100, j >= real - 1) << "j=" << j;
    }
    EXPECT_EQ(shards[sp - 1].valid_tokens, 2 * (real - 1));
  }
}

// With a ring (sp 4 = 2 all-to-all x 2 ring) each rank holds its piece of a zig-zag block: the
// header's example (P 16: ranks hold 0-3, 12-15, 4-7, 8-11), and in general the shards together
// are every position once, each rank's tokens, labels and positions those of a single-rank loader
// at its positions, padded to a multiple of 2 sp.
TEST(DataLoaderSharding, ZigZagRingBlocks) {
  const auto positions = [](int64_t p, int64_t sp, int64_t ring, int64_t r) {
    const at::Tensor t = shard_positions(p, sp, ring, r);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  EXPECT_EQ(positions(16, 4, 2, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(positions(16, 4, 2, 1), (std::vector<int64_t>{12, 13, 14, 15}));
  EXPECT_EQ(positions(16, 4, 2, 2), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(positions(16, 4, 2, 3), (std::vector<int64_t>{8, 9, 10, 11}));
  // sp 6 = 3 x 2 over 24: block 0 = 0-5 + 18-23 in three pieces of 4 (one piece straddles).
  EXPECT_EQ(positions(24, 6, 2, 1), (std::vector<int64_t>{4, 5, 18, 19}));

  config::DataOptions data;
  data.seed = 5;
  data.pack = true;
  for (const auto& [sp, ring] : {std::pair<int64_t, int64_t>{4, 2}, {8, 4}, {4, 4}, {6, 2}}) {
    SCOPED_TRACE("sp " + std::to_string(sp) + " ring " + std::to_string(ring));
    const Batch whole = DataLoader(data, {30, 1, 1}, kVocab, 1, 0, 1, 0).micro_batch(1, 0);
    std::vector<int> seen;
    for (int64_t r = 0; r < sp; ++r) {
      const DataLoader loader(data, {30, 1, 1}, kVocab, 1, 0, sp, r, "data.source", ring);
      EXPECT_EQ(loader.padded_length() % (2 * sp), 0);
      const Batch shard = loader.micro_batch(1, 0);
      const at::Tensor at_positions = loader.shard_positions();
      for (int64_t i = 0; i < at_positions.numel(); ++i) {
        const int64_t p = at_positions[i].item<int64_t>();
        seen.push_back(static_cast<int>(p));
        if (p >= 30) continue;  // padding beyond the single-rank loader's 30
        EXPECT_EQ(shard.input_ids[0][i].item<int64_t>(), whole.input_ids[0][p].item<int64_t>());
        EXPECT_EQ(shard.labels[0][i].item<int64_t>(), whole.labels[0][p].item<int64_t>());
        EXPECT_EQ(shard.position_ids[0][i].item<int64_t>(),
                  whole.position_ids[0][p].item<int64_t>());
      }
    }
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], static_cast<int>(i));
  }
}

// A hand-worked packed sample: eod = 3 ends documents; L = 8, sp = 3, so P = 9.
TEST(DataLoaderPacking, HandWorkedSample) {
  TempDir dir;
  const std::string path = dir.file("hand.bin");
  write_token_file(path, {5, 6, 3, 7, 8, 9, 3, 10}, TokenDType::kUInt16);
  config::DataOptions data;
  data.source = "tokens:" + path;
  data.pack = true;
  data.eod_token = kEod;
  const std::vector<int64_t> inputs = {5, 6, 3, 7, 8, 9, 3, 10, 0};
  const std::vector<int64_t> labels = {6, 3, -100, 8, 9, 3, -100, -100, -100};
  const std::vector<int64_t> positions = {0, 1, 2, 0, 1, 2, 3, 0, 1};
  const std::vector<int64_t> doc_ids = {0, 0, 0, 1, 1, 1, 1, 2, 3};
  int64_t valid = 0;
  for (int64_t r = 0; r < 3; ++r) {
    DataLoader loader(data, {8, 1, 1}, kVocab, 1, 0, 3, r);
    EXPECT_EQ(loader.global_valid_tokens(1), 5);
    const Batch batch = loader.micro_batch(1, 0);
    auto slice = [&](const std::vector<int64_t>& row) {
      return at::tensor(std::vector<int64_t>(row.begin() + 3 * r, row.begin() + 3 * r + 3))
          .unsqueeze(0);
    };
    EXPECT_TRUE(batch.input_ids.equal(slice(inputs))) << "rank " << r;
    EXPECT_TRUE(batch.labels.equal(slice(labels))) << "rank " << r;
    EXPECT_TRUE(batch.position_ids.equal(slice(positions))) << "rank " << r;
    EXPECT_TRUE(batch.doc_ids.equal(at::tensor(doc_ids).unsqueeze(0))) << "rank " << r;
    valid += batch.valid_tokens;
  }
  EXPECT_EQ(valid, 5);

  // Unpacked, the same file: labels cross documents, positions 0..P-1, no doc ids.
  data.pack = false;
  const Batch plain = DataLoader(data, {8, 1, 1}, kVocab, 1, 0, 1, 0).micro_batch(1, 0);
  EXPECT_TRUE(plain.labels.equal(
      at::tensor(std::vector<int64_t>{6, 3, 7, 8, 9, 3, 10, -100}).unsqueeze(0)));
  EXPECT_TRUE(plain.position_ids.equal(at::arange(8, at::kLong).unsqueeze(0)));
  EXPECT_FALSE(plain.doc_ids.defined());
  EXPECT_EQ(plain.valid_tokens, 7);
}

// The documents a packed batch carries are found on the host when it is built; they equal what
// attention used to derive from the device doc ids (document_runs of doc_ids), sample by sample.
TEST(DataLoaderPacking, DocumentsAreTheRunsOfTheDocIds) {
  TempDir dir;
  const std::string path = dir.file("hand.bin");
  write_token_file(path, {5, 6, 3, 7, 8, 9, 3, 10}, TokenDType::kUInt16);
  config::DataOptions data;
  data.source = "tokens:" + path;
  data.pack = true;
  data.eod_token = kEod;
  for (int64_t r = 0; r < 3; ++r) {  // doc ids {0, 0, 0, 1, 1, 1, 1, 2, 3} on every SP rank
    const Batch batch = DataLoader(data, {8, 1, 1}, kVocab, 1, 0, 3, r).micro_batch(1, 0);
    ASSERT_NE(batch.documents, nullptr) << "rank " << r;
    EXPECT_EQ(*batch.documents, (DocumentRuns{{{0, 3}, {3, 4}, {7, 1}, {8, 1}}})) << "rank " << r;
  }
  data.pack = false;
  EXPECT_EQ(DataLoader(data, {8, 1, 1}, kVocab, 1, 0, 1, 0).micro_batch(1, 0).documents, nullptr);

  config::DataOptions synthetic;
  synthetic.seed = 5;
  synthetic.pack = true;
  const DataLoader loader(synthetic, {40, 3, 2}, kVocab, 2, 1, 2, 1);
  for (int64_t step : {1, 2, 3}) {
    for (int64_t micro : {0, 1}) {
      const Batch batch = loader.micro_batch(step, micro);
      ASSERT_NE(batch.documents, nullptr);
      ASSERT_EQ(batch.documents->size(), 3u);  // one entry per sample, never the mask case
      EXPECT_EQ(*batch.documents, document_runs(batch.doc_ids)) << step << "/" << micro;
    }
  }
}

// An SFT-like Megatron dataset: documents of the given lengths with recognizable tokens, and a
// loss mask beside it (PREFIX_loss_mask, uint8) that leaves out the first tokens of each document
// (its "prompt") and every third token after them. `stream` and `mask` receive both streams.
std::string write_masked_dataset(const TempDir& dir, const std::vector<int64_t>& lengths,
                                 std::vector<int64_t>* stream, std::vector<uint8_t>* mask) {
  std::vector<std::vector<int64_t>> documents, masks;
  stream->clear();
  mask->clear();
  for (size_t d = 0; d < lengths.size(); ++d) {
    documents.emplace_back();
    masks.emplace_back();
    for (int64_t t = 0; t < lengths[d]; ++t) {
      documents.back().push_back(4 + static_cast<int64_t>(d * 13 + t * 5) % (kVocab - 4));
      masks.back().push_back(t >= 2 && (t + static_cast<int64_t>(d)) % 3 != 0 ? 1 : 0);
      stream->push_back(documents.back().back());
      mask->push_back(static_cast<uint8_t>(masks.back().back()));
    }
  }
  const std::string prefix = dir.file("sft");
  write_megatron_dataset(prefix, documents, TokenDType::kUInt16);
  write_megatron_dataset(prefix + "_loss_mask", masks, TokenDType::kUInt8);
  return prefix;
}

// Every SP rank's shard (contiguous, or zig-zag blocks with a ring) equals the single-rank batch
// at the positions it holds, labels included; padding beyond it is input 0, label -100; the
// shards' valid counts sum to the single batch's, which every rank's global count knows.
void expect_shards_equal_single(const config::DataOptions& data, int64_t length,
                                int64_t micro_batch, int64_t sp, int64_t ring, int64_t step) {
  SCOPED_TRACE("sp " + std::to_string(sp) + " ring " + std::to_string(ring) + " step " +
               std::to_string(step));
  const DataLoader single(data, {length, micro_batch, 1}, kVocab, 1, 0, 1, 0);
  const Batch whole = single.micro_batch(step, 0);  // [bs, L]
  int64_t valid = 0;
  for (int64_t r = 0; r < sp; ++r) {
    const DataLoader loader(data, {length, micro_batch, 1}, kVocab, 1, 0, sp, r, "data.source",
                            ring);
    EXPECT_EQ(loader.global_valid_tokens(step), whole.valid_tokens);
    const Batch shard = loader.micro_batch(step, 0);
    valid += shard.valid_tokens;
    const at::Tensor at_positions = loader.shard_positions();
    for (int64_t b = 0; b < micro_batch; ++b) {
      for (int64_t i = 0; i < at_positions.numel(); ++i) {
        const int64_t p = at_positions[i].item<int64_t>();
        if (p >= length) {
          EXPECT_EQ(shard.input_ids[b][i].item<int64_t>(), 0);
          EXPECT_EQ(shard.labels[b][i].item<int64_t>(), -100);
          continue;
        }
        ASSERT_EQ(shard.input_ids[b][i].item<int64_t>(), whole.input_ids[b][p].item<int64_t>());
        ASSERT_EQ(shard.labels[b][i].item<int64_t>(), whole.labels[b][p].item<int64_t>())
            << "rank " << r << " row " << b << " position " << p;
        ASSERT_EQ(shard.position_ids[b][i].item<int64_t>(),
                  whole.position_ids[b][p].item<int64_t>());
      }
      if (whole.doc_ids.defined()) {
        EXPECT_TRUE(shard.doc_ids[b].narrow(0, 0, length).equal(whole.doc_ids[b]));
      }
    }
  }
  EXPECT_EQ(valid, whole.valid_tokens);
}

// The loss mask in windows: label j of sample i is ignored exactly where the stream's token
// i*L + j + 1 has mask 0 (besides the sample's last position and, packed, each document's last
// token), on the whole sample, so every rank's shard at sp 2, 4, 3 and with a ring (4 = 2 x 2,
// 8 = 2 x 4) holds the single rank's labels.
TEST(DataLoaderSharding, LossMaskAppliedBeforeSharding) {
  TempDir dir;
  std::vector<int64_t> stream;
  std::vector<uint8_t> mask;
  const std::vector<int64_t> lengths = {9, 4, 12, 3, 7, 10, 5, 8, 6, 11};  // 75 tokens
  const std::string prefix = write_masked_dataset(dir, lengths, &stream, &mask);
  std::vector<int64_t> begin = {0};  // stream offsets where documents begin
  for (int64_t n : lengths) begin.push_back(begin.back() + n);
  const int64_t length = 13;
  for (bool pack : {false, true}) {
    SCOPED_TRACE(pack ? "packed" : "unpacked");
    config::DataOptions data;
    data.source = "megatron:" + prefix;
    data.pack = pack;
    ASSERT_EQ(open_token_source(data, length, kVocab)->loss_mask_prefix(), prefix + "_loss_mask");
    const DataLoader single(data, {length, 5, 1}, kVocab, 1, 0, 1, 0);
    const Batch batch = single.micro_batch(1, 0);  // samples 0..4: stream [0, 65)
    int64_t ignored_by_mask = 0;  // labels the mask alone ignores
    for (int64_t i = 0; i < 5; ++i) {
      for (int64_t j = 0; j < length; ++j) {
        const int64_t target = i * length + j + 1;
        const bool last = j + 1 == length;
        const bool next_begins = pack && std::count(begin.begin(), begin.end(), target) > 0;
        const bool learned = !last && !next_begins && mask[target] == 1;
        EXPECT_EQ(batch.labels[i][j].item<int64_t>(), learned ? stream[target] : -100)
            << "sample " << i << " position " << j;
        if (!last && !next_begins && mask[target] == 0) ++ignored_by_mask;
      }
    }
    EXPECT_GT(ignored_by_mask, 10);
    EXPECT_EQ(single.global_valid_tokens(1), batch.valid_tokens);
    for (const auto& [sp, ring] : {std::pair<int64_t, int64_t>{2, 1}, {4, 1}, {3, 1}, {4, 2},
                                   {8, 4}}) {
      expect_shards_equal_single(data, length, 2, sp, ring, 2);
    }
    // Every layout of dp, sp, micro-batches and accumulation reassembles the single batch.
    check_reassembly(data, length, /*masked=*/true);

    data.loss_mask = "ignore";  // the same data learning every token
    const Batch unmasked = DataLoader(data, {length, 5, 1}, kVocab, 1, 0, 1, 0).micro_batch(1, 0);
    EXPECT_EQ(unmasked.valid_tokens, batch.valid_tokens + ignored_by_mask);
  }
}

// Whole documents: lengths 3 4 2 9 5 1 12 at L 8 pack, in order, as [3 4] [2] [9 cut to 8] [5 1]
// [12 cut to 8] (truncate) or [3 4] [2 5 1] (drop: 9 and 12 left out); no document is cut across
// two samples; each sample is padded with label -100 and a doc id of its own; labels follow the
// mask; the plan wraps after its last sample.
TEST(DataLoaderPacking, WholeDocumentsTruncatedOrDroppedAndCounted) {
  TempDir dir;
  std::vector<int64_t> stream;
  std::vector<uint8_t> mask;
  const std::vector<int64_t> lengths = {3, 4, 2, 9, 5, 1, 12};
  const std::string prefix = write_masked_dataset(dir, lengths, &stream, &mask);
  std::vector<int64_t> begin = {0};  // stream offset of each document
  for (int64_t n : lengths) begin.push_back(begin.back() + n);
  const int64_t length = 8;
  struct Plan {
    std::string overlong;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> samples;  // (document, tokens taken)
    int64_t truncated, dropped;
  };
  const std::vector<Plan> plans = {
      {"truncate", {{{0, 3}, {1, 4}}, {{2, 2}}, {{3, 8}}, {{4, 5}, {5, 1}}, {{6, 8}}}, 2, 0},
      {"drop", {{{0, 3}, {1, 4}}, {{2, 2}, {4, 5}, {5, 1}}}, 0, 2}};
  for (const Plan& plan : plans) {
    SCOPED_TRACE("data.overlong " + plan.overlong);
    config::DataOptions data;
    data.source = "megatron:" + prefix;
    data.packing = "documents";
    data.overlong = plan.overlong;
    const auto samples = static_cast<int64_t>(plan.samples.size());
    const DataLoader single(data, {length, samples, 1}, kVocab, 1, 0, 1, 0);
    const std::optional<PackingCounts> counts = single.packing_counts();
    ASSERT_TRUE(counts.has_value());
    int64_t tokens = 0;
    for (const auto& sample : plan.samples) {
      for (const auto& piece : sample) tokens += piece.second;
    }
    EXPECT_EQ(counts->documents, 7);
    EXPECT_EQ(counts->samples, samples);
    EXPECT_EQ(counts->truncated, plan.truncated);
    EXPECT_EQ(counts->dropped, plan.dropped);
    EXPECT_EQ(counts->tokens, tokens);
    EXPECT_EQ(counts->padding_tokens, samples * length - tokens);

    for (int64_t step : {1, 2}) {  // step 2 wraps: the same samples again
      const Batch batch = single.micro_batch(step, 0);  // [samples, L]
      ASSERT_TRUE(batch.doc_ids.defined()) << "documents mode implies per-document attention";
      int64_t valid = 0;
      for (int64_t i = 0; i < samples; ++i) {
        int64_t j = 0;
        for (size_t k = 0; k < plan.samples[i].size(); ++k) {
          const auto [document, taken] = plan.samples[i][k];
          for (int64_t t = 0; t < taken; ++t, ++j) {
            const int64_t at = begin[document] + t;
            ASSERT_EQ(batch.input_ids[i][j].item<int64_t>(), stream[at]) << i << "/" << j;
            ASSERT_EQ(batch.position_ids[i][j].item<int64_t>(), t);
            ASSERT_EQ(batch.doc_ids[i][j].item<int64_t>(), static_cast<int64_t>(k));
            const bool learned = t + 1 < taken && mask[at + 1] == 1;
            ASSERT_EQ(batch.labels[i][j].item<int64_t>(), learned ? stream[at + 1] : -100)
                << "sample " << i << " position " << j;
            valid += learned ? 1 : 0;
          }
        }
        const auto documents = static_cast<int64_t>(plan.samples[i].size());
        for (; j < length; ++j) {  // padding: attends to nothing real, learns nothing
          EXPECT_EQ(batch.input_ids[i][j].item<int64_t>(), 0);
          EXPECT_EQ(batch.labels[i][j].item<int64_t>(), -100);
          EXPECT_EQ(batch.doc_ids[i][j].item<int64_t>(), documents);
        }
      }
      EXPECT_EQ(batch.valid_tokens, valid);
      EXPECT_EQ(single.global_valid_tokens(step), valid);
    }
    // SP shards, with and without a ring, hold the single rank's rows.
    for (const auto& [sp, ring] : {std::pair<int64_t, int64_t>{2, 1}, {4, 1}, {3, 1}, {4, 2}}) {
      expect_shards_equal_single(data, length, samples, sp, ring, 1);
    }
  }
  // Deterministic: another loader, another rank layout, the same rows.
  config::DataOptions data;
  data.source = "megatron:" + prefix;
  data.packing = "documents";
  const Batch a = DataLoader(data, {length, 3, 1}, kVocab, 1, 0, 1, 0).micro_batch(2, 0);
  const Batch b = DataLoader(data, {length, 3, 1}, kVocab, 1, 0, 1, 0).micro_batch(2, 0);
  EXPECT_TRUE(a.input_ids.equal(b.input_ids));
  EXPECT_TRUE(a.labels.equal(b.labels));
}

TEST(DataLoaderSynthetic, DeterministicAcrossLoaders) {
  config::DataOptions data;
  data.seed = 21;
  data.pack = true;
  const config::SequenceOptions seq{33, 2, 2};
  DataLoader first(data, seq, kVocab, 2, 1, 3, 2);
  DataLoader second(data, seq, kVocab, 2, 1, 3, 2);
  (void)second.micro_batch(4, 1);  // reading other batches first changes nothing
  for (int64_t step : {1, 2, 7}) {
    for (int64_t micro : {0, 1}) {
      const Batch a = first.micro_batch(step, micro);
      const Batch b = second.micro_batch(step, micro);
      EXPECT_TRUE(a.input_ids.equal(b.input_ids));
      EXPECT_TRUE(a.labels.equal(b.labels));
      EXPECT_TRUE(a.position_ids.equal(b.position_ids));
      EXPECT_TRUE(a.doc_ids.equal(b.doc_ids));
    }
    EXPECT_EQ(first.global_valid_tokens(step), second.global_valid_tokens(step));
  }
  EXPECT_FALSE(first.micro_batch(1, 0).input_ids.equal(first.micro_batch(2, 0).input_ids));

  // The evaluation loader: same class, eval's source and seed.
  config::EvalOptions eval;
  eval.source = "synthetic";
  eval.seed = 99;
  DataLoader eval_loader(eval_data_options(data, eval), seq, kVocab, 2, 1, 3, 2, "eval.source");
  EXPECT_FALSE(eval_loader.micro_batch(1, 0).input_ids.equal(first.micro_batch(1, 0).input_ids));
  EXPECT_TRUE(eval_loader.micro_batch(1, 0).doc_ids.defined());
}

TEST(DataLoaderResume, ContinueFromTakesTheStreamWhereTheCheckpointLeftIt) {
  config::DataOptions data;  // synthetic
  const config::SequenceOptions seq{16, 2, 1};
  // dp 2 x mb 2: G = 4. The checkpoint had seen 6 samples after step 3 (a run with G = 2).
  DataLoader resumed(data, seq, kVocab, 2, 1, 1, 0);
  resumed.continue_from(4, 6);
  EXPECT_EQ(resumed.first_sample(4), 6);
  EXPECT_EQ(resumed.first_sample(5), 10);
  EXPECT_EQ(resumed.sample_index(4, 0, 0), 6 + 2);  // dp rank 1 takes the second block of 2
  DataLoader fresh(data, {16, 1, 1}, kVocab, 1, 0, 1, 0);  // G = 1: step s is sample s-1
  EXPECT_TRUE(resumed.micro_batch(4, 0).input_ids[0].equal(fresh.micro_batch(9, 0).input_ids[0]));
}

TEST(DataLoaderErrors, BadInputNamesTheKeyOrFile) {
  TempDir dir;
  config::DataOptions data;
  const config::SequenceOptions seq{16, 1, 1};
  expect_user_error(
      [&] {
        DataLoader(data, {0, 1, 1}, kVocab, 1, 0, 1, 0);
      },
      {"sequence.length", "0"});
  expect_user_error(
      [&] {
        DataLoader(data, {16, 0, 1}, kVocab, 1, 0, 1, 0);
      },
      {"sequence.micro_batch"});
  expect_user_error(
      [&] {
        DataLoader(data, {16, 1, 0}, kVocab, 1, 0, 1, 0);
      },
      {"sequence.grad_accum"});
  expect_user_error([&] { DataLoader(data, seq, 0, 1, 0, 1, 0); }, {"model.vocab_size"});

  data.source = "tokenz:/x";
  expect_user_error([&] { DataLoader(data, seq, kVocab, 1, 0, 1, 0); }, {"data.source", "tokenz"});
  data.source = "tokens:" + dir.file("absent.bin");
  expect_user_error([&] { DataLoader(data, seq, kVocab, 1, 0, 1, 0); },
                    {"data.source", dir.file("absent.bin"), "cannot open"});
  config::EvalOptions eval;
  eval.source = "megatron:" + dir.file("absent");
  expect_user_error(
      [&] { DataLoader(eval_data_options(data, eval), seq, kVocab, 1, 0, 1, 0, "eval.source"); },
      {"eval.source", dir.file("absent") + ".bin"});

  const std::string short_file = dir.file("short.bin");
  write_token_file(short_file, std::vector<int64_t>(15, 1), TokenDType::kUInt16);
  data.source = "tokens:" + short_file;
  expect_user_error([&] { DataLoader(data, seq, kVocab, 1, 0, 1, 0); },
                    {short_file, "too short", "15 tokens"});

  const std::string big_file = dir.file("big.bin");
  std::vector<int64_t> tokens(32, 1);
  tokens[20] = kVocab;  // in sample 1
  write_token_file(big_file, tokens, TokenDType::kUInt16);
  data.source = "tokens:" + big_file;
  DataLoader loader(data, seq, kVocab, 1, 0, 1, 0);
  EXPECT_NO_THROW(loader.micro_batch(1, 0));
  expect_user_error([&] { loader.micro_batch(2, 0); }, {big_file, "token 97", "offset 20"});
}

// A loss mask that does not fit its tokens, a mask named as the token source, a required mask
// that is missing, documents packing of a source without document boundaries, and a dataset whose
// every document is dropped: one line naming the key and the file, before any batch.
TEST(DataLoaderErrors, LossMaskAndDocumentsBadInput) {
  TempDir dir;
  const config::SequenceOptions seq{4, 1, 1};
  const std::string prefix = dir.file("chats");
  const std::string mask = prefix + "_loss_mask";
  write_megatron_dataset(prefix, {{5, 6, 7}, {8, 9}}, TokenDType::kUInt16);
  config::DataOptions data;
  data.source = "megatron:" + prefix;
  const auto load = [&](const std::string& key = "data.source") {
    config::EvalOptions eval;
    eval.source = data.source;
    DataLoader(key == "data.source" ? data : eval_data_options(data, eval), seq, kVocab, 1, 0, 1,
               0, key);
  };

  write_megatron_dataset(mask, {{0, 1, 1}, {1}}, TokenDType::kUInt8);
  expect_user_error([&] { load(); }, {"data.source: ", mask + ".idx", "sequence 1 has 1 values",
                                      prefix + ".idx", "are 2"});
  data.packing = "documents";
  expect_user_error([&] { load("eval.source"); }, {"eval.source: ", mask + ".idx", "sequence 1"});
  data.packing = "windows";
  write_megatron_dataset(mask, {{0, 1, 1}}, TokenDType::kUInt8);
  expect_user_error([&] { load(); }, {mask + ".idx", "holds 1 sequences", "holds 2"});
  data.loss_mask = "ignore";  // the user's choice: the mask is not read at all
  EXPECT_NO_THROW(load());
  data.loss_mask = "auto";
  std::filesystem::remove(mask + ".idx");  // half a mask dataset is not silently skipped
  expect_user_error([&] { load(); }, {"data.source", mask + ".idx", "cannot open"});
  std::filesystem::remove(mask + ".bin");
  EXPECT_NO_THROW(load());  // no mask: every token is learned
  data.loss_mask = "require";
  expect_user_error([&] { load(); }, {"data.source", "data.loss_mask", mask + ".bin"});

  write_megatron_dataset(mask, {{0, 1, 1}, {1, 1}}, TokenDType::kUInt8);
  EXPECT_NO_THROW(load());
  data.source = "megatron:" + mask;  // the mask where the tokens belong
  expect_user_error([&] { load(); }, {"data.source", "is the loss mask of megatron:" + prefix});

  data.source = "synthetic";
  expect_user_error([&] { load(); }, {"data.loss_mask", "require", "data.source is synthetic"});
  data.loss_mask = "auto";
  data.packing = "documents";
  expect_user_error([&] { load(); }, {"data.packing", "data.source is synthetic"});
  const std::string flat = dir.file("flat.bin");
  write_token_file(flat, std::vector<int64_t>(16, 5), TokenDType::kUInt16);
  data.source = "tokens:" + flat;
  expect_user_error([&] { load("eval.source"); },
                    {"data.packing", "eval.source is tokens:" + flat, "no document boundaries"});
  data.packing = "conversations";
  expect_user_error([&] { load(); }, {"data.packing", "windows or documents", "conversations"});

  data.source = "megatron:" + prefix;
  data.packing = "documents";
  data.overlong = "drop";
  expect_user_error([&] { DataLoader(data, {1, 1, 1}, kVocab, 1, 0, 1, 0); },
                    {"data.source", prefix, "every one of its 2 documents", "data.overlong"});
  data.overlong = "truncate";
  const DataLoader truncated(data, {1, 1, 1}, kVocab, 1, 0, 1, 0);
  EXPECT_EQ(truncated.packing_counts()->truncated, 2);

  // An index whose one document spans every sequence marks no boundaries: document_indices
  // [0, 2] instead of [0, 1, 2] (the last 8 bytes dropped, document_count 3 -> 2).
  std::ifstream in(prefix + ".idx", std::ios::binary);
  std::vector<char> idx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t indices = idx.size() - 3 * 8;  // document_indices i64[3] end the file
  const int64_t two = 2;
  std::memcpy(idx.data() + indices + 8, &two, 8);
  idx.resize(idx.size() - 8);
  const uint64_t document_count = 2;
  std::memcpy(idx.data() + 9 + 8 + 1 + 8, &document_count, 8);  // after magic, version, code, seqs
  std::ofstream(prefix + ".idx", std::ios::binary).write(idx.data(), idx.size());
  expect_user_error([&] { DataLoader(data, seq, kVocab, 1, 0, 1, 0); },
                    {"data.source", prefix + ".idx", "no document boundaries"});
  data.packing = "windows";  // windows need none
  EXPECT_NO_THROW(DataLoader(data, seq, kVocab, 1, 0, 1, 0));
}

}  // namespace
}  // namespace ulysses::data
