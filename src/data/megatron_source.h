// data.source: megatron:PREFIX. A Megatron-LM indexed dataset (PREFIX.idx + PREFIX.bin). Its
// sequences concatenated in index order form one token stream, sampled like a flat file: sample i
// is stream tokens [i*L, (i+1)*L), i wrapped modulo the number of whole samples. Document
// boundaries come from the index's document_indices.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/megatron_index.h"
#include "data/token_source.h"

namespace ulysses::data {

class MegatronSource final : public TokenSource {
 public:
  // Reads PREFIX.idx and maps PREFIX.bin. Throws UserError("<key>: <file>: ...") when a file is
  // missing or corrupt (see read_megatron_index), a sequence lies outside PREFIX.bin, or the stream
  // holds fewer than `length` tokens. REQUIRES: length >= 1, vocab_size >= 1.
  MegatronSource(const std::string& prefix, int64_t length, int64_t vocab_size,
                 const std::string& key);

  int64_t sample_length() const override { return length_; }
  // Throws UserError naming PREFIX.bin when a token is outside [0, vocab_size).
  std::vector<int64_t> tokens(int64_t index) const override;           // [L]
  std::vector<int64_t> document_starts(int64_t index) const override;  // ascending, in [1, L)

  int64_t num_samples() const { return num_samples_; }  // whole samples in the stream
  int64_t num_tokens() const { return sequence_starts_.back(); }

 private:
  int64_t first_token(int64_t index) const;  // stream offset of sample `index` (wrapped)

  MappedFile bin_;
  TokenDType dtype_;
  std::string key_;
  int64_t length_;       // L
  int64_t vocab_size_;   // V
  int64_t num_samples_;  // floor(num_tokens / L) >= 1
  // Kept per sequence (24 bytes each with one sequence per document); the index file itself is
  // not kept mapped.
  std::vector<int64_t> sequence_starts_;    // [sequence_count + 1] stream offset of each sequence
  std::vector<int64_t> sequence_pointers_;  // [sequence_count] byte offset in PREFIX.bin
  std::vector<int64_t> document_starts_;    // stream offsets where documents begin, ascending
};

}  // namespace ulysses::data
