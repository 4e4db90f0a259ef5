// data.source: tokens:PATH. A flat file of little-endian uint16 or uint32 tokens, memory mapped.
// Sample i is tokens [i*L, (i+1)*L) with i wrapped modulo the number of whole samples; a tail
// shorter than L is never read. Documents (for packing) end at each data.eod_token. The token type
// is not in the file: write_token_file records it beside it (PATH.dtype), and a file read with the
// wrong width is refused when its first tokens show it (see the constructor).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_dtype.h"
#include "data/token_source.h"

namespace ulysses::data {

// PATH.dtype: one line naming the token type of the flat token file PATH ("uint32\n"), written
// by write_token_file and checked by FlatTokenSource when present.
std::string token_dtype_record_path(const std::string& path);

class FlatTokenSource final : public TokenSource {
 public:
  // Maps `path` holding tokens of `dtype` (kUInt16 or kUInt32). `eod_token` < 0 means no document
  // separator. Throws UserError("<key>: <path>: ...") when the file is missing, its size is not a
  // multiple of the token size, or it holds fewer than `length` tokens; and
  // UserError("data.token_dtype: ...") when PATH.dtype names another type, or the first 64K
  // tokens look like the other width: read as uint16, every odd token 0 and some even one not
  // (uint32 tokens below 65536); read as uint32, most tokens >= vocab_size while the same bytes as
  // uint16 all fit (uint16 tokens).
  // REQUIRES: length >= 1, vocab_size >= 1.
  FlatTokenSource(const std::string& path, TokenDType dtype, int64_t length, int64_t vocab_size,
                  int64_t eod_token, const std::string& key);

  int64_t sample_length() const override { return length_; }
  // Throws UserError naming the file when a token is >= vocab_size.
  std::vector<int64_t> tokens(int64_t index) const override;  // [L]
  // j + 1 for every j in [0, L-1) whose token is the eod token: a document ends with its eod.
  std::vector<int64_t> document_starts(int64_t index) const override;

  int64_t num_samples() const { return num_samples_; }  // whole samples in the file

 private:
  MappedFile file_;
  TokenDType dtype_;
  std::string key_;
  int64_t length_;       // L
  int64_t vocab_size_;   // V
  int64_t eod_token_;    // -1 = none
  int64_t num_samples_;  // floor(tokens in file / L) >= 1
};

}  // namespace ulysses::data
