// safetensors: round trip of every dtype, the byte layout, a hand-written file, corrupt files, the
// piecewise writer and range reads.
#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model_test_util.h"

namespace ulysses::model {
namespace {

using testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  torch::manual_seed(1);
  at::Tensor base = torch::randn({3, 5}) * 50;
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f64", base.to(at::kDouble)},
      {"f32", base},
      {"f16", base.to(at::kHalf)},
      {"bf16", base.to(at::kBFloat16)},
      {"i64", torch::randint(-(1LL << 40), 1LL << 40, {4, 2}, at::kLong)},
      {"i32", base.to(at::kInt)},
      {"i16", base.to(at::kShort)},
      {"i8", torch::randint(-128, 127, {7}, at::kChar)},
      {"u8", torch::randint(0, 255, {2, 2, 2}, at::kByte)},
      {"bool", base.gt(0)},
      {"scalar", torch::tensor(3.25)},
      {"empty", torch::zeros({0, 4})},
      {"transposed", base.t()},  // non-contiguous input
  };
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}, {"step", "7"}});
  auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(loaded.count(name)) << name;
    EXPECT_EQ(loaded[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(loaded[name].sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(loaded[name], t)) << name;
  }
  auto metadata = load_safetensors_metadata(path);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "7"}}));
}

TEST(Safetensors, ByteLayoutFollowsTheFormat) {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  save_safetensors(path, {{"b", torch::tensor({1.0f, 2.0f})}, {"a", torch::tensor({int64_t{5}})}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + 8 + 8);
  auto header = nlohmann::json::parse(bytes.substr(8, header_len));
  EXPECT_FALSE(header.contains("__metadata__"));
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(header["a"]["dtype"], "I64");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({1}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({8, 16}));
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + header_len, 4);
  EXPECT_EQ(first, 1.0f);
}

TEST(Safetensors, ParsesHandWrittenFile) {
  TempDir dir;
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("n":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]},)"
                             R"("h":{"dtype":"BF16","shape":[],"data_offsets":[16,18]}})";
  std::string data;
  // 1.5f = 0x3FC00000, -2.0f = 0xC0000000, int64 7, bf16 -0.5 = 0xBF00; all little-endian.
  data += std::string("\x00\x00\xC0\x3F", 4) + std::string("\x00\x00\x00\xC0", 4);
  data += std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8);
  data += std::string("\x00\xBF", 2);
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, le64(header.size()) + header + data);
  auto t = load_safetensors(path);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(at::equal(t["w"], torch::tensor({1.5f, -2.0f})));
  EXPECT_EQ(t["n"].sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(t["n"].item<int64_t>(), 7);
  EXPECT_EQ(t["h"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(t["h"].dim(), 0);
  EXPECT_EQ(t["h"].item<float>(), -0.5f);
  EXPECT_EQ(load_safetensors_metadata(path).at("format"), "pt");
}

// The UserError text of loading `bytes` as a file, or "" when it loads.
std::string load_error(const std::string& bytes) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  try {
    load_safetensors(path);
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;  // names the file first
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  return "";
}

TEST(Safetensors, CorruptFilesAreUserErrorsNamingTheFile) {
  const std::string good_entry = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string eight(8, '\0');
  EXPECT_NE(load_error(""), "");                                             // empty
  EXPECT_NE(load_error("abc"), "");                                          // shorter than 8
  EXPECT_NE(load_error(le64(1000) + "{}"), "");                              // header past the end
  EXPECT_NE(load_error(le64(5) + "{nope"), "");                              // not JSON
  EXPECT_NE(load_error(le64(2) + "[]"), "");                                 // not an object
  EXPECT_NE(load_error(le64(good_entry.size()) + good_entry + "1234"), "");  // data truncated
  const std::string bad_dtype = R"({"x":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_NE(load_error(le64(bad_dtype.size()) + bad_dtype + "12"), "");
  const std::string bad_size = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  EXPECT_NE(load_error(le64(bad_size.size()) + bad_size + eight), "");
  const std::string bad_shape = R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})";
  EXPECT_NE(load_error(le64(bad_shape.size()) + bad_shape + eight), "");
  EXPECT_EQ(load_error(le64(good_entry.size()) + good_entry + eight), "");  // the control
}

// SafetensorsWriter, its ranges written in any order, makes the file save_safetensors makes, byte
// for byte; read_safetensors_range reads back any range of it.
TEST(Safetensors, WriterInPiecesEqualsTheWholeSaveAndRangesReadBack) {
  TempDir dir;
  torch::manual_seed(3);
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"a", torch::randn({7, 5})}, {"b", torch::randn({11}).to(at::kBFloat16)},
      {"c", torch::randn({3, 4, 2}).to(at::kDouble)}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  save_safetensors(dir.file("whole.safetensors"), tensors, metadata);
  std::vector<SafetensorsTensor> described;
  for (const auto& [name, t] : tensors) {
    described.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsWriter writer(dir.file("pieces.safetensors"), described, metadata);
  for (size_t i = tensors.size(); i-- > 0;) {  // last tensor first, each in pieces of 3, backwards
    const at::Tensor flat = tensors[i].second.reshape({-1});
    for (int64_t begin = (flat.numel() - 1) / 3 * 3; begin >= 0; begin -= 3) {
      const int64_t count = std::min<int64_t>(3, flat.numel() - begin);
      writer.write(i, begin, flat.narrow(0, begin, count).contiguous());
    }
  }
  writer.close();
  EXPECT_EQ(read_bytes(dir.file("pieces.safetensors")), read_bytes(dir.file("whole.safetensors")));
  const std::vector<SafetensorsTensor> listed =
      read_safetensors_tensors(dir.file("pieces.safetensors"));
  ASSERT_EQ(listed.size(), tensors.size());
  for (size_t i = 0; i < listed.size(); ++i) {
    EXPECT_EQ(listed[i].name, tensors[i].first);
    const at::Tensor flat = tensors[i].second.reshape({-1});
    at::Tensor out = at::empty({flat.numel() - 2}, flat.options());
    read_safetensors_range(dir.file("pieces.safetensors"), listed[i], 1, out);
    EXPECT_TRUE(at::equal(out, flat.narrow(0, 1, flat.numel() - 2))) << listed[i].name;
  }
}

TEST(Safetensors, MissingFileIsUserError) {
  EXPECT_THROW(load_safetensors("/nonexistent/dir/x.safetensors"), UserError);
  EXPECT_THROW(save_safetensors("/nonexistent/dir/x.safetensors", {{"a", torch::ones({1})}}),
               UserError);
}

}  // namespace
}  // namespace ulysses::model
