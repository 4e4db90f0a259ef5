// The one rule for every command that writes or replaces a directory: it replaces only a directory
// it created itself (a marker file listing what it wrote), never `.`, an ancestor of the working
// directory, a directory holding a protected file (a results database), or a user's files; and a
// new output is written beside the old one and renamed into place, so a failure leaves the old one.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace ulysses {

// The marker an output directory carries: its first line names the writer ("ulysses-tune
// report"), the next ones are the paths (relative, '/'-separated) of every file the writer put
// there. Nothing else in such a directory belongs to the writer.
inline constexpr const char* kOutputMarker = ".ulysses-output";

// Who writes a directory and under which option, for the one-line errors: e.g. {"--out",
// "ulysses-tune report"}. `protect` lists files that must survive (the results database): a
// directory holding one of them, at any depth, is never replaced.
struct OutputOwner {
  std::string flag;    // the option or key the user chose the directory with ("--out")
  std::string writer;  // the marker's first line ("ulysses-tune recommend")
  std::vector<std::filesystem::path> protect;
};

// Throws UserError "<flag> <dir>: <why>; <what to do>" unless `dir` may receive `owner`'s output:
// it does not exist, or it is an empty directory, or it is a directory whose marker names
// owner.writer and that holds nothing but the files the marker lists (and empty folders). Always
// refused: `.`, the working directory or one of its ancestors, a directory holding a protected
// file, a path that exists and is not a directory. Reads only.
void check_replaceable_output(const std::filesystem::path& dir, const OutputOwner& owner);

// True when `dir` carries a marker written by `writer` (whatever else it holds). Reads only.
bool is_output_of(const std::filesystem::path& dir, const std::string& writer);

// Writes `dir` (the marker included) without taking `dir`'s place until commit():
//   StagedOutputDir out(dir, owner);       // checks the rule, creates <parent>/.<name>.tmp-<pid>
//   write files under out.staging();
//   out.commit();                          // marker, old aside, new into place, old removed
// A destructor without commit() removes the staging directory and leaves `dir` as it was.
// Invariants: staging() lives beside dir (same file system, so the renames are atomic); the old
// output is removed only after the new one is in place, and restored if that rename fails.
class StagedOutputDir {
 public:
  // Throws UserError (the rule above; a parent that cannot be created or written).
  StagedOutputDir(std::filesystem::path dir, OutputOwner owner);
  ~StagedOutputDir();
  StagedOutputDir(const StagedOutputDir&) = delete;
  StagedOutputDir& operator=(const StagedOutputDir&) = delete;

  const std::filesystem::path& staging() const { return staging_; }
  const std::filesystem::path& target() const { return dir_; }

  // Checks the rule again (the directory may have changed meanwhile), writes the marker listing
  // every file under staging(), and renames it into place. Throws UserError; `dir` is then as it
  // was before.
  void commit();

 private:
  std::filesystem::path dir_;
  std::filesystem::path staging_;
  OutputOwner owner_;
};

// A directory a command keeps adding to (a sweep's trial directories, a run's checkpoints):
// creates `dir` with a marker naming `writer` and `identity` (e.g. the database and the sweep),
// or accepts an existing one whose marker says the same. Throws UserError "<flag> <dir>: ..." for
// anything else that is not an empty directory, and when `dir` cannot be created or written
// (checked by creating and removing a file there).
void claim_output_dir(const std::filesystem::path& dir, const OutputOwner& owner,
                      const std::string& identity);

// The checks of claim_output_dir without creating or writing anything.
void check_claimable_output(const std::filesystem::path& dir, const OutputOwner& owner,
                            const std::string& identity);

// Writes `text` to the file `path` through a temporary file beside it and one rename. Refuses (one
// UserError line naming `owner.flag`) a path that exists unless `replace` is true and it is a
// regular file, and always a protected file. The temporary file is removed on failure.
void write_output_file(const std::filesystem::path& path, const std::string& text,
                       const OutputOwner& owner, bool replace);

// The checks of write_output_file alone (for a command that must refuse before it does any work).
void check_output_file(const std::filesystem::path& path, const OutputOwner& owner, bool replace);

// Throws UserError "<flag>: <dir>: not writable (<reason>)" unless `dir` exists or can be created
// and a file can be created in it (the file is removed again). Creates `dir` (and parents).
void check_writable_dir(const std::filesystem::path& dir, const std::string& flag);

}  // namespace ulysses
