// Token sources against files written to spec: source strings, flat uint16/uint32 files, the
// Megatron MMIDIDX format (writer bytes checked against a hand-assembled index, reader against
// hand-built multi-sequence documents), synthetic determinism, and bad-input errors.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <numeric>

#include "data/dataset_writer.h"
#include "data/flat_token_source.h"
#include "data/megatron_index.h"
#include "data/megatron_source.h"
#include "data/source_spec.h"
#include "data/synthetic_source.h"
#include "data/token_source.h"
#include "data_test_util.h"

namespace ulysses::data {
namespace {

using test::expect_user_error;
using test::TempDir;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Little-endian bytes of `value`, written out by shifts (independent of the code under test).
template <typename T>
void put_le(std::vector<uint8_t>* bytes, T value) {
  auto bits = static_cast<uint64_t>(value);
  for (size_t i = 0; i < sizeof(T); ++i) bytes->push_back(static_cast<uint8_t>(bits >> (8 * i)));
}

// tokens 0, 1, 2, ... n-1 scaled into the vocabulary by `stride`, for recognizable content.
std::vector<int64_t> ramp(int64_t n, int64_t stride, int64_t vocab) {
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = (i * stride) % vocab;
  return out;
}

TEST(SourceSpec, ParsesTheThreeKinds) {
  EXPECT_EQ(parse_source("synthetic").kind, SourceKind::kSynthetic);
  const SourceSpec tokens = parse_source("tokens:/data/a b.bin");
  EXPECT_EQ(tokens.kind, SourceKind::kTokens);
  EXPECT_EQ(tokens.path, "/data/a b.bin");
  const SourceSpec megatron = parse_source("megatron:corpus/text_document");
  EXPECT_EQ(megatron.kind, SourceKind::kMegatron);
  EXPECT_EQ(megatron.path, "corpus/text_document");
}

TEST(SourceSpec, BadStringsNameTheKey) {
  expect_user_error([] { parse_source("tokens"); }, {"data.source", "tokens"});
  expect_user_error([] { parse_source("tokens:"); }, {"data.source", "path"});
  expect_user_error([] { parse_source("megatron:", "eval.source"); }, {"eval.source"});
  expect_user_error([] { parse_source("hf:foo"); }, {"data.source", "hf:foo"});
  expect_user_error([] { parse_source(""); }, {"data.source"});
}

// A flat file of either width: sample i is tokens [i*L, (i+1)*L), wrapped over whole samples.
void check_flat_file(TokenDType dtype, int64_t vocab) {
  TempDir dir;
  const std::string path = dir.file("tokens.bin");
  const int64_t length = 7;
  const std::vector<int64_t> stream = ramp(3 * length + 4, 9973, vocab);  // 3 samples + a tail
  write_token_file(path, stream, dtype);
  // The file holds exactly the little-endian values, nothing else.
  const std::vector<uint8_t> bytes = read_bytes(path);
  const int64_t width = dtype == TokenDType::kUInt16 ? 2 : 4;
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), width * static_cast<int64_t>(stream.size()));
  for (size_t i = 0; i < stream.size(); ++i) {
    uint64_t value = 0;
    for (int64_t b = 0; b < width; ++b) value |= uint64_t(bytes[i * width + b]) << (8 * b);
    ASSERT_EQ(static_cast<int64_t>(value), stream[i]);
  }

  FlatTokenSource source(path, dtype, length, vocab, /*eod_token=*/-1, "data.source");
  EXPECT_EQ(source.num_samples(), 3);
  for (int64_t index = 0; index < 8; ++index) {
    const int64_t first = (index % 3) * length;
    const std::vector<int64_t> expected(stream.begin() + first, stream.begin() + first + length);
    EXPECT_EQ(source.tokens(index), expected) << "sample " << index;
  }
  EXPECT_TRUE(source.document_starts(0).empty());
}

TEST(FlatTokenSource, Uint16File) { check_flat_file(TokenDType::kUInt16, 65536); }

TEST(FlatTokenSource, Uint32FileHoldsTokensAbove16Bits) {
  check_flat_file(TokenDType::kUInt32, 200000);  // tokens up to 199999 need 32 bits
}

TEST(FlatTokenSource, DocumentsEndAtEachEodToken) {
  TempDir dir;
  const std::string path = dir.file("docs.bin");
  // eod = 1. Sample 0: [5 6 1 7 8 9 1 10]; sample 1: [1 11 12 1 1 13 14 1].
  write_token_file(path, {5, 6, 1, 7, 8, 9, 1, 10, 1, 11, 12, 1, 1, 13, 14, 1},
                   TokenDType::kUInt16);
  FlatTokenSource source(path, TokenDType::kUInt16, 8, 100, /*eod_token=*/1, "data.source");
  EXPECT_EQ(source.document_starts(0), (std::vector<int64_t>{3, 7}));
  // An eod at the last position starts nothing inside the sample.
  EXPECT_EQ(source.document_starts(1), (std::vector<int64_t>{1, 4, 5}));
}

TEST(FlatTokenSource, BadFilesNameTheFile) {
  TempDir dir;
  const std::string missing = dir.file("missing.bin");
  expect_user_error(
      [&] { FlatTokenSource(missing, TokenDType::kUInt16, 4, 10, -1, "data.source"); },
      {"data.source", missing, "cannot open"});

  const std::string short_file = dir.file("short.bin");
  write_token_file(short_file, {1, 2, 3}, TokenDType::kUInt32);
  expect_user_error(
      [&] { FlatTokenSource(short_file, TokenDType::kUInt32, 4, 10, -1, "data.source"); },
      {short_file, "too short", "3 tokens", "4"});

  const std::string odd = dir.file("odd.bin");
  write_raw(odd, {1, 0, 2, 0, 3});
  expect_user_error([&] { FlatTokenSource(odd, TokenDType::kUInt16, 1, 10, -1, "data.source"); },
                    {odd, "multiple of 2"});

  const std::string big = dir.file("big.bin");
  write_token_file(big, {1, 2, 3, 4, 5, 6, 70, 8}, TokenDType::kUInt16);
  FlatTokenSource source(big, TokenDType::kUInt16, 4, 50, -1, "data.source");
  EXPECT_NO_THROW(source.tokens(0));
  expect_user_error([&] { source.tokens(1); }, {big, "token 70", "offset 6", "vocab_size=50"});
}

TEST(FlatTokenSource, TokensOfTheOtherWidthAreRefused) {
  TempDir dir;
  const std::vector<int64_t> tokens = ramp(40, 1, 61);  // [0, 1, ..., 39]
  // uint32 tokens read as uint16: every second uint16 is 0.
  const std::string wide = dir.file("wide.bin");
  write_token_file(wide, tokens, TokenDType::kUInt32);
  std::filesystem::remove(token_dtype_record_path(wide));  // a file from elsewhere
  expect_user_error([&] { FlatTokenSource(wide, TokenDType::kUInt16, 8, 61, -1, "data.source"); },
                    {"data.token_dtype", "uint32", wide});
  // uint16 tokens read as uint32: most values beyond the vocabulary, each half within it.
  const std::string narrow = dir.file("narrow.bin");
  write_token_file(narrow, tokens, TokenDType::kUInt16);
  std::filesystem::remove(token_dtype_record_path(narrow));
  expect_user_error([&] { FlatTokenSource(narrow, TokenDType::kUInt32, 4, 61, -1, "data.source"); },
                    {"data.token_dtype", "uint16", narrow});
  // Read with the right width both are fine.
  EXPECT_NO_THROW(FlatTokenSource(wide, TokenDType::kUInt32, 8, 61, -1, "data.source"));
  EXPECT_NO_THROW(FlatTokenSource(narrow, TokenDType::kUInt16, 8, 61, -1, "data.source"));
}

TEST(FlatTokenSource, TheWriterRecordsTheTokenTypeAndTheReaderChecksIt) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  // Tokens that look the same at either width (a short file gives the width checks no verdict).
  write_token_file(path, {3, 4, 5, 6}, TokenDType::kUInt32);
  EXPECT_EQ(read_bytes(token_dtype_record_path(path)),
            (std::vector<uint8_t>{'u', 'i', 'n', 't', '3', '2', '\n'}));
  expect_user_error([&] { FlatTokenSource(path, TokenDType::kUInt16, 2, 61, -1, "data.source"); },
                    {"data.token_dtype", "uint16", path + ".dtype", "uint32"});
  EXPECT_NO_THROW(FlatTokenSource(path, TokenDType::kUInt32, 2, 61, -1, "data.source"));
}

TEST(OpenTokenSource, ValidatesOptions) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  write_token_file(path, ramp(64, 1, 32), TokenDType::kUInt16);
  config::DataOptions data;
  data.source = "tokens:" + path;
  EXPECT_EQ(open_token_source(data, 8, 32)->tokens(1),
            (std::vector<int64_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  data.token_dtype = "int16";
  expect_user_error([&] { open_token_source(data, 8, 32); }, {"data.token_dtype", "int16"});
  data.token_dtype = "uint16";
  data.pack = true;
  expect_user_error([&] { open_token_source(data, 8, 32); }, {"data.eod_token"});
  data.eod_token = 32;
  expect_user_error([&] { open_token_source(data, 8, 32); }, {"data.eod_token", "32"});
  data.eod_token = 0;
  EXPECT_NO_THROW(open_token_source(data, 8, 32));
  data.source = "megatron:" + dir.file("nothing");
  expect_user_error([&] { open_token_source(data, 8, 32, "eval.source"); },
                    {"eval.source", dir.file("nothing")});
}

TEST(MegatronFormat, WriterMatchesTheMmididxLayout) {
  TempDir dir;
  const std::string prefix = dir.file("corpus");
  write_megatron_dataset(prefix, {{1, 2, 3}, {4, 5}}, TokenDType::kUInt16);

  std::vector<uint8_t> expected_idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put_le<uint64_t>(&expected_idx, 1);  // version
  put_le<uint8_t>(&expected_idx, 8);   // dtype code: uint16
  put_le<uint64_t>(&expected_idx, 2);  // sequence_count
  put_le<uint64_t>(&expected_idx, 3);  // document_count (entries of document_indices)
  put_le<int32_t>(&expected_idx, 3);   // sequence_lengths
  put_le<int32_t>(&expected_idx, 2);
  put_le<int64_t>(&expected_idx, 0);  // sequence_pointers (bytes)
  put_le<int64_t>(&expected_idx, 6);
  for (int64_t document : {0, 1, 2}) put_le<int64_t>(&expected_idx, document);
  EXPECT_EQ(read_bytes(prefix + ".idx"), expected_idx);
  EXPECT_EQ(read_bytes(prefix + ".bin"), (std::vector<uint8_t>{1, 0, 2, 0, 3, 0, 4, 0, 5, 0}));

  const MegatronIndex index = read_megatron_index(prefix + ".idx", "data.source");
  EXPECT_EQ(index.dtype, TokenDType::kUInt16);
  EXPECT_EQ(index.sequence_lengths, (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(index.sequence_pointers, (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(index.document_indices, (std::vector<int64_t>{0, 1, 2}));
}

// Documents of varied lengths (one empty) in every integer dtype Megatron defines: the stream is
// their concatenation, documents begin where the index says.
TEST(MegatronSource, StreamAndDocumentsFollowTheIndex) {
  for (TokenDType dtype : {TokenDType::kUInt8, TokenDType::kInt8, TokenDType::kUInt16,
                           TokenDType::kInt16, TokenDType::kInt32, TokenDType::kInt64}) {
    SCOPED_TRACE(token_dtype_name(dtype));
    TempDir dir;
    const std::string prefix = dir.file("ds");
    const std::vector<int64_t> lengths = {4, 9, 0, 1, 6, 3, 5};  // 28 tokens
    std::vector<std::vector<int64_t>> documents;
    std::vector<int64_t> stream;
    std::vector<int64_t> begins;  // stream offsets of non-empty documents
    for (size_t d = 0; d < lengths.size(); ++d) {
      if (lengths[d] > 0) begins.push_back(static_cast<int64_t>(stream.size()));
      documents.emplace_back();
      for (int64_t t = 0; t < lengths[d]; ++t) {
        documents.back().push_back(static_cast<int64_t>((d * 13 + t * 7) % 100));
        stream.push_back(documents.back().back());
      }
    }
    write_megatron_dataset(prefix, documents, dtype);
    const int64_t length = 6;  // 4 whole samples, 4 tokens of tail
    MegatronSource source(prefix, length, 100, "data.source");
    ASSERT_EQ(source.num_tokens(), 28);
    ASSERT_EQ(source.num_samples(), 4);
    for (int64_t index = 0; index < 9; ++index) {
      const int64_t first = (index % 4) * length;
      EXPECT_EQ(source.tokens(index),
                std::vector<int64_t>(stream.begin() + first, stream.begin() + first + length))
          << "sample " << index;
      std::vector<int64_t> starts;
      for (int64_t begin : begins) {
        if (begin > first && begin < first + length) starts.push_back(begin - first);
      }
      EXPECT_EQ(source.document_starts(index), starts) << "sample " << index;
    }
  }
}

// An index written by hand, with a document of two sequences and sequences stored out of order in
// the .bin (pointers are followed, not assumed contiguous).
TEST(MegatronSource, MultiSequenceDocumentsAndScatteredPointers) {
  TempDir dir;
  const std::string prefix = dir.file("hand");
  // .bin (int32): seq 1 = [20 21], seq 0 = [10 11 12], seq 2 = [30 31 32 33].
  std::vector<uint8_t> bin;
  for (int32_t token : {20, 21, 10, 11, 12, 30, 31, 32, 33}) put_le<int32_t>(&bin, token);
  write_raw(prefix + ".bin", bin);
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put_le<uint64_t>(&idx, 1);
  put_le<uint8_t>(&idx, 4);  // int32
  put_le<uint64_t>(&idx, 3);
  put_le<uint64_t>(&idx, 3);
  for (int32_t n : {3, 2, 4}) put_le<int32_t>(&idx, n);
  for (int64_t p : {8, 0, 20}) put_le<int64_t>(&idx, p);
  for (int64_t d : {0, 2, 3}) put_le<int64_t>(&idx, d);  // doc 0 = seqs 0,1; doc 1 = seq 2
  write_raw(prefix + ".idx", idx);

  MegatronSource source(prefix, 9, 64, "data.source");
  EXPECT_EQ(source.tokens(0), (std::vector<int64_t>{10, 11, 12, 20, 21, 30, 31, 32, 33}));
  EXPECT_EQ(source.document_starts(0), (std::vector<int64_t>{5}));
}

TEST(MegatronSource, BadFilesNameTheFile) {
  TempDir dir;
  const std::string prefix = dir.file("ds");
  expect_user_error([&] { MegatronSource(prefix, 4, 100, "data.source"); },
                    {"data.source", prefix + ".bin", "cannot open"});
  write_megatron_dataset(prefix, {{1, 2, 3}, {4, 5}}, TokenDType::kUInt16);
  expect_user_error([&] { MegatronSource(prefix, 6, 100, "data.source"); },
                    {prefix + ".bin", "too short", "5 tokens"});
  MegatronSource small_vocab(prefix, 2, 4, "data.source");
  EXPECT_NO_THROW(small_vocab.tokens(0));
  expect_user_error([&] { small_vocab.tokens(1); }, {prefix + ".bin", "token 4", "vocab_size=4"});

  std::vector<uint8_t> idx = read_bytes(prefix + ".idx");
  std::vector<uint8_t> bad_magic = idx;
  bad_magic[0] = 'X';
  write_raw(prefix + ".idx", bad_magic);
  expect_user_error([&] { MegatronSource(prefix, 2, 100, "data.source"); },
                    {prefix + ".idx", "magic"});
  std::vector<uint8_t> float_dtype = idx;
  float_dtype[17] = 7;  // float32
  write_raw(prefix + ".idx", float_dtype);
  expect_user_error([&] { MegatronSource(prefix, 2, 100, "data.source"); },
                    {prefix + ".idx", "dtype code 7"});
  write_raw(prefix + ".idx", std::vector<uint8_t>(idx.begin(), idx.end() - 4));
  expect_user_error([&] { MegatronSource(prefix, 2, 100, "data.source"); },
                    {prefix + ".idx", "truncated"});
  write_raw(prefix + ".idx", idx);
  write_raw(prefix + ".bin", {1, 0, 2, 0, 3, 0});  // the second sequence is gone
  expect_user_error([&] { MegatronSource(prefix, 2, 100, "data.source"); },
                    {prefix + ".bin", "sequence 1", "beyond the end"});
}

TEST(SyntheticSource, PureFunctionOfSeedAndIndex) {
  const int64_t length = 257;
  const int64_t vocab = 1000;
  SyntheticSource first(42, length, vocab);
  SyntheticSource second(42, length, vocab);
  SyntheticSource other_seed(43, length, vocab);
  // Reading in a different order gives the same samples: no hidden state.
  const std::vector<int64_t> sample7 = first.tokens(7);
  for (int64_t index : {3, 1, 0}) (void)second.tokens(index);
  EXPECT_EQ(second.tokens(7), sample7);
  EXPECT_EQ(first.document_starts(7), second.document_starts(7));
  EXPECT_NE(first.tokens(8), sample7);
  EXPECT_NE(other_seed.tokens(7), sample7);

  // Tokens cover the vocabulary roughly uniformly: 257*200 draws, each of 10 bins within 15%.
  std::vector<int64_t> bins(10, 0);
  for (int64_t index = 0; index < 200; ++index) {
    for (int64_t token : first.tokens(index)) {
      ASSERT_GE(token, 0);
      ASSERT_LT(token, vocab);
      ++bins[token / 100];
    }
  }
  for (int64_t count : bins) EXPECT_NEAR(count, 257 * 200 / 10, 257 * 200 / 10 * 0.15);

  // Document starts ascend inside (0, L); lengths are at most L/2 (128).
  for (int64_t index = 0; index < 50; ++index) {
    const std::vector<int64_t> starts = first.document_starts(index);
    ASSERT_FALSE(starts.empty());
    int64_t previous = 0;
    for (int64_t start : starts) {
      EXPECT_GT(start, previous);
      EXPECT_LE(start - previous, length / 2);
      EXPECT_LT(start, length);
      previous = start;
    }
    EXPECT_LE(length - previous, length / 2);
  }
}

}  // namespace
}  // namespace ulysses::data
