// remove_tree: delete a file or a directory tree without std::filesystem::remove_all. Some
// PyTorch wheels (seen: 2.11.0+cu130 on the lent H100) export their own copy of
// std::filesystem::remove_all from libtorch.so; a binary linked with it calls that copy, which
// jumps to a null address (every test's temp-dir cleanup crashed there). POSIX nftw is ours alone.
#pragma once
#include <ftw.h>
#include <stdio.h>

#include <filesystem>

namespace ulysses {

// Removes `path` and everything under it (symbolic links are removed, not followed). Returns true
// when nothing is left; a missing path counts as removed. Never throws.
inline bool remove_tree(const std::filesystem::path& path) noexcept {
  auto remove_entry = [](const char* entry, const struct stat*, int, struct FTW*) {
    return ::remove(entry) == 0 ? 0 : -1;
  };
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) return true;  // nothing there
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

}  // namespace ulysses
