// data.packing: documents. Whole documents of a Megatron indexed dataset (conversations of an SFT
// dataset) packed into samples of at most L tokens, never cut across two: in index order, each
// sample takes documents while the next still fits, then the next sample begins (the plan is a
// pure function of the index, L and data.overlong). A document longer than L is cut to its first
// L tokens (data.overlong: truncate) or left out (drop), and counted. The trainer pads each
// sample to its padded length with ignored labels, and the padding is a document of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/megatron_stream.h"
#include "data/token_source.h"

namespace ulysses::data {

class PackedDocumentSource final : public TokenSource {
 public:
  // Reads the index of `prefix` (and of `mask_prefix`, "" = none, checked as MegatronSource
  // does) and plans the samples. Throws UserError("<key>: ...") for a missing or corrupt file, a
  // dataset without documents, one whose index marks no boundaries (a single document of several
  // sequences), or one whose every document is longer than `length` under drop.
  // REQUIRES: length >= 1, vocab_size >= 1, drop_overlong or truncation.
  PackedDocumentSource(const std::string& prefix, int64_t length, int64_t vocab_size,
                       bool drop_overlong, const std::string& key,
                       const std::string& mask_prefix = "");

  int64_t sample_length() const override { return length_; }
  // Sample `index` (wrapped modulo num_samples()): its documents back to back, n <= L tokens.
  // Throws UserError naming PREFIX.bin when a token is outside [0, vocab_size).
  std::vector<int64_t> tokens(int64_t index) const override;           // [n]
  int64_t token_count(int64_t index) const override;                   // n
  std::vector<int64_t> document_starts(int64_t index) const override;  // where docs 2.. begin
  std::vector<uint8_t> loss_mask(int64_t index) const override;        // [n], or [] without one
  std::string loss_mask_prefix() const override { return mask_ ? mask_->prefix() : ""; }
  std::optional<PackingCounts> packing_counts() const override { return counts_; }

  int64_t num_samples() const { return counts_.samples; }

 private:
  struct Piece {
    int64_t first;   // stream offset of the document
    int64_t length;  // tokens taken from it (<= L)
  };
  const Piece* sample_pieces(int64_t index, int64_t* count) const;

  MegatronStream stream_;
  std::unique_ptr<MegatronStream> mask_;  // null without a loss mask
  std::string key_;
  int64_t length_;      // L
  int64_t vocab_size_;  // V
  PackingCounts counts_;
  std::vector<Piece> pieces_;               // the kept documents, in order
  std::vector<int64_t> sample_first_piece_;  // [samples + 1] first piece of each sample
};

}  // namespace ulysses::data
