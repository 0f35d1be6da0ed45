// Filesystem helpers: whole-file reads and atomic writes (temporary name + rename).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

namespace swiftcpp {

namespace fs = std::filesystem;

/// Reads a whole file into a string. Throws IoError naming the file when it cannot be read.
std::string read_text_file(const fs::path& path);

/// A file written under a temporary name in the destination folder and renamed into place by commit(), so
/// readers never see a half-written file and an earlier file of that name survives a failed write.
/// Destroying it without commit() removes the temporary file.
class AtomicFile {
 public:
  /// Opens `<path>.tmp-<pid>-<n>` for binary writing. Throws IoError when it cannot be created.
  explicit AtomicFile(fs::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// The stream to write to.
  std::ofstream& stream() { return out_; }
  /// Flushes, syncs to disk and renames over the destination. Throws IoError on any failure.
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
