// The rule for directories a command writes or replaces (see output_dir.h).
#include "common/output_dir.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses {
namespace {

constexpr const char* kIdentityPrefix = "for: ";

// `dir` as an absolute path without a trailing separator, symbolic links of its existing part
// resolved (so `.`, `./`, `a/..` and a link to the working directory all compare equal).
fs::path resolved(const fs::path& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) p = fs::absolute(dir).lexically_normal();
  while (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
  return p;
}

// True when `inner` is `outer` or lies under it (both resolved).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

struct Marker {
  std::string writer;
  std::string identity;          // claimed directories
  std::set<std::string> files;   // staged outputs
};

std::optional<Marker> read_marker(const fs::path& dir) {
  std::ifstream in(dir / kOutputMarker);
  if (!in) return std::nullopt;
  Marker m;
  std::string line;
  if (!std::getline(in, m.writer)) return std::nullopt;
  while (std::getline(in, line)) {
    if (line.rfind(kIdentityPrefix, 0) == 0) {
      m.identity = line.substr(std::string(kIdentityPrefix).size());
    } else if (!line.empty()) {
      m.files.insert(line);
    }
  }
  return m;
}

// Every regular file (or link, or other non-directory) under `dir`, relative, '/'-separated.
std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) continue;
    files.push_back(it->path().lexically_relative(dir).generic_string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string no_trailing_separator(const fs::path& dir) {
  fs::path p = dir;
  while (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
  return p.string();
}

[[noreturn]] void refuse(const OutputOwner& owner, const fs::path& dir, const std::string& why) {
  throw UserError(owner.flag + " " + no_trailing_separator(dir) + ": " + why);
}

// The rules that hold whatever the directory holds: never the working directory or above it,
// never a directory holding a protected file, never a path that is not a directory.
void check_place(const fs::path& dir, const OutputOwner& owner) {
  const fs::path target = resolved(dir);
  std::error_code ec;
  const fs::path cwd = resolved(fs::current_path(ec));
  if (is_within(cwd, target)) {
    refuse(owner, dir,
           "is the working directory or holds it; choose a new directory, e.g. " +
               owner.flag + " out");
  }
  for (const fs::path& keep : owner.protect) {
    if (!keep.empty() && is_within(resolved(keep), target)) {
      refuse(owner, dir,
             "holds " + keep.string() +
                 ", which must not be replaced; choose a new directory beside it");
    }
  }
  const fs::file_status status = fs::symlink_status(dir, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    refuse(owner, dir,
           fs::is_symlink(status) ? "is a symbolic link; give the directory itself"
                                  : "exists and is not a directory; choose another path");
  }
}

void write_marker(const fs::path& dir, const std::string& text) {
  const fs::path path = dir / kOutputMarker;
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out.flush()) throw UserError(path.string() + ": cannot write");
}

}  // namespace

bool is_output_of(const fs::path& dir, const std::string& writer) {
  const std::optional<Marker> m = read_marker(dir);
  return m && m->writer == writer;
}

void check_replaceable_output(const fs::path& dir, const OutputOwner& owner) {
  check_place(dir, owner);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dir, ec)) || fs::is_empty(dir, ec)) return;
  const std::optional<Marker> marker = read_marker(dir);
  if (!marker || marker->writer != owner.writer || !marker->identity.empty()) {
    refuse(owner, dir,
           "exists, is not empty and was not written by " + owner.writer +
               "; choose a new directory (or remove this one yourself)");
  }
  for (const std::string& file : files_under(dir)) {
    if (file != kOutputMarker && marker->files.count(file) == 0) {
      refuse(owner, dir,
             "holds " + file + ", which " + owner.writer +
                 " did not write; choose a new directory (or move that file out)");
    }
  }
}

StagedOutputDir::StagedOutputDir(fs::path dir, OutputOwner owner)
    : dir_(no_trailing_separator(dir)), owner_(std::move(owner)) {
  if (dir_.empty()) throw UserError(owner_.flag + ": give a directory");
  check_replaceable_output(dir_, owner_);
  const fs::path parent = dir_.has_parent_path() ? dir_.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  staging_ = parent / (std::string(".") + dir_.filename().string() + ".tmp-" + std::to_string(getpid()));
  remove_tree(staging_);  // a stale one of this process id
  if (!fs::create_directory(staging_, ec)) {
    const std::string reason = ec ? ec.message() : "already exists";
    staging_.clear();
    refuse(owner_, dir_, "cannot create a directory beside it (" + reason + ")");
  }
}

StagedOutputDir::~StagedOutputDir() {
  if (!staging_.empty()) remove_tree(staging_);
}

void StagedOutputDir::commit() {
  check_replaceable_output(dir_, owner_);
  std::string text = owner_.writer + "\n";
  for (const std::string& file : files_under(staging_)) {
    if (file != kOutputMarker) text += file + "\n";
  }
  write_marker(staging_, text);

  std::error_code ec;
  fs::path aside;
  if (fs::exists(fs::symlink_status(dir_, ec))) {
    aside = staging_.parent_path() /
            (std::string(".") + dir_.filename().string() + ".old-" + std::to_string(getpid()));
    remove_tree(aside);
    fs::rename(dir_, aside, ec);
    if (ec) refuse(owner_, dir_, "cannot move the earlier output aside (" + ec.message() + ")");
  }
  fs::rename(staging_, dir_, ec);
  if (ec) {
    std::error_code ignored;
    if (!aside.empty()) fs::rename(aside, dir_, ignored);  // the earlier output goes back
    refuse(owner_, dir_, "cannot move the new output into place (" + ec.message() + ")");
  }
  staging_.clear();
  if (!aside.empty()) remove_tree(aside);
}

void check_claimable_output(const fs::path& dir, const OutputOwner& owner,
                            const std::string& identity) {
  check_place(dir, owner);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec)) && !fs::is_empty(dir, ec)) {
    const std::optional<Marker> marker = read_marker(dir);
    if (!marker || marker->writer != owner.writer) {
      refuse(owner, dir,
             "exists, is not empty and was not written by " + owner.writer +
                 "; choose a new directory (or remove this one yourself)");
    }
    if (marker->identity != identity) {
      refuse(owner, dir,
             "belongs to " + (marker->identity.empty() ? std::string("another output")
                                                       : marker->identity) +
                 ", not " + identity + "; choose another directory");
    }
  }
}

void claim_output_dir(const fs::path& dir, const OutputOwner& owner, const std::string& identity) {
  check_claimable_output(dir, owner, identity);
  check_writable_dir(dir, owner.flag);
  std::error_code ec;
  if (!fs::exists(dir / kOutputMarker, ec)) {
    write_marker(dir, owner.writer + "\n" + kIdentityPrefix + identity + "\n");
  }
}

void check_output_file(const fs::path& path, const OutputOwner& owner, bool replace) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  for (const fs::path& keep : owner.protect) {
    if (!keep.empty() && fs::exists(status) && resolved(keep) == resolved(path)) {
      refuse(owner, path, "is a file this command must not replace; choose another name");
    }
  }
  if (fs::exists(status)) {
    if (!fs::is_regular_file(status)) refuse(owner, path, "exists and is not a regular file");
    if (!replace) refuse(owner, path, "exists; choose a new file name or pass --force to replace it");
  }
}

void write_output_file(const fs::path& path, const std::string& text, const OutputOwner& owner,
                       bool replace) {
  check_output_file(path, owner, replace);
  std::error_code ec;
  const fs::path tmp = path.parent_path() /
                       (std::string(".") + path.filename().string() + ".tmp-" + std::to_string(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) {
      out.close();
      fs::remove(tmp, ec);
      refuse(owner, path, "cannot write beside it");
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    refuse(owner, path, "cannot write (" + ec.message() + ")");
  }
}

void check_writable_dir(const fs::path& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) {
    throw UserError(flag + ": " + dir.string() + ": not writable (" +
                    (ec ? ec.message() : std::string("not a directory")) + ")");
  }
  const fs::path probe = dir / (".write-test-" + std::to_string(getpid()));
  {
    std::ofstream out(probe, std::ios::trunc);
    out << "x";
    if (!out.flush()) {
      out.close();
      fs::remove(probe, ec);
      throw UserError(flag + ": " + dir.string() + ": not writable (cannot create a file there)");
    }
  }
  fs::remove(probe, ec);
}

}  // namespace ulysses
