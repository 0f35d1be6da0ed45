// Zip and bzip2 readers: archives built byte by byte at test time (stored and deflated members, a local header
// whose extra field differs from the central one), damaged copies of them (truncated, flipped data byte, not a
// zip, ZIP64, encrypted), bzip2 files with one and two streams, and the real MMLU / HellaSwag downloads when the
// shared assets are present.
#include <gtest/gtest.h>

#include <bzlib.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "eval/archive.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::expect_error;

fs::path write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(out.good()) << path;
  return path;
}

void put16(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>((v >> 8) & 0xff));
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xffff);
  put16(s, v >> 16);
}

std::string raw_deflate(const std::string& data) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, Z_BEST_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&s, static_cast<uLong>(data.size())), '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  s.avail_in = static_cast<uInt>(data.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

struct Member {
  std::string name;
  std::string content;
  uint16_t method = 0;          // 0 stored, 8 deflated
  std::string local_extra;      // extra field of the local header only
  uint16_t flags = 0;
};

// A zip archive: local header + data per member, central directory, end-of-central-directory record (with
// `comment`). `zip64_counts` writes 0xffff entry counts as a ZIP64 archive does.
std::string build_zip(const std::vector<Member>& members, const std::string& comment = "",
                      bool zip64_counts = false) {
  std::string zip, central;
  for (const auto& m : members) {
    const std::string data = m.method == 8 ? raw_deflate(m.content) : m.content;
    const auto crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(m.content.data()), static_cast<uInt>(m.content.size())));
    const auto offset = static_cast<uint32_t>(zip.size());
    const auto common = [&](std::string& h) {
      put16(h, 20);  // version needed
      put16(h, m.flags);
      put16(h, m.method);
      put32(h, 0);  // time, date
      put32(h, crc);
      put32(h, static_cast<uint32_t>(data.size()));
      put32(h, static_cast<uint32_t>(m.content.size()));
      put16(h, static_cast<uint32_t>(m.name.size()));
    };
    put32(zip, 0x04034b50);
    common(zip);
    put16(zip, static_cast<uint32_t>(m.local_extra.size()));
    zip += m.name + m.local_extra + data;

    put32(central, 0x02014b50);
    put16(central, 0x031e);  // made by: unix
    common(central);
    put16(central, 0);  // extra
    put16(central, 0);  // comment
    put16(central, 0);  // disk
    put16(central, 0);  // internal attributes
    put32(central, 0);  // external attributes
    put32(central, offset);
    central += m.name;
  }
  const auto cd_offset = static_cast<uint32_t>(zip.size());
  zip += central;
  const uint32_t count = zip64_counts ? 0xffff : static_cast<uint32_t>(members.size());
  put32(zip, 0x06054b50);
  put16(zip, 0);
  put16(zip, 0);
  put16(zip, count);
  put16(zip, count);
  put32(zip, static_cast<uint32_t>(central.size()));
  put32(zip, cd_offset);
  put16(zip, static_cast<uint32_t>(comment.size()));
  return zip + comment;
}

std::string some_text() {
  std::string text;
  for (int i = 0; i < 500; ++i) text += "Question " + std::to_string(i) + ",A,B,C,D,A\n";
  return text;
}

std::vector<Member> sample_members() {
  return {
      {"data/", "", 0, "", 0},
      {"data/stored.csv", "a,b,c\n1,2,3\n", 0, std::string("\x55\x54\x05\x00\x03\x00\x00\x00\x00", 9), 0},
      {"data/deflated.csv", some_text(), 8, "", 0},
      {"data/empty.txt", "", 8, "", 0},
  };
}

std::string bzip2(const std::string& data) {
  std::string out(data.size() + data.size() / 100 + 600, '\0');
  auto size = static_cast<unsigned>(out.size());
  EXPECT_EQ(BZ2_bzBuffToBuffCompress(out.data(), &size, const_cast<char*>(data.data()),
                                     static_cast<unsigned>(data.size()), 1, 0, 0),
            BZ_OK);
  out.resize(size);
  return out;
}

size_t count_lines(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

TEST(Archive, StoredAndDeflatedMembersRoundTrip) {
  const fs::path path = write_bytes(test::temp_dir("archive_round_trip") / "sample.zip", build_zip(sample_members(), "a comment"));
  const ZipArchive zip = ZipArchive::open(path);
  EXPECT_EQ(zip.path(), path);
  for (const auto& m : sample_members()) EXPECT_EQ(zip.read(m.name), m.content) << m.name;
  EXPECT_LT(raw_deflate(some_text()).size(), some_text().size() / 4);  // the member really is compressed
}

TEST(Archive, NamesListsMembersInCentralDirectoryOrder) {
  const fs::path path = write_bytes(test::temp_dir("archive_names") / "sample.zip", build_zip(sample_members()));
  const ZipArchive zip = ZipArchive::open(path);
  EXPECT_EQ(zip.names(),
            (std::vector<std::string>{"data/", "data/stored.csv", "data/deflated.csv", "data/empty.txt"}));
  EXPECT_TRUE(zip.contains("data/deflated.csv"));
  EXPECT_FALSE(zip.contains("data/deflated"));
  EXPECT_FALSE(zip.contains("stored.csv"));
  EXPECT_TRUE(ZipArchive::open(write_bytes(path.parent_path() / "empty.zip", build_zip({}))).names().empty());
}

TEST(Archive, MissingMemberIsNamed) {
  const fs::path path = write_bytes(test::temp_dir("archive_missing_member") / "sample.zip", build_zip(sample_members()));
  const ZipArchive zip = ZipArchive::open(path);
  expect_error<FormatError>([&] { zip.read("data/test/foo.csv"); },
                            {"sample.zip", "no member 'data/test/foo.csv'"});
}

TEST(Archive, TruncatedArchiveIsAFormatError) {
  const std::string whole = build_zip(sample_members());
  const fs::path path = write_bytes(test::temp_dir("archive_truncated") / "half.zip", whole.substr(0, whole.size() / 2));
  expect_error<FormatError>([&] { ZipArchive::open(path); }, {"half.zip", "not a zip archive"});
  // The record survives but the central directory it points to was cut away.
  const std::string tail = whole.substr(whole.size() - 22);
  write_bytes(path, whole.substr(0, 10) + tail);
  expect_error<FormatError>([&] { ZipArchive::open(path); }, {"half.zip", "central directory"});
}

TEST(Archive, CorruptedDataFailsTheCrcCheck) {
  std::string bytes = build_zip(sample_members());
  const size_t at = bytes.find("1,2,3");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = '7';
  const fs::path path = write_bytes(test::temp_dir("archive_corrupt") / "mmlu.zip", bytes);
  const ZipArchive zip = ZipArchive::open(path);
  expect_error<FormatError>([&] { zip.read("data/stored.csv"); },
                            {"mmlu.zip", "member 'data/stored.csv'", "CRC mismatch"});
  EXPECT_EQ(zip.read("data/deflated.csv"), some_text());  // the other members are still readable

  // A flipped byte inside deflate data breaks either the stream or the CRC; both name the member.
  std::string deflated = build_zip({{"x.csv", some_text(), 8, "", 0}});
  deflated[30 + 5 + 40] ^= 0x5a;
  const fs::path path2 = write_bytes(path.parent_path() / "deflated.zip", deflated);
  expect_error<FormatError>([&] { ZipArchive::open(path2).read("x.csv"); }, {"deflated.zip", "member 'x.csv'"});
}

TEST(Archive, NotAZipIsAFormatError) {
  const fs::path dir = test::temp_dir("archive_not_zip");
  const fs::path text = write_bytes(dir / "plain.zip", std::string(100000, 'x'));
  expect_error<FormatError>([&] { ZipArchive::open(text); },
                            {"plain.zip", "not a zip archive (no end-of-central-directory record)"});
  const fs::path tiny = write_bytes(dir / "tiny.zip", "PK");
  expect_error<FormatError>([&] { ZipArchive::open(tiny); }, {"tiny.zip", "not a zip archive"});
}

TEST(Archive, MissingFileIsAnIoError) {
  const fs::path gone = test::temp_dir("archive_missing_file") / "gone.zip";
  expect_error<IoError>([&] { ZipArchive::open(gone); }, {"gone.zip"});
  expect_error<IoError>([&] { read_bzip2_file(gone.parent_path() / "gone.txt.bz2"); }, {"gone.txt.bz2"});
  expect_error<IoError>([&] { read_maybe_compressed(gone.parent_path() / "gone.txt"); }, {"gone.txt"});
}

TEST(Archive, Zip64AndEncryptionAreRejected) {
  const fs::path dir = test::temp_dir("archive_unsupported");
  const fs::path zip64 = write_bytes(dir / "big.zip", build_zip(sample_members(), "", true));
  expect_error<FormatError>([&] { ZipArchive::open(zip64); }, {"big.zip", "ZIP64 archives are not supported"});

  const fs::path locked = write_bytes(dir / "locked.zip", build_zip({{"secret.txt", "hidden", 0, "", 1}}));
  const ZipArchive zip = ZipArchive::open(locked);
  EXPECT_TRUE(zip.contains("secret.txt"));
  expect_error<FormatError>([&] { zip.read("secret.txt"); }, {"locked.zip", "member 'secret.txt'", "encrypted"});
}

TEST(Archive, Bzip2RoundTripsIncludingConcatenatedStreams) {
  const fs::path dir = test::temp_dir("archive_bzip2");
  const std::string first = some_text(), second = "second stream\nlast line\n";
  EXPECT_EQ(read_bzip2_file(write_bytes(dir / "one.txt.bz2", bzip2(first))), first);
  EXPECT_EQ(read_bzip2_file(write_bytes(dir / "two.txt.bz2", bzip2(first) + bzip2(second))), first + second);
  EXPECT_EQ(read_bzip2_file(write_bytes(dir / "empty.bz2", bzip2(""))), "");
  std::string large;  // several 100 KB bzip2 blocks and 64 KiB output buffers
  for (int i = 0; i < 40000; ++i) large += std::to_string(i * 7919 % 100003) + (i % 13 == 0 ? "\n" : " ");
  EXPECT_EQ(read_bzip2_file(write_bytes(dir / "large.bz2", bzip2(large))), large);

  EXPECT_EQ(read_maybe_compressed(dir / "two.txt.bz2"), first + second);
  EXPECT_EQ(read_maybe_compressed(write_bytes(dir / "plain.txt", "plain\n")), "plain\n");
}

TEST(Archive, CorruptBzip2IsAFormatError) {
  const fs::path dir = test::temp_dir("archive_bzip2_corrupt");
  std::string bytes = bzip2(some_text());
  bytes[bytes.size() / 2] ^= 0x5a;
  expect_error<FormatError>([&] { read_bzip2_file(write_bytes(dir / "flipped.bz2", bytes)); }, {"flipped.bz2"});

  const std::string whole = bzip2(some_text());
  expect_error<FormatError>([&] { read_bzip2_file(write_bytes(dir / "cut.bz2", whole.substr(0, whole.size() / 2))); },
                            {"cut.bz2", "unexpected end"});
  expect_error<FormatError>([&] { read_bzip2_file(write_bytes(dir / "plain.bz2", "hello world\n")); },
                            {"plain.bz2", "not a bzip2 file"});
  expect_error<FormatError>([&] { read_bzip2_file(write_bytes(dir / "zero.bz2", "")); }, {"zero.bz2"});
  expect_error<FormatError>([&] { read_bzip2_file(write_bytes(dir / "trailing.bz2", whole + "garbage")); },
                            {"trailing.bz2", "trailing data"});
}

TEST(Archive, ReadsTheSharedMmluZip) {
  const fs::path path = test::assets() / "data" / "eval" / "mmlu" / "mmlu.zip";
  SWIFTCPP_REQUIRE_SHARED(path);
  const ZipArchive zip = ZipArchive::open(path);
  ASSERT_TRUE(zip.contains("data/dev/abstract_algebra_dev.csv"));
  EXPECT_EQ(count_lines(zip.read("data/dev/abstract_algebra_dev.csv")), 5u);
}

TEST(Archive, ReadsTheSharedHellaswagBzip2) {
  const fs::path path = test::assets() / "data" / "eval" / "hellaswag" / "hellaswag_val_full.txt.bz2";
  SWIFTCPP_REQUIRE_SHARED(path);
  const std::string text = read_maybe_compressed(path);
  EXPECT_EQ(count_lines(text), 60252u);  // 10042 tasks x 6 lines
  EXPECT_EQ(text.rfind("Roof shingle removal: A man is sitting on a roof. he\n3\n", 0), 0u);
}

}  // namespace
}  // namespace swiftcpp
