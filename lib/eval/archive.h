// Readers of compressed evaluation data: zip archives (stored and deflated members, as in the MMLU download)
// and bzip2 files (single or concatenated streams).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.h"

namespace swiftcpp {

/// The most bytes one zip member or one bzip2 file of evaluation data may unpack to (4 GiB); more is refused with
/// an error naming the file and the limit, before that much memory is used.
constexpr uint64_t kMaxUnpackedBytes = uint64_t{4} << 30;

/// A deflate stream unpacks to at most about 1032 times its size; a zip member declaring more is refused unread.
constexpr uint64_t kMaxDeflateRatio = 1100;

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
  /// The uncompressed bytes of member `name`, read in pieces so that memory follows the data actually inflated.
  /// Throws FormatError naming the archive and the member when there is no such member, it is encrypted or
  /// uses another compression method, declares more than `max_bytes` or more than deflate can produce from its
  /// compressed size, or its data is corrupt (bad local header, inflate error, size or CRC mismatch).
  std::string read(const std::string& name, uint64_t max_bytes = kMaxUnpackedBytes) const;

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
/// file when it is not bzip2 data, is corrupt, ends inside a stream, or decompresses to more than `max_bytes`
/// (the message names the limit).
std::string read_bzip2_file(const fs::path& path, uint64_t max_bytes = kMaxUnpackedBytes);

/// The content of `path`, decompressed with read_bzip2_file when its name ends in ".bz2", else read as is.
/// Throws IoError / FormatError as read_bzip2_file and read_text_file.
std::string read_maybe_compressed(const fs::path& path, uint64_t max_bytes = kMaxUnpackedBytes);

}  // namespace swiftcpp
