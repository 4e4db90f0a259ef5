// Little-endian token decoding and encoding (see token_dtype.h).
#include "data/token_dtype.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <limits>

namespace ulysses::data {

// The host must be little-endian: tokens are copied with memcpy, without byte swapping.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "data/: little-endian hosts only");

namespace {

template <typename T>
void decode_as(const uint8_t* bytes, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, bytes + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[i] = static_cast<int64_t>(value);
  }
}

template <typename T>
bool encode_as(int64_t value, uint8_t* out) {
  const bool below = value < static_cast<int64_t>(std::numeric_limits<T>::min());
  const bool above = value >= 0 && static_cast<uint64_t>(value) >
                                       static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (below || above) return false;
  const T narrow = static_cast<T>(value);
  std::memcpy(out, &narrow, sizeof(T));
  return true;
}

}  // namespace

int64_t token_dtype_bytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kUInt16:
    case TokenDType::kInt16:
      return 2;
    case TokenDType::kUInt32:
    case TokenDType::kInt32:
      return 4;
    case TokenDType::kInt64:
      return 8;
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled TokenDType");
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return "uint8";
    case TokenDType::kInt8:
      return "int8";
    case TokenDType::kUInt16:
      return "uint16";
    case TokenDType::kInt16:
      return "int16";
    case TokenDType::kUInt32:
      return "uint32";
    case TokenDType::kInt32:
      return "int32";
    case TokenDType::kInt64:
      return "int64";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled TokenDType");
}

void decode_tokens(const uint8_t* bytes, int64_t count, TokenDType dtype, int64_t* out) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return decode_as<uint8_t>(bytes, count, out);
    case TokenDType::kInt8:
      return decode_as<int8_t>(bytes, count, out);
    case TokenDType::kUInt16:
      return decode_as<uint16_t>(bytes, count, out);
    case TokenDType::kInt16:
      return decode_as<int16_t>(bytes, count, out);
    case TokenDType::kUInt32:
      return decode_as<uint32_t>(bytes, count, out);
    case TokenDType::kInt32:
      return decode_as<int32_t>(bytes, count, out);
    case TokenDType::kInt64:
      return decode_as<int64_t>(bytes, count, out);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled TokenDType");
}

bool encode_token(int64_t value, TokenDType dtype, uint8_t* out) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return encode_as<uint8_t>(value, out);
    case TokenDType::kInt8:
      return encode_as<int8_t>(value, out);
    case TokenDType::kUInt16:
      return encode_as<uint16_t>(value, out);
    case TokenDType::kInt16:
      return encode_as<int16_t>(value, out);
    case TokenDType::kUInt32:
      return encode_as<uint32_t>(value, out);
    case TokenDType::kInt32:
      return encode_as<int32_t>(value, out);
    case TokenDType::kInt64:
      return encode_as<int64_t>(value, out);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled TokenDType");
}

}  // namespace ulysses::data
