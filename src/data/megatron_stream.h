// One Megatron-LM indexed dataset (PREFIX.idx + PREFIX.bin) read as a stream of values: its
// sequences concatenated in index order, with the stream offsets where sequences and documents
// begin. The storage behind megatron:PREFIX token sources and their PREFIX_loss_mask datasets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_dtype.h"

namespace ulysses::data {

// Immutable after construction; const calls may run concurrently.
// Invariants: sequence_starts() ascends from 0 to num_values(); document_starts() ascends, each
// below num_values(), without repeats.
class MegatronStream {
 public:
  // Reads PREFIX.idx and maps PREFIX.bin. Throws UserError("<key>: <file>: ...") when a file is
  // missing or corrupt (see read_megatron_index) or a sequence lies outside PREFIX.bin.
  MegatronStream(const std::string& prefix, const std::string& key);

  int64_t num_values() const { return sequence_starts_.back(); }
  int64_t sequence_count() const { return static_cast<int64_t>(sequence_pointers_.size()); }
  // [sequence_count + 1] stream offset of each sequence, then num_values().
  const std::vector<int64_t>& sequence_starts() const { return sequence_starts_; }
  // Stream offsets where the index's documents begin (documents without values left out).
  const std::vector<int64_t>& document_starts() const { return document_starts_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& bin_path() const { return bin_.path(); }
  const std::string& prefix() const { return prefix_; }

  // Decodes stream values [first, first + count) into out[0, count).
  // REQUIRES: 0 <= first, count >= 0, first + count <= num_values(); out holds count values.
  void read(int64_t first, int64_t count, int64_t* out) const;

 private:
  std::string prefix_;
  MappedFile bin_;
  TokenDType dtype_ = TokenDType::kUInt16;
  // Kept per sequence (16 bytes each); the index file itself is not kept mapped.
  std::vector<int64_t> sequence_starts_;    // [sequence_count + 1]
  std::vector<int64_t> sequence_pointers_;  // [sequence_count] byte offset in PREFIX.bin
  std::vector<int64_t> document_starts_;    // ascending stream offsets
};

}  // namespace ulysses::data
