// Megatron indexed datasets as a token stream (see megatron_source.h).
#include "data/megatron_source.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace ulysses::data {

MegatronSource::MegatronSource(const std::string& prefix, int64_t length, int64_t vocab_size,
                               const std::string& key)
    : bin_(prefix + ".bin", key), key_(key), length_(length), vocab_size_(vocab_size) {
  TORCH_CHECK(length >= 1 && vocab_size >= 1, "MegatronSource: bad length/vocab_size");
  MegatronIndex index = read_megatron_index(prefix + ".idx", key);
  dtype_ = index.dtype;
  sequence_pointers_ = std::move(index.sequence_pointers);
  const int64_t token_bytes = token_dtype_bytes(dtype_);
  const auto bin_bytes = static_cast<int64_t>(bin_.size());
  const size_t sequence_count = index.sequence_lengths.size();
  sequence_starts_.assign(sequence_count + 1, 0);
  for (size_t i = 0; i < sequence_count; ++i) {
    const int64_t tokens = index.sequence_lengths[i];
    const int64_t pointer = sequence_pointers_[i];
    if (pointer > bin_bytes || tokens > (bin_bytes - pointer) / token_bytes) {
      throw UserError(key + ": " + bin_.path() + ": sequence " + std::to_string(i) + " (byte " +
                      std::to_string(pointer) + ", " + std::to_string(tokens) +
                      " tokens) lies beyond the end of the file (" + std::to_string(bin_bytes) +
                      " bytes)");
    }
    sequence_starts_[i + 1] = sequence_starts_[i] + tokens;
  }
  for (const int64_t sequence : index.document_indices) {
    const int64_t start = sequence_starts_[sequence];
    if (sequence < static_cast<int64_t>(sequence_count) &&
        (document_starts_.empty() || document_starts_.back() != start)) {
      document_starts_.push_back(start);
    }
  }
  num_samples_ = num_tokens() / length;
  if (num_samples_ == 0) {
    throw UserError(key + ": " + bin_.path() +
                    ": too short for one sample: " + std::to_string(num_tokens()) +
                    " tokens < sequence.length " + std::to_string(length));
  }
}

int64_t MegatronSource::first_token(int64_t index) const {
  TORCH_CHECK(index >= 0, "MegatronSource: negative sample index ", index);
  return (index % num_samples_) * length_;
}

std::vector<int64_t> MegatronSource::tokens(int64_t index) const {
  const int64_t first = first_token(index);
  const int64_t token_bytes = token_dtype_bytes(dtype_);
  std::vector<int64_t> out(length_);  // [L]
  // The sequence holding stream offset `first`: the last start <= first.
  auto sequence = static_cast<size_t>(
      std::upper_bound(sequence_starts_.begin(), sequence_starts_.end(), first) -
      sequence_starts_.begin() - 1);
  int64_t written = 0;
  while (written < length_) {
    TORCH_INTERNAL_ASSERT(sequence < sequence_pointers_.size(), "stream overrun");
    const int64_t within = first + written - sequence_starts_[sequence];
    const int64_t count =
        std::min<int64_t>(length_ - written, sequence_starts_[sequence + 1] - first - written);
    const uint8_t* bytes = bin_.data() + sequence_pointers_[sequence] + within * token_bytes;
    if (count > 0) decode_tokens(bytes, count, dtype_, out.data() + written);
    written += std::max<int64_t>(count, 0);
    ++sequence;
  }
  require_tokens_in_vocab(out, vocab_size_, first, bin_.path(), key_);
  return out;
}

std::vector<int64_t> MegatronSource::document_starts(int64_t index) const {
  const int64_t first = first_token(index);
  std::vector<int64_t> starts;
  auto it = std::upper_bound(document_starts_.begin(), document_starts_.end(), first);
  for (; it != document_starts_.end() && *it < first + length_; ++it) {
    starts.push_back(*it - first);
  }
  return starts;
}

}  // namespace ulysses::data
