// The index of a Megatron-LM indexed dataset, PREFIX.idx ("MMIDIDX" version 1), all little-endian:
//   magic "MMIDIDX\x00\x00" (9 bytes) | version u64 = 1 | dtype code u8 |
//   sequence_count u64 | document_count u64 |
//   sequence_lengths i32[sequence_count] (tokens) | sequence_pointers i64[sequence_count] (byte
//   offsets into PREFIX.bin) | document_indices i64[document_count] (sequence index where each
//   document begins, then sequence_count) | optional sequence_modes i8[] (ignored).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/token_dtype.h"

namespace ulysses::data {

inline constexpr char kMegatronMagic[] = "MMIDIDX\x00\x00";  // 9 bytes without the terminator
inline constexpr int64_t kMegatronMagicBytes = 9;
inline constexpr uint64_t kMegatronVersion = 1;

struct MegatronIndex {
  TokenDType dtype = TokenDType::kUInt16;
  std::vector<int32_t> sequence_lengths;   // [sequence_count] tokens
  std::vector<int64_t> sequence_pointers;  // [sequence_count] byte offsets into .bin
  std::vector<int64_t> document_indices;   // [document_count] sequence indices, ascending
};

// Megatron's dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
// 8 uint16) as a token type; nullopt for the float codes and unknown codes.
std::optional<TokenDType> megatron_code_to_dtype(uint8_t code);

// The Megatron code of an integer token type. REQUIRES: dtype is not kUInt32 (Megatron has none).
uint8_t megatron_dtype_code(TokenDType dtype);

// Reads and checks `idx_path`. Throws UserError("<key>: <idx_path>: <what>") when the file is
// missing, the magic or version is wrong, the dtype is not an integer type, the arrays are
// truncated, or a length/pointer/document index is negative or out of order.
MegatronIndex read_megatron_index(const std::string& idx_path, const std::string& key);

}  // namespace ulysses::data
