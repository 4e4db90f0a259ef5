// Whole documents packed into samples (see packed_documents.h).
#include "data/packed_documents.h"

#include <c10/util/Exception.h>

#include "common/error.h"
#include "data/loss_mask.h"

namespace ulysses::data {

PackedDocumentSource::PackedDocumentSource(const std::string& prefix, int64_t length,
                                           int64_t vocab_size, bool drop_overlong,
                                           const std::string& key, const std::string& mask_prefix)
    : stream_(prefix, key), key_(key), length_(length), vocab_size_(vocab_size) {
  TORCH_CHECK(length >= 1 && vocab_size >= 1, "PackedDocumentSource: bad length/vocab_size");
  if (!mask_prefix.empty()) {
    mask_ = std::make_unique<MegatronStream>(mask_prefix, key);
    check_loss_mask_matches(stream_, *mask_, key);
  }
  // Documents: [begin_d, begin_{d+1}), the last ending with the stream; offset 0 begins one.
  std::vector<int64_t> begins = stream_.document_starts();
  if (stream_.num_values() > 0 && (begins.empty() || begins.front() != 0)) {
    begins.insert(begins.begin(), 0);
  }
  if (begins.empty()) {
    throw UserError(key + ": " + prefix + ".idx: no documents (data.packing: documents packs "
                    "whole documents)");
  }
  if (begins.size() == 1 && stream_.sequence_count() > 1) {
    throw UserError(key + ": " + prefix + ".idx: one document holds all " +
                    std::to_string(stream_.sequence_count()) +
                    " sequences: the index marks no document boundaries, which data.packing: "
                    "documents needs (windows cuts the stream instead)");
  }
  counts_.documents = static_cast<int64_t>(begins.size());
  int64_t fill = 0;  // tokens of the sample being filled
  for (size_t d = 0; d < begins.size(); ++d) {
    const int64_t end = d + 1 < begins.size() ? begins[d + 1] : stream_.num_values();
    int64_t tokens = end - begins[d];
    if (tokens > length) {
      if (drop_overlong) {
        ++counts_.dropped;
        continue;
      }
      ++counts_.truncated;
      tokens = length;
    }
    if (sample_first_piece_.empty() || fill + tokens > length) {
      sample_first_piece_.push_back(static_cast<int64_t>(pieces_.size()));
      fill = 0;
    }
    pieces_.push_back({begins[d], tokens});
    fill += tokens;
    counts_.tokens += tokens;
  }
  if (pieces_.empty()) {
    throw UserError(key + ": " + prefix + ": every one of its " +
                    std::to_string(counts_.documents) + " documents is longer than "
                    "sequence.length " + std::to_string(length) +
                    " and data.overlong is drop: nothing to train on (raise sequence.length or "
                    "set data.overlong: truncate)");
  }
  counts_.samples = static_cast<int64_t>(sample_first_piece_.size());
  sample_first_piece_.push_back(static_cast<int64_t>(pieces_.size()));
  counts_.padding_tokens = counts_.samples * length - counts_.tokens;
}

const PackedDocumentSource::Piece* PackedDocumentSource::sample_pieces(int64_t index,
                                                                       int64_t* count) const {
  TORCH_CHECK(index >= 0, "PackedDocumentSource: negative sample index ", index);
  const int64_t sample = index % counts_.samples;
  *count = sample_first_piece_[sample + 1] - sample_first_piece_[sample];
  return pieces_.data() + sample_first_piece_[sample];
}

int64_t PackedDocumentSource::token_count(int64_t index) const {
  int64_t count = 0, n = 0;
  const Piece* pieces = sample_pieces(index, &count);
  for (int64_t p = 0; p < count; ++p) n += pieces[p].length;
  return n;
}

std::vector<int64_t> PackedDocumentSource::tokens(int64_t index) const {
  int64_t count = 0;
  const Piece* pieces = sample_pieces(index, &count);
  std::vector<int64_t> out;
  for (int64_t p = 0; p < count; ++p) {
    std::vector<int64_t> piece(static_cast<size_t>(pieces[p].length));
    stream_.read(pieces[p].first, pieces[p].length, piece.data());
    require_tokens_in_vocab(piece, vocab_size_, pieces[p].first, stream_.bin_path(), key_);
    out.insert(out.end(), piece.begin(), piece.end());
  }
  return out;
}

std::vector<int64_t> PackedDocumentSource::document_starts(int64_t index) const {
  int64_t count = 0;
  const Piece* pieces = sample_pieces(index, &count);
  std::vector<int64_t> starts;
  int64_t offset = 0;
  for (int64_t p = 0; p < count; ++p) {
    if (p > 0) starts.push_back(offset);
    offset += pieces[p].length;
  }
  return starts;
}

std::vector<uint8_t> PackedDocumentSource::loss_mask(int64_t index) const {
  if (!mask_) return {};
  int64_t count = 0;
  const Piece* pieces = sample_pieces(index, &count);
  std::vector<uint8_t> out;
  for (int64_t p = 0; p < count; ++p) {
    const std::vector<uint8_t> piece = read_loss_mask(*mask_, pieces[p].first, pieces[p].length);
    out.insert(out.end(), piece.begin(), piece.end());
  }
  return out;
}

}  // namespace ulysses::data
