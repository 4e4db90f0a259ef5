// Flat token file and Megatron indexed dataset writers (see dataset_writer.h).
#include "data/dataset_writer.h"

#include <fstream>

#include "common/error.h"
#include "data/flat_token_source.h"
#include "data/megatron_index.h"

namespace ulysses::data {
namespace {

// Appends `tokens` encoded as `dtype` to `bytes`; throws UserError naming `path` on overflow.
void append_tokens(const std::vector<int64_t>& tokens, TokenDType dtype, const std::string& path,
                   std::vector<uint8_t>* bytes) {
  const int64_t token_bytes = token_dtype_bytes(dtype);
  for (const int64_t token : tokens) {
    const size_t at = bytes->size();
    bytes->resize(at + token_bytes);
    if (!encode_token(token, dtype, bytes->data() + at)) {
      throw UserError(path + ": token " + std::to_string(token) + " does not fit " +
                      token_dtype_name(dtype));
    }
  }
}

template <typename T>
void append_value(T value, std::vector<uint8_t>* bytes) {
  const auto* raw = reinterpret_cast<const uint8_t*>(&value);
  bytes->insert(bytes->end(), raw, raw + sizeof(T));
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw UserError(path + ": cannot write");
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<int64_t>& tokens,
                      TokenDType dtype) {
  std::vector<uint8_t> bytes;
  append_tokens(tokens, dtype, path, &bytes);
  write_bytes(path, bytes);
  const std::string name = std::string(token_dtype_name(dtype)) + "\n";
  write_bytes(token_dtype_record_path(path), std::vector<uint8_t>(name.begin(), name.end()));
}

void write_megatron_dataset(const std::string& prefix,
                            const std::vector<std::vector<int64_t>>& documents, TokenDType dtype) {
  const std::string bin_path = prefix + ".bin";
  const uint8_t code = megatron_dtype_code(dtype);
  std::vector<uint8_t> bin;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> document_indices = {0};
  for (const auto& document : documents) {
    pointers.push_back(static_cast<int64_t>(bin.size()));
    lengths.push_back(static_cast<int32_t>(document.size()));
    append_tokens(document, dtype, bin_path, &bin);
    document_indices.push_back(static_cast<int64_t>(lengths.size()));
  }
  write_bytes(bin_path, bin);

  std::vector<uint8_t> idx(kMegatronMagic, kMegatronMagic + kMegatronMagicBytes);
  append_value<uint64_t>(kMegatronVersion, &idx);
  append_value<uint8_t>(code, &idx);
  append_value<uint64_t>(lengths.size(), &idx);
  append_value<uint64_t>(document_indices.size(), &idx);
  for (const int32_t length : lengths) append_value(length, &idx);
  for (const int64_t pointer : pointers) append_value(pointer, &idx);
  for (const int64_t document : document_indices) append_value(document, &idx);
  write_bytes(prefix + ".idx", idx);
}

}  // namespace ulysses::data
