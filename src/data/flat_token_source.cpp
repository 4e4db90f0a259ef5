// Flat token files (see flat_token_source.h).
#include "data/flat_token_source.h"

#include <c10/util/Exception.h>

#include "common/error.h"

namespace ulysses::data {

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
