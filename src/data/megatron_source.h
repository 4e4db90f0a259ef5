// data.source: megatron:PREFIX. A Megatron-LM indexed dataset (PREFIX.idx + PREFIX.bin). Its
// sequences concatenated in index order form one token stream, sampled like a flat file: sample i
// is stream tokens [i*L, (i+1)*L), i wrapped modulo the number of whole samples. Document
// boundaries come from the index's document_indices; with a loss mask (loss_mask.h) the mask of
// sample i is the mask stream's [i*L, (i+1)*L).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/megatron_stream.h"
#include "data/token_source.h"

namespace ulysses::data {

class MegatronSource final : public TokenSource {
 public:
  // Reads PREFIX.idx and maps PREFIX.bin, and the mask dataset `mask_prefix` ("" = none). Throws
  // UserError("<key>: <file>: ...") when a file is missing or corrupt (see read_megatron_index), a
  // sequence lies outside its .bin, the stream holds fewer than `length` tokens, or the mask does
  // not hold one value per token (check_loss_mask_matches). REQUIRES: length >= 1,
  // vocab_size >= 1.
  MegatronSource(const std::string& prefix, int64_t length, int64_t vocab_size,
                 const std::string& key, const std::string& mask_prefix = "");

  int64_t sample_length() const override { return length_; }
  // Throws UserError naming PREFIX.bin when a token is outside [0, vocab_size).
  std::vector<int64_t> tokens(int64_t index) const override;           // [L]
  std::vector<int64_t> document_starts(int64_t index) const override;  // ascending, in [1, L)
  std::vector<uint8_t> loss_mask(int64_t index) const override;        // [L], or [] without one
  std::string loss_mask_prefix() const override { return mask_ ? mask_->prefix() : ""; }

  int64_t num_samples() const { return num_samples_; }  // whole samples in the stream
  int64_t num_tokens() const { return stream_.num_values(); }

 private:
  int64_t first_token(int64_t index) const;  // stream offset of sample `index` (wrapped)

  MegatronStream stream_;
  std::unique_ptr<MegatronStream> mask_;  // null without a loss mask
  std::string key_;
  int64_t length_;       // L
  int64_t vocab_size_;   // V
  int64_t num_samples_;  // floor(num_tokens / L) >= 1
};

}  // namespace ulysses::data
