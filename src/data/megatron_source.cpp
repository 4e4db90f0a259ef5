// Megatron indexed datasets as a token stream (see megatron_source.h).
#include "data/megatron_source.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "common/error.h"
#include "data/loss_mask.h"

namespace ulysses::data {

MegatronSource::MegatronSource(const std::string& prefix, int64_t length, int64_t vocab_size,
                               const std::string& key, const std::string& mask_prefix)
    : stream_(prefix, key), key_(key), length_(length), vocab_size_(vocab_size) {
  TORCH_CHECK(length >= 1 && vocab_size >= 1, "MegatronSource: bad length/vocab_size");
  num_samples_ = num_tokens() / length;
  if (num_samples_ == 0) {
    throw UserError(key + ": " + stream_.bin_path() +
                    ": too short for one sample: " + std::to_string(num_tokens()) +
                    " tokens < sequence.length " + std::to_string(length));
  }
  if (!mask_prefix.empty()) {
    mask_ = std::make_unique<MegatronStream>(mask_prefix, key);
    check_loss_mask_matches(stream_, *mask_, key);
  }
}

int64_t MegatronSource::first_token(int64_t index) const {
  TORCH_CHECK(index >= 0, "MegatronSource: negative sample index ", index);
  return (index % num_samples_) * length_;
}

std::vector<int64_t> MegatronSource::tokens(int64_t index) const {
  const int64_t first = first_token(index);
  std::vector<int64_t> out(length_);  // [L]
  stream_.read(first, length_, out.data());
  require_tokens_in_vocab(out, vocab_size_, first, stream_.bin_path(), key_);
  return out;
}

std::vector<int64_t> MegatronSource::document_starts(int64_t index) const {
  const int64_t first = first_token(index);
  const std::vector<int64_t>& begins = stream_.document_starts();
  std::vector<int64_t> starts;
  auto it = std::upper_bound(begins.begin(), begins.end(), first);
  for (; it != begins.end() && *it < first + length_; ++it) starts.push_back(*it - first);
  return starts;
}

std::vector<uint8_t> MegatronSource::loss_mask(int64_t index) const {
  if (!mask_) return {};
  return read_loss_mask(*mask_, first_token(index), length_);
}

}  // namespace ulysses::data
