// Megatron indexed datasets as a stream of values (see megatron_stream.h).
#include "data/megatron_stream.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "data/megatron_index.h"

namespace ulysses::data {

MegatronStream::MegatronStream(const std::string& prefix, const std::string& key)
    : prefix_(prefix), bin_(prefix + ".bin", key) {
  MegatronIndex index = read_megatron_index(prefix + ".idx", key);
  dtype_ = index.dtype;
  sequence_pointers_ = std::move(index.sequence_pointers);
  const int64_t value_bytes = token_dtype_bytes(dtype_);
  const auto bin_bytes = static_cast<int64_t>(bin_.size());
  const size_t sequence_count = index.sequence_lengths.size();
  sequence_starts_.assign(sequence_count + 1, 0);
  for (size_t i = 0; i < sequence_count; ++i) {
    const int64_t values = index.sequence_lengths[i];
    const int64_t pointer = sequence_pointers_[i];
    if (pointer > bin_bytes || values > (bin_bytes - pointer) / value_bytes) {
      throw UserError(key + ": " + bin_.path() + ": sequence " + std::to_string(i) + " (byte " +
                      std::to_string(pointer) + ", " + std::to_string(values) +
                      " values) lies beyond the end of the file (" + std::to_string(bin_bytes) +
                      " bytes)");
    }
    sequence_starts_[i + 1] = sequence_starts_[i] + values;
  }
  for (const int64_t sequence : index.document_indices) {
    if (sequence >= static_cast<int64_t>(sequence_count)) continue;
    const int64_t start = sequence_starts_[sequence];
    if (start < num_values() &&
        (document_starts_.empty() || document_starts_.back() != start)) {
      document_starts_.push_back(start);
    }
  }
}

void MegatronStream::read(int64_t first, int64_t count, int64_t* out) const {
  TORCH_CHECK(first >= 0 && count >= 0 && first + count <= num_values(), "MegatronStream: [",
              first, ", ", first + count, ") outside ", num_values(), " values of ", prefix_);
  const int64_t value_bytes = token_dtype_bytes(dtype_);
  // The sequence holding stream offset `first`: the last start <= first.
  auto sequence = static_cast<size_t>(
      std::upper_bound(sequence_starts_.begin(), sequence_starts_.end(), first) -
      sequence_starts_.begin() - 1);
  int64_t written = 0;
  while (written < count) {
    TORCH_INTERNAL_ASSERT(sequence < sequence_pointers_.size(), "stream overrun");
    const int64_t within = first + written - sequence_starts_[sequence];
    const int64_t take =
        std::min<int64_t>(count - written, sequence_starts_[sequence + 1] - first - written);
    if (take > 0) {
      decode_tokens(bin_.data() + sequence_pointers_[sequence] + within * value_bytes, take,
                    dtype_, out + written);
      written += take;
    }
    ++sequence;
  }
}

}  // namespace ulysses::data
