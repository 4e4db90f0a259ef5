// Flat token files (see flat_token_source.h).
#include "data/flat_token_source.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace ulysses::data {
namespace {

constexpr int64_t kDTypeProbeBytes = 128 * 1024;  // the prefix the width checks look at
constexpr int64_t kDTypeProbeMinPairs = 8;        // fewer uint16 pairs than this: no verdict

// Throws when PATH.dtype exists and names another type than `dtype`.
void check_dtype_record(const std::string& path, TokenDType dtype) {
  const std::string record = token_dtype_record_path(path);
  std::error_code ec;
  if (!std::filesystem::exists(record, ec)) return;
  std::ifstream in(record);
  std::string recorded;
  in >> recorded;
  if (recorded != token_dtype_name(dtype)) {
    throw UserError(std::string("data.token_dtype: is ") + token_dtype_name(dtype) + " but " +
                    record + " says " + path + " holds " + recorded + " tokens");
  }
}

// Throws when the first bytes of the file look like tokens of the other width (see the header).
void check_token_width(const MappedFile& file, TokenDType dtype, int64_t vocab_size) {
  const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(file.size()), kDTypeProbeBytes) / 4 * 4;
  const int64_t halves = bytes / 2;  // uint16 values in the probe
  if (halves / 2 < kDTypeProbeMinPairs) return;
  std::vector<int64_t> as16(halves);
  decode_tokens(file.data(), halves, TokenDType::kUInt16, as16.data());
  bool odd_all_zero = true, even_any_nonzero = false, all16_fit = true;
  for (int64_t i = 0; i < halves; ++i) {
    if (i % 2 == 1 && as16[i] != 0) odd_all_zero = false;
    if (i % 2 == 0 && as16[i] != 0) even_any_nonzero = true;
    if (as16[i] >= vocab_size) all16_fit = false;
  }
  if (dtype == TokenDType::kUInt16 && odd_all_zero && even_any_nonzero) {
    throw UserError("data.token_dtype: uint16, but every second uint16 of " + file.path() +
                    " is 0, as in a file of uint32 tokens; set data.token_dtype: uint32");
  }
  if (dtype == TokenDType::kUInt32) {
    std::vector<int64_t> as32(halves / 2);
    decode_tokens(file.data(), halves / 2, TokenDType::kUInt32, as32.data());
    const auto outside = std::count_if(as32.begin(), as32.end(),
                                       [&](int64_t t) { return t >= vocab_size; });
    if (all16_fit && 2 * outside > static_cast<int64_t>(as32.size())) {
      throw UserError("data.token_dtype: uint32, but most tokens of " + file.path() +
                      " read as uint32 are >= model.vocab_size " + std::to_string(vocab_size) +
                      " while every uint16 fits, as in a file of uint16 tokens; set "
                      "data.token_dtype: uint16");
    }
  }
}

}  // namespace

std::string token_dtype_record_path(const std::string& path) { return path + ".dtype"; }

FlatTokenSource::FlatTokenSource(const std::string& path, TokenDType dtype, int64_t length,
                                 int64_t vocab_size, int64_t eod_token, const std::string& key)
    : file_(path, key),
      dtype_(dtype),
      key_(key),
      length_(length),
      vocab_size_(vocab_size),
      eod_token_(eod_token) {
  TORCH_CHECK(dtype == TokenDType::kUInt16 || dtype == TokenDType::kUInt32,
              "FlatTokenSource: token type ", token_dtype_name(dtype), " is not uint16/uint32");
  TORCH_CHECK(length >= 1 && vocab_size >= 1, "FlatTokenSource: bad length/vocab_size");
  check_dtype_record(path, dtype);
  const int64_t token_bytes = token_dtype_bytes(dtype);
  const auto bytes = static_cast<int64_t>(file_.size());
  if (bytes % token_bytes != 0) {
    throw UserError(key + ": " + path + ": size " + std::to_string(bytes) +
                    " bytes is not a multiple of " + std::to_string(token_bytes) +
                    " (data.token_dtype=" + token_dtype_name(dtype) + ")");
  }
  const int64_t num_tokens = bytes / token_bytes;
  num_samples_ = num_tokens / length;
  if (num_samples_ == 0) {
    throw UserError(key + ": " + path +
                    ": too short for one sample: " + std::to_string(num_tokens) +
                    " tokens < sequence.length " + std::to_string(length));
  }
  check_token_width(file_, dtype, vocab_size);
}

std::vector<int64_t> FlatTokenSource::tokens(int64_t index) const {
  TORCH_CHECK(index >= 0, "FlatTokenSource: negative sample index ", index);
  const int64_t first = (index % num_samples_) * length_;
  std::vector<int64_t> out(length_);  // [L]
  decode_tokens(file_.data() + first * token_dtype_bytes(dtype_), length_, dtype_, out.data());
  require_tokens_in_vocab(out, vocab_size_, first, file_.path(), key_);
  return out;
}

std::vector<int64_t> FlatTokenSource::document_starts(int64_t index) const {
  std::vector<int64_t> starts;
  if (eod_token_ < 0) return starts;
  const std::vector<int64_t> sample = tokens(index);  // [L]
  for (int64_t j = 0; j + 1 < length_; ++j) {
    if (sample[j] == eod_token_) starts.push_back(j + 1);
  }
  return starts;
}

}  // namespace ulysses::data
