// The interface of every token source: sample i is L tokens (at most L for whole documents), plus
// the offsets where documents begin inside it (used by packing) and its loss mask where the data
// has one. Implementations: synthetic_source.h, flat_token_source.h, megatron_source.h,
// packed_documents.h; open_token_source() picks one from the run config.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::data {

// How data.packing: documents laid the documents of a dataset into samples (packed_documents.h).
struct PackingCounts {
  int64_t documents = 0;       // documents of the dataset
  int64_t samples = 0;         // samples they fill
  int64_t truncated = 0;       // longer than L, cut to their first L tokens (data.overlong)
  int64_t dropped = 0;         // longer than L, left out (data.overlong)
  int64_t tokens = 0;          // tokens in the samples
  int64_t padding_tokens = 0;  // samples * L - tokens: positions padded with ignored labels
};

// Reads fixed-length samples by index. Implementations are immutable after construction, so const
// calls may run concurrently.
class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // L, the tokens per sample (the most a sample of whole documents holds).
  virtual int64_t sample_length() const = 0;

  // The n tokens of sample `index`, each in [0, vocab_size): n = L, or 1 <= n <= L for a source of
  // whole documents. Sources backed by files wrap `index` modulo their number of samples. Throws
  // UserError naming the file when a token read is outside [0, vocab_size). REQUIRES: index >= 0.
  virtual std::vector<int64_t> tokens(int64_t index) const = 0;  // [n]
  // n of tokens(index), without reading them (sources whose samples vary in length say so).
  virtual int64_t token_count(int64_t /*index*/) const { return sample_length(); }

  // Offsets j in [1, n), ascending, at which a new document begins inside sample `index`. Offset 0
  // always begins one (a sample may start inside a document) and is not listed. Empty when the
  // source knows no boundaries. REQUIRES: index >= 0.
  virtual std::vector<int64_t> document_starts(int64_t index) const = 0;

  // The loss mask of sample `index`: [n] with 1 where that token is a target the loss learns and
  // 0 where it is not (its label, at the position before it, is ignored); empty when the source
  // has no mask (every token is learned). REQUIRES: index >= 0.
  virtual std::vector<uint8_t> loss_mask(int64_t /*index*/) const { return {}; }

  // The prefix of the loss-mask dataset read, "" when none.
  virtual std::string loss_mask_prefix() const { return ""; }

  // How whole documents were packed into samples; nullopt for a source of windows.
  virtual std::optional<PackingCounts> packing_counts() const { return std::nullopt; }
};

// Throws UserError("<key>: <file>: token <t> at token offset <o> is outside [0, vocab_size)")
// for the first token of `tokens` outside the vocabulary; `first_offset` is the file offset (in
// tokens) of tokens[0]. For file-backed sources.
void require_tokens_in_vocab(const std::vector<int64_t>& tokens,  // [L]
                             int64_t vocab_size, int64_t first_offset, const std::string& file,
                             const std::string& key);

// Opens the source that data.source names, for samples of `length` tokens over a vocabulary of
// `vocab_size`: windows of the stream, or whole documents packed into samples with
// data.packing: documents (then a megatron:PREFIX source); a megatron:PREFIX source reads its
// PREFIX_loss_mask as data.loss_mask says (loss_mask.h). Throws UserError naming the field
// (`source_key`, data.token_dtype, data.eod_token, data.packing, data.loss_mask, data.overlong)
// or the file when the input is bad: unknown source, missing or short file, corrupt index, a
// loss-mask dataset named as the source or whose lengths differ from the tokens', documents
// packing of a source without document boundaries, an eod_token outside the vocabulary or missing
// when packing a flat file.
// REQUIRES: length >= 1, vocab_size >= 1.
std::unique_ptr<TokenSource> open_token_source(const config::DataOptions& data, int64_t length,
                                               int64_t vocab_size,
                                               const std::string& source_key = "data.source");

}  // namespace ulysses::data
