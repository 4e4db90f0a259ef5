// Synthetic tokens and document boundaries from per-sample splitmix64 streams.
#include "data/synthetic_source.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ulysses::data {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kTokenSalt = 0x746F6B656E73ull;  // "tokens"
constexpr uint64_t kDocumentSalt = 0x646F6373ull;   // "docs"

// The splitmix64 output function: a bijective 64-bit mix.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A splitmix64 generator; its start state hashes (seed, sample index, purpose).
class SplitMix64 {
 public:
  SplitMix64(uint64_t seed, int64_t index, uint64_t salt)
      : state_(mix64(mix64(seed ^ salt) + kGolden * (static_cast<uint64_t>(index) + 1))) {}

  uint64_t next() { return mix64(state_ += kGolden); }

  // Uniform in [0, bound) by multiply-shift (bias below 2^-40 for bound < 2^24).
  int64_t below(int64_t bound) {
    const unsigned __int128 wide =
        static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(bound);
    return static_cast<int64_t>(wide >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace

SyntheticSource::SyntheticSource(uint64_t seed, int64_t length, int64_t vocab_size)
    : seed_(seed), length_(length), vocab_size_(vocab_size) {
  TORCH_CHECK(length >= 1 && vocab_size >= 1, "SyntheticSource: length ", length,
              " and vocab_size ", vocab_size, " must be >= 1");
}

std::vector<int64_t> SyntheticSource::tokens(int64_t index) const {
  TORCH_CHECK(index >= 0, "SyntheticSource: negative sample index ", index);
  SplitMix64 rng(seed_, index, kTokenSalt);
  std::vector<int64_t> out(length_);  // [L]
  for (auto& token : out) token = rng.below(vocab_size_);
  return out;
}

std::vector<int64_t> SyntheticSource::document_starts(int64_t index) const {
  TORCH_CHECK(index >= 0, "SyntheticSource: negative sample index ", index);
  SplitMix64 rng(seed_, index, kDocumentSalt);
  const int64_t max_document = std::max<int64_t>(1, length_ / 2);
  std::vector<int64_t> starts;
  for (int64_t start = 1 + rng.below(max_document); start < length_;
       start += 1 + rng.below(max_document)) {
    starts.push_back(start);
  }
  return starts;
}

}  // namespace ulysses::data
