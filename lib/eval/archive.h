// Readers of compressed evaluation data: zip archives (stored and deflated members, as in the MMLU download)
// and bzip2 files (single or concatenated streams).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.h"

namespace swiftcpp {

/// A zip archive held in memory. Members stored (method 0) or deflated (method 8) can be read; every read
/// checks the member's CRC-32 and uncompressed size against the central directory. ZIP64, multi-disk archives
/// and encrypted members are rejected.
class ZipArchive {
 public:
  /// Reads the archive at `path` and indexes its central directory.
  /// Throws IoError when the file cannot be read, FormatError when it is not a zip archive (no
  /// end-of-central-directory record in its last 64 KiB + 22 bytes), is ZIP64 or multi-disk, or has a
  /// malformed central directory.
  static ZipArchive open(const fs::path& path);

  /// The file the archive was read from.
  const fs::path& path() const { return path_; }
  /// Member names in central-directory order; folders are listed too, with a trailing '/'.
  std::vector<std::string> names() const;
  /// Whether a member of exactly this name exists.
  bool contains(const std::string& name) const;
  /// The uncompressed bytes of member `name`.
  /// Throws FormatError naming the archive and the member when there is no such member, it is encrypted or
  /// uses another compression method, or its data is corrupt (bad local header, inflate error, size or CRC
  /// mismatch).
  std::string read(const std::string& name) const;

 private:
  struct Entry {
    std::string name;
    uint16_t flags = 0;
    uint16_t method = 0;
    uint32_t crc = 0;
    uint32_t compressed_size = 0;
    uint32_t size = 0;
    uint32_t local_offset = 0;
  };

  ZipArchive(fs::path path, std::string data);

  fs::path path_;
  std::string data_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> entries_ position (first one on duplicates)
};

/// The decompressed content of a bzip2 file; concatenated streams (as written by pbzip2 or `cat a.bz2 b.bz2`)
/// are decompressed one after the other. Throws IoError when the file cannot be read, FormatError naming the
/// file when it is not bzip2 data, is corrupt or ends inside a stream.
std::string read_bzip2_file(const fs::path& path);

/// The content of `path`, decompressed with read_bzip2_file when its name ends in ".bz2", else read as is.
/// Throws IoError / FormatError as read_bzip2_file and read_text_file.
std::string read_maybe_compressed(const fs::path& path);

}  // namespace swiftcpp
