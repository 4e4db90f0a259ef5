// Writers of the on-disk formats the readers accept: flat token files (tokens:PATH) and Megatron
// indexed datasets (megatron:PREFIX), for tests and for tools that prepare data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_dtype.h"

namespace ulysses::data {

// Writes `tokens` to `path` as little-endian `dtype` values, replacing the file, and the type's
// name to token_dtype_record_path(path) (PATH.dtype), which the reader checks data.token_dtype
// against. Throws UserError("<path>: ...") when the file cannot be written or a token does not fit `dtype`.
void write_token_file(const std::string& path, const std::vector<int64_t>& tokens,
                      TokenDType dtype);

// Writes PREFIX.bin (documents back to back) and PREFIX.idx (MMIDIDX version 1, see
// megatron_index.h), one sequence per document, document_indices = [0, 1, ..., n] as Megatron's
// preprocessing writes them. Throws UserError naming the file when it cannot be written or a token
// does not fit `dtype`. REQUIRES: dtype is not kUInt32 (Megatron has no code for it).
void write_megatron_dataset(const std::string& prefix,
                            const std::vector<std::vector<int64_t>>& documents, TokenDType dtype);

}  // namespace ulysses::data
