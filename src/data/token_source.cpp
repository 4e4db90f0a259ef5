// open_token_source: validates the data options and builds the source they name.
#include "data/token_source.h"

#include <c10/util/Exception.h>

#include "common/error.h"
#include "data/flat_token_source.h"
#include "data/megatron_source.h"
#include "data/source_spec.h"
#include "data/synthetic_source.h"

namespace ulysses::data {
namespace {

// The on-disk type data.token_dtype names.
TokenDType flat_token_dtype(const std::string& token_dtype) {
  if (token_dtype == "uint16") return TokenDType::kUInt16;
  if (token_dtype == "uint32") return TokenDType::kUInt32;
  throw UserError("data.token_dtype: must be uint16 or uint32, got '" + token_dtype + "'");
}

}  // namespace

void require_tokens_in_vocab(const std::vector<int64_t>& tokens, int64_t vocab_size,
                             int64_t first_offset, const std::string& file,
                             const std::string& key) {
  for (size_t j = 0; j < tokens.size(); ++j) {
    if (tokens[j] < 0 || tokens[j] >= vocab_size) {
      throw UserError(key + ": " + file + ": token " + std::to_string(tokens[j]) +
                      " at token offset " + std::to_string(first_offset + int64_t(j)) +
                      " is outside [0, model.vocab_size=" + std::to_string(vocab_size) + ")");
    }
  }
}

std::unique_ptr<TokenSource> open_token_source(const config::DataOptions& data, int64_t length,
                                               int64_t vocab_size, const std::string& source_key) {
  TORCH_CHECK(length >= 1 && vocab_size >= 1, "open_token_source: length ", length,
              " and vocab_size ", vocab_size, " must be >= 1");
  const SourceSpec spec = parse_source(data.source, source_key);
  if (data.eod_token < -1 || data.eod_token >= vocab_size) {
    throw UserError("data.eod_token: " + std::to_string(data.eod_token) +
                    " is outside [0, model.vocab_size=" + std::to_string(vocab_size) +
                    ") (-1 = none)");
  }
  switch (spec.kind) {
    case SourceKind::kSynthetic:
      return std::make_unique<SyntheticSource>(data.seed, length, vocab_size);
    case SourceKind::kTokens: {
      const TokenDType dtype = flat_token_dtype(data.token_dtype);
      if (data.pack && data.eod_token < 0) {
        throw UserError(
            "data.eod_token: must be set when data.pack is true and data.source is tokens:PATH "
            "(documents are delimited by it)");
      }
      return std::make_unique<FlatTokenSource>(spec.path, dtype, length, vocab_size, data.eod_token,
                                               source_key);
    }
    case SourceKind::kMegatron:
      return std::make_unique<MegatronSource>(spec.path, length, vocab_size, source_key);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled source kind");
}

}  // namespace ulysses::data
