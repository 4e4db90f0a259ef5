// Integer token types of on-disk datasets (flat token files, Megatron .bin) and their
// little-endian decoding / encoding.
#pragma once
#include <cstdint>
#include <string>

namespace ulysses::data {

enum class TokenDType { kUInt8, kInt8, kUInt16, kInt16, kUInt32, kInt32, kInt64 };

// Bytes per token.
int64_t token_dtype_bytes(TokenDType dtype);

// "uint8", "int8", "uint16", "int16", "uint32", "int32", "int64".
const char* token_dtype_name(TokenDType dtype);

// Decodes `count` little-endian tokens starting at `bytes` into `out` (int64).
// REQUIRES: bytes holds count * token_dtype_bytes(dtype) bytes; out holds count values.
void decode_tokens(const uint8_t* bytes, int64_t count, TokenDType dtype, int64_t* out);

// Encodes `value` little-endian into `out` (token_dtype_bytes(dtype) bytes). Returns false, and
// writes nothing, when the value does not fit the type.
bool encode_token(int64_t value, TokenDType dtype, uint8_t* out);

}  // namespace ulysses::data
