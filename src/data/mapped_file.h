// A read-only memory map of a whole file: the storage behind flat token files and Megatron
// .bin/.idx files. Pages are read on demand by the kernel and shared between ranks on one host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ulysses::data {

// Owns the mapping; unmaps it on destruction. Not copyable, movable.
class MappedFile {
 public:
  // Maps `path` read-only. Throws UserError("<key>: <path>: cannot open (<reason>)") when the
  // file is missing, unreadable or not a regular file. An empty file maps to size() == 0.
  MappedFile(const std::string& path, const std::string& key);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }  // nullptr when size() == 0
  size_t size() const { return size_; }          // bytes
  const std::string& path() const { return path_; }

 private:
  void unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ulysses::data
