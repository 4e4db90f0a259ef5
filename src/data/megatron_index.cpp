// Parsing of Megatron-LM MMIDIDX index files (see megatron_index.h).
#include "data/megatron_index.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "common/error.h"
#include "data/mapped_file.h"

namespace ulysses::data {
namespace {

// Sequential little-endian reader over the mapped index; every read checks the bounds.
class IndexCursor {
 public:
  IndexCursor(const MappedFile& file, const std::string& key) : file_(file), key_(key) {}

  void read_bytes(void* out, size_t bytes, const char* what) {
    if (file_.size() - offset_ < bytes) {
      throw UserError(key_ + ": " + file_.path() + ": truncated index (" + what + " needs " +
                      std::to_string(bytes) + " bytes at offset " + std::to_string(offset_) +
                      ", file has " + std::to_string(file_.size()) + ")");
    }
    std::memcpy(out, file_.data() + offset_, bytes);
    offset_ += bytes;
  }

  template <typename T>
  T read(const char* what) {
    T value;
    read_bytes(&value, sizeof(T), what);
    return value;
  }

  template <typename T>
  std::vector<T> read_array(uint64_t count, const char* what) {
    if (count > (file_.size() - offset_) / sizeof(T)) {
      throw UserError(key_ + ": " + file_.path() + ": truncated index (" + what + " has " +
                      std::to_string(count) + " entries, more than the file holds)");
    }
    std::vector<T> values(count);
    if (count > 0) read_bytes(values.data(), count * sizeof(T), what);
    return values;
  }

 private:
  const MappedFile& file_;
  const std::string& key_;
  size_t offset_ = 0;
};

}  // namespace

std::optional<TokenDType> megatron_code_to_dtype(uint8_t code) {
  switch (code) {
    case 1:
      return TokenDType::kUInt8;
    case 2:
      return TokenDType::kInt8;
    case 3:
      return TokenDType::kInt16;
    case 4:
      return TokenDType::kInt32;
    case 5:
      return TokenDType::kInt64;
    case 8:
      return TokenDType::kUInt16;
    default:
      return std::nullopt;  // 6 float64, 7 float32, or unknown
  }
}

uint8_t megatron_dtype_code(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return 1;
    case TokenDType::kInt8:
      return 2;
    case TokenDType::kInt16:
      return 3;
    case TokenDType::kInt32:
      return 4;
    case TokenDType::kInt64:
      return 5;
    case TokenDType::kUInt16:
      return 8;
    case TokenDType::kUInt32:
      break;
  }
  TORCH_CHECK(false, "Megatron indexed datasets have no code for ", token_dtype_name(dtype));
}

MegatronIndex read_megatron_index(const std::string& idx_path, const std::string& key) {
  const MappedFile file(idx_path, key);
  auto fail = [&](const std::string& what) {
    return UserError(key + ": " + idx_path + ": " + what);
  };
  IndexCursor cursor(file, key);

  char magic[kMegatronMagicBytes];
  cursor.read_bytes(magic, sizeof(magic), "magic");
  if (std::memcmp(magic, kMegatronMagic, kMegatronMagicBytes) != 0) {
    throw fail("not a Megatron MMIDIDX index (bad magic)");
  }
  const auto version = cursor.read<uint64_t>("version");
  if (version != kMegatronVersion) {
    throw fail("unsupported index version " + std::to_string(version) + " (expected 1)");
  }
  const auto code = cursor.read<uint8_t>("dtype code");
  const std::optional<TokenDType> dtype = megatron_code_to_dtype(code);
  if (!dtype) {
    throw fail("dtype code " + std::to_string(code) + " is not an integer token type");
  }
  MegatronIndex index;
  index.dtype = *dtype;
  const auto sequence_count = cursor.read<uint64_t>("sequence_count");
  const auto document_count = cursor.read<uint64_t>("document_count");
  index.sequence_lengths = cursor.read_array<int32_t>(sequence_count, "sequence_lengths");
  index.sequence_pointers = cursor.read_array<int64_t>(sequence_count, "sequence_pointers");
  index.document_indices = cursor.read_array<int64_t>(document_count, "document_indices");

  for (uint64_t i = 0; i < sequence_count; ++i) {
    if (index.sequence_lengths[i] < 0 || index.sequence_pointers[i] < 0) {
      throw fail("sequence " + std::to_string(i) + " has a negative length or pointer");
    }
  }
  int64_t previous = 0;
  for (const int64_t document : index.document_indices) {
    if (document < previous || document > static_cast<int64_t>(sequence_count)) {
      throw fail("document_indices must ascend within [0, sequence_count=" +
                 std::to_string(sequence_count) + "]");
    }
    previous = document;
  }
  return index;
}

}  // namespace ulysses::data
