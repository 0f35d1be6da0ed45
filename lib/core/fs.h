// Filesystem helpers: whole-file reads, checks that inputs are regular files, and atomic writes (temporary name +
// rename) that never replace anything but a regular file.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace swiftcpp {

namespace fs = std::filesystem;

/// Checks, without opening it, that `path` names a regular file (symbolic links followed), so that a folder, a
/// device such as /dev/zero, a FIFO or a socket is refused before anything reads it forever or waits on it. Call it
/// right before opening any input file. `what` says what the file is ("dataset", "model weights", ...). Throws
/// IoError naming the file and the reason: missing, unreadable, a symbolic link loop, or not a regular file.
void require_regular_file(const fs::path& path, std::string_view what = "file");

/// Checks that an output file can be written at `path` without replacing anything but a regular file: whatever is
/// there (symbolic links followed) must be a regular file or nothing, and the nearest existing folder above it must
/// be a folder. Creates nothing. Throws IoError naming the path (and the part of it that is in the way).
void check_output_file(const fs::path& path, std::string_view what = "output");

/// Checks that an output folder can be written at `dir`: whatever is there (symbolic links followed) must be a
/// folder or nothing, and the nearest existing folder above it must be a folder. Creates nothing. Throws IoError
/// naming the path (and the part of it that is in the way).
void check_output_folder(const fs::path& dir, std::string_view what = "output folder");

/// Creates folder `dir` and its missing parents. Throws IoError naming `dir` and the part of it that is not a
/// folder (a regular file in the way) or the system's reason.
void create_folders(const fs::path& dir);

/// Puts the finished folder `temp` in place as `dest` in one step: a folder already at `dest` is swapped out
/// atomically (renameat2 RENAME_EXCHANGE; two renames where the file system cannot exchange) and then removed, so a
/// kill at any moment leaves either the old or the new folder under `dest`, never a mix and never nothing (except
/// in the two-rename fallback, between the renames). `temp` must sit in the same folder as `dest`. Throws IoError
/// naming both paths; refuses a `dest` that exists and is not a folder.
void replace_folder(const fs::path& temp, const fs::path& dest);

/// Reads a whole file into a string. Throws IoError naming the file when it cannot be read or is not a regular
/// file (see require_regular_file).
std::string read_text_file(const fs::path& path);

/// A file written under a temporary name in the destination folder and renamed into place by commit(), so
/// readers never see a half-written file and an earlier file of that name survives a failed write.
/// Destroying it without commit() removes the temporary file. A process killed before commit() leaves at most the
/// temporary file, never a partial file under the final name. It replaces only a regular file: a destination that
/// is a folder, device, FIFO or socket is refused (see check_output_file).
class AtomicFile {
 public:
  /// Checks the destination (check_output_file) and opens `<path>.tmp-<pid>-<n>` for binary writing. Throws
  /// IoError naming `path` when the destination exists and is not a regular file, or the file cannot be created.
  explicit AtomicFile(fs::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// The stream to write to.
  std::ofstream& stream() { return out_; }
  /// Flushes, syncs to disk and renames over the destination (checked again: it must still be a regular file or
  /// nothing). Throws IoError on any failure; the temporary file is then removed by the destructor.
  void commit();

 private:
  fs::path path_;
  fs::path temp_;
  std::ofstream out_;
  bool committed_ = false;
};

/// Writes `content` to `path` atomically (see AtomicFile). Throws IoError.
void write_file_atomic(const fs::path& path, const std::string& content);

}  // namespace swiftcpp
