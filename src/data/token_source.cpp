// open_token_source: validates the data options and builds the source they name.
#include "data/token_source.h"

#include <c10/util/Exception.h>

#include <filesystem>

#include "common/error.h"
#include "data/flat_token_source.h"
#include "data/loss_mask.h"
#include "data/megatron_source.h"
#include "data/packed_documents.h"
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

void require_one_of(const std::string& key, const std::string& value, const std::string& first,
                    const std::string& second, const std::string& third = "") {
  if (value == first || value == second || (!third.empty() && value == third)) return;
  throw UserError(key + ": must be " + first + (third.empty() ? " or " : ", ") + second +
                  (third.empty() ? "" : " or " + third) + ", got '" + value + "'");
}

// A source other than megatron:PREFIX under options that need one: one line naming the option.
void require_megatron(const SourceSpec& spec, const config::DataOptions& data,
                      const std::string& source_key) {
  if (spec.kind == SourceKind::kMegatron) return;
  const std::string source = spec.kind == SourceKind::kSynthetic
                                 ? std::string("synthetic")
                                 : std::string("tokens:") + spec.path;
  if (data.packing == "documents") {
    throw UserError("data.packing: documents packs whole documents, which only a megatron:PREFIX "
                    "source marks (in its index); " + source_key + " is " + source +
                    ", which has no document boundaries");
  }
  if (data.loss_mask == "require") {
    throw UserError("data.loss_mask: require reads PREFIX_loss_mask beside a megatron:PREFIX "
                    "source; " + source_key + " is " + source);
  }
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
  require_one_of("data.packing", data.packing, "windows", "documents");
  require_one_of("data.overlong", data.overlong, "truncate", "drop");
  require_one_of("data.loss_mask", data.loss_mask, "auto", "require", "ignore");
  require_megatron(spec, data, source_key);
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
    case SourceKind::kMegatron: {
      // The mask dataset named as the source would train on its 0/1 values as tokens.
      const std::string suffix = "_loss_mask";
      if (spec.path.size() > suffix.size() &&
          spec.path.compare(spec.path.size() - suffix.size(), suffix.size(), suffix) == 0) {
        const std::string tokens = spec.path.substr(0, spec.path.size() - suffix.size());
        std::error_code ec;
        if (std::filesystem::exists(tokens + ".idx", ec)) {
          throw UserError(source_key + ": megatron:" + spec.path +
                          " is the loss mask of megatron:" + tokens +
                          "; name the token dataset (the mask beside it is read with it)");
        }
      }
      const std::string mask = find_loss_mask(spec.path, data.loss_mask, source_key);
      if (data.packing == "documents") {
        return std::make_unique<PackedDocumentSource>(spec.path, length, vocab_size,
                                                      data.overlong == "drop", source_key, mask);
      }
      return std::make_unique<MegatronSource>(spec.path, length, vocab_size, source_key, mask);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled source kind");
}

}  // namespace ulysses::data
