#include "eval/archive.h"

#include <bzlib.h>
#include <zlib.h>

#include <algorithm>

#include "core/error.h"

namespace swiftcpp {

namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndOfCentralDirSig = 0x06054b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndOfCentralDirSize = 22;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kMaxCommentSize = 0xffff;

// Little-endian fields; the caller has checked that they lie inside `data`.
uint16_t u16(const std::string& data, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data()) + pos;
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
uint32_t u32(const std::string& data, size_t pos) {
  return static_cast<uint32_t>(u16(data, pos)) | static_cast<uint32_t>(u16(data, pos + 2)) << 16;
}

// Whether bytes [pos, pos + n) lie inside `data`, without overflow.
bool fits(const std::string& data, size_t pos, size_t n) { return pos <= data.size() && n <= data.size() - pos; }

}  // namespace

ZipArchive::ZipArchive(fs::path path, std::string data) : path_(std::move(path)), data_(std::move(data)) {}

ZipArchive ZipArchive::open(const fs::path& path) {
  ZipArchive zip(path, read_text_file(path));
  const std::string& d = zip.data_;
  const std::string where = path.string();

  // The end-of-central-directory record is the last 22 bytes, followed by a comment of up to 64 KiB.
  if (d.size() < kEndOfCentralDirSize) fail<FormatError>("{}: not a zip archive (too short)", where);
  const size_t last = d.size() - kEndOfCentralDirSize;
  const size_t first = last > kMaxCommentSize ? last - kMaxCommentSize : 0;
  size_t eocd = SIZE_MAX;
  for (size_t pos = last + 1; pos-- > first;) {
    if (u32(d, pos) == kEndOfCentralDirSig && pos + kEndOfCentralDirSize + u16(d, pos + 20) <= d.size()) {
      eocd = pos;
      break;
    }
  }
  if (eocd == SIZE_MAX) fail<FormatError>("{}: not a zip archive (no end-of-central-directory record)", where);

  const uint16_t disk = u16(d, eocd + 4), cd_disk = u16(d, eocd + 6);
  const uint16_t disk_entries = u16(d, eocd + 8), count = u16(d, eocd + 10);
  const uint32_t cd_size = u32(d, eocd + 12), cd_offset = u32(d, eocd + 16);
  const bool zip64_locator =
      eocd >= kZip64LocatorSize && u32(d, eocd - kZip64LocatorSize) == kZip64LocatorSig;
  if (zip64_locator || count == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
    fail<FormatError>("{}: ZIP64 archives are not supported", where);
  }
  if (disk != 0 || cd_disk != 0 || disk_entries != count) {
    fail<FormatError>("{}: multi-disk zip archives are not supported", where);
  }
  if (static_cast<size_t>(cd_offset) + cd_size > eocd) {
    fail<FormatError>("{}: central directory lies outside the archive (truncated file?)", where);
  }

  size_t pos = cd_offset;
  const size_t cd_end = static_cast<size_t>(cd_offset) + cd_size;
  zip.entries_.reserve(count);
  for (uint16_t i = 0; i < count; ++i) {
    if (pos + kCentralHeaderSize > cd_end || u32(d, pos) != kCentralHeaderSig) {
      fail<FormatError>("{}: bad central directory entry {} of {}", where, i + 1, count);
    }
    const size_t name_len = u16(d, pos + 28), extra_len = u16(d, pos + 30), comment_len = u16(d, pos + 32);
    const size_t next = pos + kCentralHeaderSize + name_len + extra_len + comment_len;
    if (next > cd_end) fail<FormatError>("{}: central directory entry {} of {} is truncated", where, i + 1, count);
    Entry e;
    e.name = d.substr(pos + kCentralHeaderSize, name_len);
    e.flags = u16(d, pos + 8);
    e.method = u16(d, pos + 10);
    e.crc = u32(d, pos + 16);
    e.compressed_size = u32(d, pos + 20);
    e.size = u32(d, pos + 24);
    e.local_offset = u32(d, pos + 42);
    if (e.compressed_size == 0xffffffff || e.size == 0xffffffff || e.local_offset == 0xffffffff) {
      fail<FormatError>("{}: member '{}': ZIP64 archives are not supported", where, e.name);
    }
    zip.index_.emplace(e.name, zip.entries_.size());
    zip.entries_.push_back(std::move(e));
    pos = next;
  }
  return zip;
}

std::vector<std::string> ZipArchive::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

bool ZipArchive::contains(const std::string& name) const { return index_.count(name) != 0; }

std::string ZipArchive::read(const std::string& name, uint64_t max_bytes) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail<FormatError>("{}: no member '{}'", path_.string(), name);
  const Entry& e = entries_[it->second];
  const auto bad = [&](const std::string& why) {
    fail<FormatError>("{}: member '{}': {}", path_.string(), name, why);
  };
  if (e.flags & 0x1) bad("encrypted members are not supported");
  if (e.method != 0 && e.method != 8) bad(fmt::format("unsupported compression method {}", e.method));
  if (e.size > max_bytes) {
    bad(fmt::format("declares {} uncompressed bytes, more than the limit of {} bytes", e.size, max_bytes));
  }
  if (e.method == 8 && e.size > static_cast<uint64_t>(e.compressed_size) * kMaxDeflateRatio + 1024) {
    bad(fmt::format("declares {} uncompressed bytes, more than deflate can produce from its {} compressed bytes",
                    e.size, e.compressed_size));
  }

  // The local header repeats name and extra field, possibly with other lengths than the central directory's.
  const std::string& d = data_;
  if (!fits(d, e.local_offset, kLocalHeaderSize) || u32(d, e.local_offset) != kLocalHeaderSig) {
    bad("bad local file header");
  }
  const size_t start = e.local_offset + kLocalHeaderSize + u16(d, e.local_offset + 26) + u16(d, e.local_offset + 28);
  if (!fits(d, start, e.compressed_size)) bad("data extends past the end of the archive");

  std::string out;
  if (e.method == 0) {
    if (e.compressed_size != e.size) bad("stored member with different compressed and uncompressed sizes");
    out = d.substr(start, e.size);
  } else {
    // Inflated a piece at a time: memory grows with the bytes produced, never on the word of the header.
    struct Inflater {
      z_stream s{};
      ~Inflater() { inflateEnd(&s); }
    } z;
    if (inflateInit2(&z.s, -MAX_WBITS) != Z_OK) bad("cannot initialise zlib");
    z.s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(d.data() + start));
    z.s.avail_in = e.compressed_size;
    char buffer[1 << 16];
    for (;;) {
      z.s.next_out = reinterpret_cast<Bytef*>(buffer);
      z.s.avail_out = sizeof(buffer);
      const int rc = inflate(&z.s, Z_NO_FLUSH);
      const size_t produced = sizeof(buffer) - z.s.avail_out;
      if (out.size() + produced > e.size) bad(fmt::format("inflates to more than the declared {} bytes", e.size));
      out.append(buffer, produced);
      if (rc == Z_STREAM_END) break;
      if (rc != Z_OK) {
        bad("corrupt deflate data (" + std::string(z.s.msg != nullptr ? z.s.msg : "unexpected end of data") + ")");
      }
    }
  }
  if (out.size() != e.size) bad(fmt::format("size {} does not match the declared {}", out.size(), e.size));
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size())));
  if (crc != e.crc) bad(fmt::format("CRC mismatch (0x{:08x}, expected 0x{:08x})", crc, e.crc));
  return out;
}

std::string read_bzip2_file(const fs::path& path, uint64_t max_bytes) {
  const std::string in = read_text_file(path);
  const auto bad = [&](const std::string& why) { fail<FormatError>("{}: {}", path.string(), why); };

  // Owns the decompressor of one stream; a new one is started for each concatenated stream.
  struct Stream {
    bz_stream s{};
    bool live = false;
    ~Stream() {
      if (live) BZ2_bzDecompressEnd(&s);
    }
  };
  std::string out;
  char buffer[1 << 16];
  size_t fed = 0;  // input bytes handed to a decompressor so far
  do {
    Stream st;
    if (BZ2_bzDecompressInit(&st.s, 0, 0) != BZ_OK) bad("cannot initialise bzip2");
    st.live = true;
    const bool first = fed == 0;
    for (;;) {
      if (st.s.avail_in == 0 && fed < in.size()) {
        st.s.next_in = const_cast<char*>(in.data() + fed);
        st.s.avail_in = static_cast<unsigned>(std::min<size_t>(in.size() - fed, 1u << 30));
        fed += st.s.avail_in;
      }
      st.s.next_out = buffer;
      st.s.avail_out = sizeof(buffer);
      const bool starved = st.s.avail_in == 0;
      const int rc = BZ2_bzDecompress(&st.s);
      const size_t produced = sizeof(buffer) - st.s.avail_out;
      if (produced > max_bytes - out.size()) {
        bad(fmt::format("decompresses to more than the limit of {} bytes", max_bytes));
      }
      out.append(buffer, produced);
      if (rc == BZ_STREAM_END) break;
      if (rc == BZ_DATA_ERROR_MAGIC) bad(first ? "not a bzip2 file" : "trailing data that is not bzip2");
      if (rc == BZ_DATA_ERROR) bad("corrupt bzip2 data");
      if (rc != BZ_OK) bad(fmt::format("bzip2 error {}", rc));
      if (starved && st.s.avail_out != 0) bad("unexpected end of bzip2 data (truncated file?)");
    }
    fed -= st.s.avail_in;  // what the finished stream left unread starts the next one
  } while (fed < in.size());
  return out;
}

std::string read_maybe_compressed(const fs::path& path, uint64_t max_bytes) {
  return path.extension() == ".bz2" ? read_bzip2_file(path, max_bytes) : read_text_file(path);
}

}  // namespace swiftcpp
