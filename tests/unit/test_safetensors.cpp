// safetensors reader, sharded checkpoints and writer: round trips, hand-crafted malformed files, atomic writes
// and the bundled stories260K checkpoint. Tensors read back are compared exactly: reading copies stored bytes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::expect_error;

std::string u64_le(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A safetensors file from a raw header text and raw data bytes.
fs::path write_raw(const fs::path& path, const std::string& header, const std::string& data = {}) {
  write_bytes(path, u64_le(header.size()) + header + data);
  return path;
}

std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}


#define EXPECT_ERROR(E, statement, ...)                           \
  do {                                                            \
    SCOPED_TRACE(#statement);                                     \
    expect_error<E>([&] { statement; }, {__VA_ARGS__});           \
  } while (0)

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("swiftcpp_st_" + std::string(test->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // Opening `name` (written with `header` and `data`) must throw FormatError naming the file and `needles`.
  void expect_bad_file(const std::string& name, const std::string& header, const std::string& data,
                       std::vector<std::string> needles) {
    const fs::path path = write_raw(dir_ / name, header, data);
    needles.push_back(name);
    expect_error<FormatError>([&] { SafetensorsFile::open(path); }, needles);
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  at::manual_seed(0);
  const auto opts = [](at::ScalarType t) { return at::TensorOptions().dtype(t); };
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f64", at::randn({3, 4}, opts(at::kDouble))},
      {"f32", at::randn({2, 3, 4}, opts(at::kFloat))},
      {"f16", at::randn({5}, opts(at::kFloat)).to(at::kHalf)},
      {"bf16", at::randn({4, 4}, opts(at::kFloat)).to(at::kBFloat16)},
      {"i64", at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {7}, opts(at::kLong))},
      {"i32", at::randint(-100000, 100000, {3, 1}, opts(at::kInt))},
      {"i16", at::randint(-32768, 32767, {9}, opts(at::kShort))},
      {"i8", at::randint(-128, 127, {2, 5}, opts(at::kChar))},
      {"u8", at::randint(0, 255, {11}, opts(at::kByte))},
      {"bool", at::randint(0, 2, {3, 3}, opts(at::kLong)).to(at::kBool)},
      {"scalar", at::scalar_tensor(3.5, opts(at::kFloat))},
      {"empty", at::empty({0, 3}, opts(at::kFloat))},
      {"empty_i8", at::empty({4, 0}, opts(at::kChar))},
      {"transposed", at::arange(12, opts(at::kFloat)).reshape({3, 4}).t()},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\""}};
  const fs::path path = dir_ / "all.safetensors";
  save_safetensors(path, tensors, metadata);

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->metadata(), metadata);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (size_t i = 1; i < file->tensors().size(); ++i)
    EXPECT_LT(file->tensors()[i - 1].name, file->tensors()[i].name);
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(file->contains(name));
    const at::Tensor got = file->tensor(name);
    EXPECT_EQ(got.scalar_type(), expected.scalar_type());
    EXPECT_EQ(got.sizes(), expected.sizes());
    EXPECT_EQ(file->info(name).dtype, expected.scalar_type());
    EXPECT_TRUE(at::equal(got, expected));  // exact for every dtype: bytes are copied verbatim
  }
  EXPECT_EQ(file->tensor("scalar").dim(), 0);
  EXPECT_EQ(file->tensor("scalar").item<float>(), 3.5f);

  // Layout: data 8-byte aligned, each tensor aligned to its element size, ranges packed without gaps
  // (the reference reader rejects gaps).
  const std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& t : file->tensors()) {
    EXPECT_EQ(t.begin % c10::elementSize(t.dtype), 0u) << t.name;
    ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t cursor = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, cursor);
    cursor = e;
  }
  EXPECT_EQ(8 + header_len + cursor, bytes.size());
}

TEST_F(SafetensorsTest, HalfAndBFloat16BitsExact) {
  // Every 16-bit pattern (NaNs, infinities, subnormals, -0) survives unchanged.
  const at::Tensor bits = at::arange(-32768, 32768, at::TensorOptions().dtype(at::kInt)).to(at::kShort);
  const fs::path path = dir_ / "half.safetensors";
  save_safetensors(path, {{"h", bits.view(at::kHalf)}, {"b", bits.view(at::kBFloat16)}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(at::equal(file->tensor("h").view(at::kShort), bits));
  EXPECT_TRUE(at::equal(file->tensor("b").view(at::kShort), bits));

  // Known encodings, little-endian in the file: bf16 1.0 = 0x3F80, -2.0 = 0xC000; f16 1.0 = 0x3C00.
  const fs::path known = dir_ / "known.safetensors";
  save_safetensors(known, {{"b", at::tensor({1.0f, -2.0f}).to(at::kBFloat16)},
                           {"h", at::tensor({1.0f}).to(at::kHalf)}});
  const auto kfile = SafetensorsFile::open(known);
  const std::string bytes = read_bytes(known);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const std::string b = bytes.substr(8 + header_len + kfile->info("b").begin, 4);
  const std::string h = bytes.substr(8 + header_len + kfile->info("h").begin, 2);
  EXPECT_EQ(b, std::string("\x80\x3f\x00\xc0", 4));
  EXPECT_EQ(h, std::string("\x00\x3c", 2));
  EXPECT_EQ(kfile->tensor("b").to(at::kFloat)[1].item<float>(), -2.0f);
}

TEST_F(SafetensorsTest, TensorsAreZeroCopyAndCopyOnWrite) {
  const fs::path path = dir_ / "cow.safetensors";
  save_safetensors(path, {{"x", at::arange(4, at::TensorOptions().dtype(at::kFloat))}});
  const std::string before = read_bytes(path);
  auto file = SafetensorsFile::open(path);
  at::Tensor a = file->tensor("x");
  const at::Tensor b = file->tensor("x");
  EXPECT_EQ(a.data_ptr(), b.data_ptr());  // both view the same mapped bytes
  file.reset();                           // the tensors keep the mapping alive
  a.fill_(7.0f);                          // private mapping: writes never reach the file
  EXPECT_EQ(b[0].item<float>(), 7.0f);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(SafetensorsFile::open(path)->tensor("x")[3].item<float>(), 3.0f);
}

TEST_F(SafetensorsTest, UnalignedForeignDataIsCopied) {
  // A U8 byte followed by an F32 at data offset 1: legal, but not aligned for a float view.
  std::string data = "\x05";
  const float value = 2.5f;
  data.append(reinterpret_cast<const char*>(&value), 4);
  const fs::path path = write_raw(dir_ / "unaligned.safetensors",
                                  R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                  R"("b":{"dtype":"F32","shape":[],"data_offsets":[1,5]}})",
                                  data);
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->tensor("a")[0].item<uint8_t>(), 5);
  const at::Tensor b = file->tensor("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % alignof(float), 0u);
  EXPECT_EQ(b.item<float>(), 2.5f);
}

TEST_F(SafetensorsTest, EmptyTensorsMayShareOffsets) {
  const fs::path path = write_raw(dir_ / "empties.safetensors",
                                  R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                                  R"("b":{"dtype":"I64","shape":[2,0],"data_offsets":[0,0]}})");
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->tensor("b").sizes(), (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(file->metadata().empty());
}

// ---------------------------------------------------------------------------------------------------------
// Malformed files

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  write_bytes(dir_ / "short.safetensors", "abc");
  EXPECT_ERROR(FormatError, SafetensorsFile::open(dir_ / "short.safetensors"), "short.safetensors", "3 bytes");
  write_bytes(dir_ / "zero.safetensors", "");
  EXPECT_ERROR(FormatError, SafetensorsFile::open(dir_ / "zero.safetensors"), "zero.safetensors", "0 bytes");
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  write_bytes(dir_ / "past_end.safetensors", u64_le(100) + "{}");
  EXPECT_ERROR(FormatError, SafetensorsFile::open(dir_ / "past_end.safetensors"), "past_end.safetensors",
               "header length 100", "past the end");
}

TEST_F(SafetensorsTest, HeaderLengthAbsurd) {
  write_bytes(dir_ / "huge.safetensors", u64_le(uint64_t{1} << 62) + "{}");
  EXPECT_ERROR(FormatError, SafetensorsFile::open(dir_ / "huge.safetensors"), "huge.safetensors", "exceeds");
  write_bytes(dir_ / "max.safetensors", u64_le(~uint64_t{0}) + "{}");
  EXPECT_ERROR(FormatError, SafetensorsFile::open(dir_ / "max.safetensors"), "max.safetensors");
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  expect_bad_file("not_json.safetensors", R"({"a": {"dtype": )", "", {"invalid JSON"});
  expect_bad_file("nul.safetensors", std::string("{\0}", 3), "", {"invalid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotObject) {
  expect_bad_file("array.safetensors", "[1, 2]", "", {"JSON object"});
  expect_bad_file("string.safetensors", R"("hello")", "", {"JSON object"});
}

TEST_F(SafetensorsTest, EntryNotObject) {
  expect_bad_file("entry_number.safetensors", R"({"odd.tensor": 3})", "", {"'odd.tensor'", "object"});
  expect_bad_file("entry_array.safetensors", R"({"odd.tensor": [1]})", "", {"'odd.tensor'", "object"});
}

TEST_F(SafetensorsTest, EntryMissingField) {
  expect_bad_file("no_dtype.safetensors", R"({"w.x": {"shape": [1], "data_offsets": [0, 4]}})", "abcd",
                  {"'w.x'", "'dtype'"});
  expect_bad_file("no_shape.safetensors", R"({"w.x": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd",
                  {"'w.x'", "'shape'"});
  expect_bad_file("no_offsets.safetensors", R"({"w.x": {"dtype": "F32", "shape": [1]}})", "abcd",
                  {"'w.x'", "'data_offsets'"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_bad_file("dtype.safetensors", R"({"w.q": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 4]}})", "abcd",
                  {"'w.q'", "unknown dtype 'Q4_K'", "F32"});
  expect_bad_file("dtype_num.safetensors", R"({"w.q": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "abcd",
                  {"'w.q'", "dtype must be a string"});
}

TEST_F(SafetensorsTest, NegativeDim) {
  expect_bad_file("neg.safetensors", R"({"w.neg": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
                  std::string(8, '\0'), {"'w.neg'", "shape[0] is -2", "non-negative"});
}

TEST_F(SafetensorsTest, NonIntegerDim) {
  expect_bad_file("float_dim.safetensors", R"({"w.f": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})",
                  std::string(8, '\0'), {"'w.f'", "shape[0]"});
  expect_bad_file("str_dim.safetensors", R"({"w.s": {"dtype": "F32", "shape": [1, "2"], "data_offsets": [0, 8]}})",
                  std::string(8, '\0'), {"'w.s'", "shape[1]"});
  expect_bad_file("obj_shape.safetensors", R"({"w.o": {"dtype": "F32", "shape": {"a": 1}, "data_offsets": [0, 8]}})",
                  std::string(8, '\0'), {"'w.o'", "shape must be an array"});
  expect_bad_file("big_dim.safetensors",
                  R"({"w.b": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 8]}})",
                  std::string(8, '\0'), {"'w.b'", "shape[0]"});
}

TEST_F(SafetensorsTest, DataOffsetsNotTwoInts) {
  const std::string data(8, '\0');
  for (const std::string offsets : {"[0]", "[0, 4, 8]", R"(["0", 8])", "[-1, 7]", "[0.5, 8]", R"("0,8")", "{}"}) {
    SCOPED_TRACE(offsets);
    expect_bad_file("offsets.safetensors",
                    R"({"w.o": {"dtype": "U8", "shape": [8], "data_offsets": )" + offsets + "}}", data,
                    {"'w.o'", "data_offsets must be [begin, end]"});
  }
}

TEST_F(SafetensorsTest, DataOffsetsBeginAfterEnd) {
  expect_bad_file("reversed.safetensors", R"({"w.r": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}})",
                  std::string(8, '\0'), {"'w.r'", "[8, 0]", "begin after end"});
}

TEST_F(SafetensorsTest, DataOffsetsPastData) {
  expect_bad_file("past_data.safetensors", R"({"w.p": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                  std::string(8, '\0'), {"'w.p'", "[0, 16]", "holds 8 bytes"});
  expect_bad_file("far.safetensors",
                  R"({"w.p": {"dtype": "U8", "shape": [1],)"
                  R"( "data_offsets": [18446744073709551615, 18446744073709551615]}})",
                  std::string(8, '\0'), {"'w.p'", "past the data section"});
}

TEST_F(SafetensorsTest, SizeMismatch) {
  expect_bad_file("mismatch.safetensors", R"({"w.m": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                  std::string(8, '\0'), {"'w.m'", "span 8 bytes", "F32", "[3]", "needs 12 bytes"});
  expect_bad_file("mismatch16.safetensors", R"({"w.m": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 4]}})",
                  std::string(8, '\0'), {"'w.m'", "needs 8 bytes"});
}

TEST_F(SafetensorsTest, ShapeOverflow) {
  // 2^32 * 2^32 * 2^32 elements wraps a 64-bit count to 0 and would "match" an empty range if unchecked.
  expect_bad_file("overflow.safetensors",
                  R"({"w.big": {"dtype": "U8", "shape": [4294967296, 4294967296, 4294967296],)"
                  R"( "data_offsets": [0, 0]}})",
                  "", {"'w.big'", "overflows"});
  expect_bad_file("overflow_bytes.safetensors",
                  R"({"w.big": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", "",
                  {"'w.big'", "overflows"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_bad_file("overlap.safetensors",
                  R"({"first.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                  R"( "second.w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  std::string(12, '\0'), {"'first.w'", "'second.w'", "overlaps"});
  expect_bad_file("same_range.safetensors",
                  R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                  R"( "b": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}})",
                  std::string(4, '\0'), {"'a'", "'b'", "overlaps"});
}

TEST_F(SafetensorsTest, MetadataNotStrings) {
  expect_bad_file("meta_value.safetensors", R"({"__metadata__": {"format": "pt", "step": 3}})", "",
                  {"__metadata__", "'step'", "must be a string"});
  expect_bad_file("meta_type.safetensors", R"({"__metadata__": ["pt"]})", "", {"__metadata__", "object"});
}

TEST_F(SafetensorsTest, DeeplyNestedHeaderDoesNotOverflowTheStack) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  // JSON nesting is limited (kMaxJsonDepth) when the header is parsed, before its entries are looked at.
  expect_bad_file("deep.safetensors", deep, "", {"nested deeper than 512"});
  expect_bad_file("deep_meta.safetensors", R"({"__metadata__": {"k": )" + deep + "}}", "", {"nested deeper than 512"});
  expect_bad_file("deep_shape.safetensors",
                  R"({"w.d": {"dtype": "U8", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})",
                  "", {"nested deeper than 512"});
}

TEST_F(SafetensorsTest, RandomCorruptionOnlyThrowsErrors) {
  // Damaged copies of a valid file must open (and read) cleanly or throw swiftcpp::Error, nothing else.
  const fs::path good = dir_ / "good.safetensors";
  save_safetensors(good,
                   {{"a.weight", at::arange(12, at::TensorOptions().dtype(at::kFloat)).reshape({3, 4})},
                    {"b.bias", at::ones({5}, at::TensorOptions().dtype(at::kBFloat16))},
                    {"c.mask", at::ones({3}, at::TensorOptions().dtype(at::kBool))}},
                   {{"format", "pt"}});
  const std::string original = read_bytes(good);
  uint64_t header_len = 0;
  std::memcpy(&header_len, original.data(), 8);
  std::mt19937 rng(1234);
  const fs::path path = dir_ / "damaged.safetensors";
  for (int round = 0; round < 2000; ++round) {
    std::string bytes = original;
    switch (round % 4) {
      case 0:  // any byte of the length field or header
        bytes[rng() % (8 + header_len)] = static_cast<char>(rng());
        break;
      case 1:  // a header byte swapped for a JSON-significant character
        bytes[8 + rng() % header_len] = "0123456789-[]{}\",:. e"[rng() % 21];
        break;
      case 2:  // truncated anywhere
        bytes.resize(rng() % bytes.size());
        break;
      default:  // the length field off by a little
        bytes[0] = static_cast<char>(bytes[0] + static_cast<int>(rng() % 17) - 8);
        break;
    }
    write_bytes(path, bytes);
    try {
      const auto file = SafetensorsFile::open(path);
      for (const auto& t : file->tensors()) file->tensor(t.name).sum();
    } catch (const Error&) {
    } catch (const std::exception& e) {
      FAIL() << "round " << round << ": unexpected exception: " << e.what();
    }
  }
}

TEST_F(SafetensorsTest, BoolBytesOtherThanZeroOrOne) {
  const fs::path path = write_raw(dir_ / "bool.safetensors",
                                  R"({"mask.b": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}})",
                                  std::string("\x01\x00\x02", 3));
  const auto file = SafetensorsFile::open(path);
  EXPECT_ERROR(FormatError, file->tensor("mask.b"), "bool.safetensors", "'mask.b'", "byte 2");
}

TEST_F(SafetensorsTest, MissingTensor) {
  const fs::path path = dir_ / "present.safetensors";
  save_safetensors(path, {{"present", at::ones({2})}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_FALSE(file->contains("absent.weight"));
  EXPECT_ERROR(FormatError, file->info("absent.weight"), "present.safetensors", "'absent.weight'");
  EXPECT_ERROR(FormatError, file->tensor("absent.weight"), "present.safetensors", "'absent.weight'");
  const Checkpoint ckpt = Checkpoint::open(path);
  EXPECT_ERROR(FormatError, ckpt.tensor("absent.weight"), "present.safetensors", "'absent.weight'");
  EXPECT_ERROR(FormatError, ckpt.file_of("absent.weight"), "present.safetensors", "'absent.weight'");
}

TEST_F(SafetensorsTest, UnreadablePaths) {
  EXPECT_ERROR(IoError, SafetensorsFile::open(dir_ / "nowhere.safetensors"), "nowhere.safetensors");
  EXPECT_ERROR(IoError, SafetensorsFile::open(dir_), dir_.string(), "not a regular file");
  EXPECT_ERROR(IoError, Checkpoint::open(dir_ / "nowhere"), "nowhere", "does not exist");
  EXPECT_ERROR(IoError, Checkpoint::open(dir_), dir_.string(), "model.safetensors");
}

// ---------------------------------------------------------------------------------------------------------
// Atomic writes

TEST_F(SafetensorsTest, FailedWriteLeavesExistingFileUntouched) {
  const fs::path path = dir_ / "keep.safetensors";
  write_bytes(path, "original content");
  const at::Tensor t = at::ones({2});
  EXPECT_ERROR(FormatError, save_safetensors(path, {{"dup.w", t}, {"other", t}, {"dup.w", t}}), "keep.safetensors",
               "duplicate", "'dup.w'");
  const at::Tensor complex = at::ones({2}, at::TensorOptions().dtype(at::kComplexFloat));
  EXPECT_ERROR(FormatError, save_safetensors(path, {{"c.w", complex}}),
               "keep.safetensors", "'c.w'", "ComplexFloat");
  EXPECT_ERROR(FormatError, save_safetensors(path, {{"__metadata__", t}}), "keep.safetensors", "reserved");
  EXPECT_ERROR(FormatError, save_safetensors(path, {{"u.w", at::Tensor()}}), "keep.safetensors", "'u.w'", "undefined");
  EXPECT_ERROR(FormatError, save_safetensors(path, {{"ok", t}}, {{"bad", "\xff\xfe"}}), "keep.safetensors", "UTF-8");
  EXPECT_EQ(read_bytes(path), "original content");
  EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"keep.safetensors"});

  save_safetensors(path, {{"ok", t}});  // a successful write replaces it, again leaving no temporary file
  EXPECT_TRUE(at::equal(SafetensorsFile::open(path)->tensor("ok"), t));
  EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"keep.safetensors"});
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoints

class ShardedCheckpointTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    a_ = at::arange(6, at::TensorOptions().dtype(at::kFloat)).reshape({2, 3});
    b_ = at::tensor({1, 2, 3}, at::TensorOptions().dtype(at::kLong));
    c_ = at::ones({4}, at::TensorOptions().dtype(at::kBFloat16));
    save_safetensors(dir_ / "model-00001-of-00002.safetensors", {{"model.a", a_}, {"model.b", b_}});
    save_safetensors(dir_ / "model-00002-of-00002.safetensors", {{"lm_head.weight", c_}});
  }
  void write_index(const std::string& json) { write_bytes(dir_ / "model.safetensors.index.json", json); }

  at::Tensor a_, b_, c_;
};

TEST_F(ShardedCheckpointTest, ReadsTwoShards) {
  write_index(R"({"metadata": {"total_size": 68}, "weight_map": {
      "model.a": "model-00001-of-00002.safetensors", "model.b": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  for (const fs::path& where : {dir_, dir_ / "model.safetensors.index.json"}) {
    SCOPED_TRACE(where.string());
    const Checkpoint ckpt = Checkpoint::open(where);
    EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"lm_head.weight", "model.a", "model.b"}));
    EXPECT_TRUE(ckpt.contains("model.b"));
    EXPECT_FALSE(ckpt.contains("model.c"));
    EXPECT_EQ(ckpt.file_of("model.a"), dir_ / "model-00001-of-00002.safetensors");
    EXPECT_EQ(ckpt.file_of("lm_head.weight"), dir_ / "model-00002-of-00002.safetensors");
    EXPECT_EQ(ckpt.info("lm_head.weight").dtype, at::kBFloat16);
    EXPECT_TRUE(at::equal(ckpt.tensor("model.a"), a_));
    EXPECT_TRUE(at::equal(ckpt.tensor("model.b"), b_));
    EXPECT_TRUE(at::equal(ckpt.tensor("lm_head.weight"), c_));
    EXPECT_ERROR(FormatError, ckpt.info("model.c"), "'model.c'");
  }
}

TEST_F(ShardedCheckpointTest, SingleFileFolder) {
  save_safetensors(dir_ / "model.safetensors", {{"only", a_}});
  const Checkpoint ckpt = Checkpoint::open(dir_);  // a single model.safetensors wins over the shards
  EXPECT_EQ(ckpt.names(), std::vector<std::string>{"only"});
  EXPECT_EQ(ckpt.file_of("only"), dir_ / "model.safetensors");
  EXPECT_TRUE(at::equal(ckpt.tensor("only"), a_));
}

TEST_F(ShardedCheckpointTest, IndexNotJson) {
  write_index("{\"weight_map\": ");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "invalid JSON");
  write_index("[]");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "object");
}

TEST_F(ShardedCheckpointTest, MissingWeightMap) {
  write_index(R"({"metadata": {}})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "weight_map");
}

TEST_F(ShardedCheckpointTest, BadWeightMap) {
  write_index(R"({"weight_map": ["model.a"]})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "weight_map");
  write_index(R"({"weight_map": {"model.a": 1}})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "'model.a'", "shard file name");
  write_index(R"({"weight_map": {"model.a": "../model-00001-of-00002.safetensors"}})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "'model.a'", "inside");
  write_index(R"({"weight_map": {"model.a": "/etc/passwd"}})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "'model.a'", "inside");
}

TEST_F(ShardedCheckpointTest, ShardMissing) {
  write_index(R"({"weight_map": {"model.a": "model-00001-of-00002.safetensors",
                                  "model.z": "model-00003-of-00002.safetensors"}})");
  EXPECT_ERROR(IoError, Checkpoint::open(dir_), "model.safetensors.index.json", "model-00003-of-00002.safetensors",
               "'model.z'", "does not exist");
}

TEST_F(ShardedCheckpointTest, TensorAbsentFromShard) {
  write_index(R"({"weight_map": {"model.a": "model-00001-of-00002.safetensors",
                                  "lm_head.weight": "model-00001-of-00002.safetensors"}})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model.safetensors.index.json", "'lm_head.weight'",
               "model-00001-of-00002.safetensors", "does not hold it");
}

TEST_F(ShardedCheckpointTest, MalformedShard) {
  write_bytes(dir_ / "model-00002-of-00002.safetensors", "xy");
  write_index(R"({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_ERROR(FormatError, Checkpoint::open(dir_), "model-00002-of-00002.safetensors");
}

// ---------------------------------------------------------------------------------------------------------
// The bundled stories260K checkpoint (written by the reference Python implementation).

TEST(SafetensorsRealFile, Stories260K) {
  const fs::path dir = fs::path(SWIFTCPP_SHARED_DIR) / "assets" / "models" / "stories260K";
  if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << "shared assets not found at " << dir;
  const Checkpoint ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.contains("model.embed_tokens.weight"));
  const TensorInfo& info = ckpt.info("model.embed_tokens.weight");
  EXPECT_EQ(info.dtype, at::kFloat);
  EXPECT_EQ(info.shape, (std::vector<int64_t>{512, 64}));
  const at::Tensor embed = ckpt.tensor("model.embed_tokens.weight");
  EXPECT_EQ(embed.sizes(), (std::vector<int64_t>{512, 64}));
  EXPECT_TRUE(at::isfinite(embed).all().item<bool>());
  EXPECT_GT(embed.abs().sum().item<double>(), 0.0);
  for (const auto& name : ckpt.names()) EXPECT_NO_THROW(ckpt.tensor(name)) << name;
}

}  // namespace
}  // namespace swiftcpp
