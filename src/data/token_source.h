// The interface of every token source: sample i is L tokens, plus the offsets where
// documents begin inside it (used by packing). Implementations: synthetic_source.h,
// flat_token_source.h, megatron_source.h; open_token_source() picks one from the run config.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::data {

// Reads fixed-length samples by index. Implementations are immutable after construction, so const
// calls may run concurrently.
class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // L, the tokens per sample.
  virtual int64_t sample_length() const = 0;

  // The L tokens of sample `index`, each in [0, vocab_size). Sources backed by files wrap `index`
  // modulo their number of whole samples. Throws UserError naming the file when a token read is
  // outside [0, vocab_size). REQUIRES: index >= 0.
  virtual std::vector<int64_t> tokens(int64_t index) const = 0;  // [L]

  // Offsets j in [1, L), ascending, at which a new document begins inside sample `index`. Offset 0
  // always begins one (a sample may start inside a document) and is not listed. Empty when the
  // source knows no boundaries. REQUIRES: index >= 0.
  virtual std::vector<int64_t> document_starts(int64_t index) const = 0;
};

// Throws UserError("<key>: <file>: token <t> at token offset <o> is outside [0, vocab_size)")
// for the first token of `tokens` outside the vocabulary; `first_offset` is the file offset (in
// tokens) of tokens[0]. For file-backed sources.
void require_tokens_in_vocab(const std::vector<int64_t>& tokens,  // [L]
                             int64_t vocab_size, int64_t first_offset, const std::string& file,
                             const std::string& key);

// Opens the source that data.source names, for samples of `length` tokens over a vocabulary of
// `vocab_size`. Throws UserError naming the field (`source_key`, data.token_dtype, data.eod_token)
// or the file when the input is bad: unknown source, missing or short file, corrupt index, an
// eod_token outside the vocabulary or missing when packing a flat file.
// REQUIRES: length >= 1, vocab_size >= 1.
std::unique_ptr<TokenSource> open_token_source(const config::DataOptions& data, int64_t length,
                                               int64_t vocab_size,
                                               const std::string& source_key = "data.source");

}  // namespace ulysses::data
