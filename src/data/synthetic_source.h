// data.source: synthetic. Sample i is a pure function of (seed, i, L): every rank, run and loader
// computes the same tokens without shared state, and no sample depends on any other.
#pragma once
#include <cstdint>
#include <vector>

#include "data/token_source.h"

namespace ulysses::data {

// Tokens are uniform in [0, vocab_size), drawn from a splitmix64 stream seeded by a hash of
// (seed, i). Document boundaries (for packing) come from a second stream of the same (seed, i):
// document lengths uniform in [1, max(1, L/2)], so a sample holds about four documents.
class SyntheticSource final : public TokenSource {
 public:
  // REQUIRES: length >= 1, vocab_size >= 1.
  SyntheticSource(uint64_t seed, int64_t length, int64_t vocab_size);

  int64_t sample_length() const override { return length_; }
  std::vector<int64_t> tokens(int64_t index) const override;           // [L]
  std::vector<int64_t> document_starts(int64_t index) const override;  // ascending, in [1, L)

 private:
  uint64_t seed_;
  int64_t length_;      // L
  int64_t vocab_size_;  // V
};

}  // namespace ulysses::data
