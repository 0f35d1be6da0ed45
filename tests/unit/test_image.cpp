// Image decoding and CLIP preprocessing (lib/vision): decoded bytes and pixel_values of five real images against
// Pillow 9.4 / transformers 4.40.2 (../shared/assets/reference/llava/clip_preprocess.*), hand-computed resampling
// and cropping cases, crafted PNG and JPEG variants, and the refusals (other formats, truncation, bombs, bad
// configs).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

// jpeglib.h needs FILE and size_t declared before it.
#include <cstdio>

#include <jpeglib.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "tests/test_util.h"
#include "vision/image.h"
#include "vision/image_processor.h"
#include "vision/processor.h"

namespace swiftcpp::vision {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

const char* const kImages[] = {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png", "astronaut_224.png"};
const int kSizes[] = {224, 336, 56};

fs::path images_dir() { return test::assets() / "images"; }
fs::path reference_dir() { return test::assets() / "reference" / "llava"; }

// ---------------------------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4), for comparing decoded bytes with the reference hashes.

std::string sha256_hex(const uint8_t* data, size_t size) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  std::vector<uint8_t> message(data, data + size);
  message.push_back(0x80);
  while (message.size() % 64 != 56) message.push_back(0);
  const uint64_t bits = static_cast<uint64_t>(size) * 8;
  for (int i = 7; i >= 0; --i) message.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  for (size_t block = 0; block < message.size(); block += 64) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t) {
      const uint8_t* p = &message[block + 4 * t];
      w[t] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    }
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
  std::string hex;
  for (uint32_t word : h) hex += fmt::format("{:08x}", word);
  return hex;
}

std::string sha256_hex(const std::vector<uint8_t>& bytes) { return sha256_hex(bytes.data(), bytes.size()); }

TEST(ImageSha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(nullptr, 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string abc = "abc";
  EXPECT_EQ(sha256_hex(reinterpret_cast<const uint8_t*>(abc.data()), abc.size()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(reinterpret_cast<const uint8_t*>(two_blocks.data()), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// ---------------------------------------------------------------------------------------------------------------
// Crafted files.

std::vector<uint8_t> read_bytes(const fs::path& path) {
  const std::string text = read_text_file(path);
  return std::vector<uint8_t>(text.begin(), text.end());
}

fs::path write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

Image decode(const std::vector<uint8_t>& bytes, const std::string& origin = "test.img",
             int64_t max_pixels = kMaxImagePixels) {
  return decode_image(bytes.data(), bytes.size(), origin, max_pixels);
}

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void png_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& body) {
  put_u32(out, static_cast<uint32_t>(body.size()));
  std::vector<uint8_t> typed(type, type + 4);
  typed.insert(typed.end(), body.begin(), body.end());
  out.insert(out.end(), typed.begin(), typed.end());
  put_u32(out, crc32(typed.data(), typed.size()));
}

// A zlib stream of stored (uncompressed) deflate blocks.
std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0x78, 0x01};
  size_t at = 0;
  do {
    const size_t n = std::min<size_t>(65535, data.size() - at);
    out.push_back(at + n == data.size() ? 1 : 0);
    out.push_back(static_cast<uint8_t>(n & 0xff));
    out.push_back(static_cast<uint8_t>(n >> 8));
    out.push_back(static_cast<uint8_t>(~n & 0xff));
    out.push_back(static_cast<uint8_t>((~n >> 8) & 0xff));
    out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(at),
               data.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < data.size());
  uint32_t a = 1, b = 0;
  for (uint8_t byte : data) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  put_u32(out, (b << 16) | a);
  return out;
}

std::vector<uint8_t> ihdr(uint32_t width, uint32_t height, int depth, int color_type, int interlace = 0) {
  std::vector<uint8_t> body;
  put_u32(body, width);
  put_u32(body, height);
  body.insert(body.end(),
              {static_cast<uint8_t>(depth), static_cast<uint8_t>(color_type), 0, 0, static_cast<uint8_t>(interlace)});
  return body;
}

const std::vector<uint8_t> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

// A non-interlaced PNG: `rows` are the packed scanlines (without filter bytes); `extra` chunks (PLTE, tRNS) go
// before the image data.
std::vector<uint8_t> make_png(uint32_t width, int depth, int color_type, const std::vector<std::vector<uint8_t>>& rows,
                              const std::vector<std::pair<const char*, std::vector<uint8_t>>>& extra = {}) {
  std::vector<uint8_t> out = kPngSignature;
  png_chunk(out, "IHDR", ihdr(width, static_cast<uint32_t>(rows.size()), depth, color_type));
  for (const auto& [type, body] : extra) png_chunk(out, type, body);
  std::vector<uint8_t> raw;
  for (const auto& row : rows) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), row.begin(), row.end());
  }
  png_chunk(out, "IDAT", zlib_stored(raw));
  png_chunk(out, "IEND", {});
  return out;
}

// An Adam7-interlaced 8-bit RGB PNG of `image`.
std::vector<uint8_t> make_interlaced_rgb_png(const Image& image) {
  std::vector<uint8_t> out = kPngSignature;
  png_chunk(out, "IHDR", ihdr(static_cast<uint32_t>(image.width), static_cast<uint32_t>(image.height), 8, 2, 1));
  const int passes[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4},
                            {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
  std::vector<uint8_t> raw;
  for (const auto& p : passes) {
    const int64_t x0 = p[0], y0 = p[1], dx = p[2], dy = p[3];
    if (x0 >= image.width || y0 >= image.height) continue;  // an empty pass has no scanlines
    for (int64_t y = y0; y < image.height; y += dy) {
      raw.push_back(0);
      for (int64_t x = x0; x < image.width; x += dx) {
        for (int c = 0; c < 3; ++c) raw.push_back(image.pixels[static_cast<size_t>((y * image.width + x) * 3 + c)]);
      }
    }
  }
  png_chunk(out, "IDAT", zlib_stored(raw));
  png_chunk(out, "IEND", {});
  return out;
}

// A quality-100 JPEG of `samples` (height x width x components, libjpeg colour space `space`): baseline, or
// progressive with the scan script `scans`.
std::vector<uint8_t> make_jpeg(int width, int height, int components, J_COLOR_SPACE space,
                               const std::vector<uint8_t>& samples, const std::vector<jpeg_scan_info>& scans = {}) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = components;
  cinfo.in_color_space = space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 100, TRUE);
  if (!scans.empty()) {  // a progressive scan script
    cinfo.scan_info = scans.data();
    cinfo.num_scans = static_cast<int>(scans.size());
  }
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(samples.data()) + static_cast<size_t>(cinfo.next_scanline) * width * components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return out;
}

Image rgb_image(int64_t height, int64_t width, std::vector<uint8_t> pixels) {
  Image image;
  image.height = height;
  image.width = width;
  image.pixels = std::move(pixels);
  return image;
}

// The reference data: processor configs, per-image facts and hashes (clip_preprocess.json).
JsonObject reference_json() { return JsonObject::load(reference_dir() / "clip_preprocess.json"); }

// The processor of size `size` as the reference ran it (processor_configs[size], a to_dict() of it).
ImageProcessorConfig reference_config(const Json& root, int size) {
  return parse_image_processor_config(
      JsonObject(root.at("processor_configs").at(std::to_string(size)), fmt::format("processor_configs[{}]", size)));
}

// ---------------------------------------------------------------------------------------------------------------
// Decoding

TEST(ImageDecode, MatchesPillowOnRealImages) {
  SWIFTCPP_REQUIRE_SHARED(reference_dir() / "clip_preprocess.json");
  const Json root = reference_json().raw();
  for (const char* name : kImages) {
    SCOPED_TRACE(name);
    const Json& facts = root.at("images").at(name);
    const Image image = read_image(images_dir() / name);
    EXPECT_EQ(image.height, facts.at("height").get<int64_t>());
    EXPECT_EQ(image.width, facts.at("width").get<int64_t>());
    ASSERT_EQ(image.pixels.size(), static_cast<size_t>(image.height * image.width * 3));
    EXPECT_EQ(sha256_hex(image.pixels), facts.at("decoded_rgb").at("sha256").get<std::string>());
    // From memory, the same bytes.
    const std::vector<uint8_t> bytes = read_bytes(images_dir() / name);
    EXPECT_EQ(decode(bytes, name).pixels, image.pixels);
  }
}

TEST(ImageDecode, ThreadsDecodeAtOnce) {
  SWIFTCPP_REQUIRE_SHARED(reference_dir() / "clip_preprocess.json");
  const Json root = reference_json().raw();
  std::vector<std::vector<uint8_t>> files;
  std::vector<std::string> expected;
  for (const char* name : kImages) {
    files.push_back(read_bytes(images_dir() / name));
    expected.push_back(root.at("images").at(name).at("decoded_rgb").at("sha256").get<std::string>());
  }
  std::vector<std::string> got(4 * files.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < files.size(); ++i) {
        const size_t j = (i + t) % files.size();
        got[t * files.size() + j] = sha256_hex(decode(files[j]).pixels);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i % files.size()]) << kImages[i % files.size()];
}

TEST(ImageDecode, RefusesOtherFormatsByContent) {
  const fs::path dir = test::temp_dir("image_formats");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"GIF", std::string("GIF89a\x01\x00\x01\x00\x80\x00\x00", 13)},
      {"GIF", std::string("GIF87a\x01\x00\x01\x00\x00\x00\x00", 13)},
      {"WebP", std::string("RIFF\x24\x00\x00\x00WEBPVP8 ", 16)},
      {"BMP", std::string("BM\x3a\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00\x28\x00", 16)},
      {"TIFF", std::string("II*\x00\x08\x00\x00\x00", 8)},
      {"TIFF", std::string("MM\x00*\x00\x00\x00\x08", 8)},
  };
  for (const auto& [format, bytes] : cases) {
    // Named as if it were a JPEG: the content decides.
    const fs::path file = write_bytes(dir / "photo.jpg", bytes_of(bytes));
    expect_error<FormatError>([&] { read_image(file); }, {file.string(), format, "supported formats are JPEG and PNG"});
  }
  const fs::path text = write_bytes(dir / "notes.png", bytes_of("hello, world"));
  expect_error<FormatError>([&] { read_image(text); }, {text.string(), "68 65 6c 6c", "JPEG and PNG"});
  const fs::path empty = write_bytes(dir / "empty.png", {});
  expect_error<FormatError>([&] { read_image(empty); }, {empty.string(), "empty"});
}

TEST(ImageDecode, MissingFileOrFolderIsAnIoError) {
  const fs::path dir = test::temp_dir("image_missing");
  expect_error<IoError>([&] { read_image(dir / "absent.jpg"); }, {"absent.jpg"});
  expect_error<IoError>([&] { read_image(dir); }, {"folder"});
}

TEST(ImageDecode, TruncatedJpegIsAFormatError) {
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  for (const char* name : {"coffee.jpg", "rocket.jpg"}) {
    const std::vector<uint8_t> bytes = read_bytes(images_dir() / name);
    for (size_t cut : {size_t{3}, size_t{20}, size_t{200}, size_t{1000}, bytes.size() / 3, bytes.size() / 2,
                       bytes.size() - 100, bytes.size() - 2, bytes.size() - 1}) {
      SCOPED_TRACE(fmt::format("{} cut at {}", name, cut));
      const std::vector<uint8_t> head(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
      expect_error<FormatError>([&] { decode(head, "cut.jpg"); }, {"cut.jpg", "JPEG"});
    }
  }
}

TEST(ImageDecode, TruncatedPngIsAFormatError) {
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "camera.png");
  for (const char* name : {"camera.png", "chelsea_rgba.png"}) {
    const std::vector<uint8_t> bytes = read_bytes(images_dir() / name);
    for (size_t cut :
         {size_t{8}, size_t{20}, size_t{33}, size_t{100}, bytes.size() / 2, bytes.size() - 12, bytes.size() - 1}) {
      SCOPED_TRACE(fmt::format("{} cut at {}", name, cut));
      const std::vector<uint8_t> head(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
      expect_error<FormatError>([&] { decode(head, "cut.png"); }, {"cut.png", "PNG"});
    }
  }
}

TEST(ImageDecode, CorruptPngDataIsAFormatError) {
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "camera.png");
  std::vector<uint8_t> bytes = read_bytes(images_dir() / "camera.png");
  bytes[bytes.size() / 2] ^= 0xff;  // inside IDAT: the chunk CRC no longer matches
  expect_error<FormatError>([&] { decode(bytes, "flipped.png"); }, {"flipped.png", "PNG"});
}

TEST(ImageDecode, HugeDimensionsAreRefusedBeforeDecoding) {
  // A PNG header claiming 100000 x 100000 pixels followed by 4 bytes of image data: refused on the header alone.
  std::vector<uint8_t> png = kPngSignature;
  png_chunk(png, "IHDR", ihdr(100000, 100000, 8, 2));
  png_chunk(png, "IDAT", zlib_stored({0, 1, 2, 3}));
  png_chunk(png, "IEND", {});
  expect_error<FormatError>([&] { decode(png, "bomb.png"); }, {"bomb.png", "100000x100000", "limit of 178956970"});
  expect_error<FormatError>([&] { decode(png, "bomb.png", 1 << 20); }, {"limit of 1048576"});

  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  // coffee.jpg with its frame header rewritten to 60000 x 60000.
  std::vector<uint8_t> jpeg = read_bytes(images_dir() / "coffee.jpg");
  size_t sof = 2;
  while (sof + 9 < jpeg.size() && !(jpeg[sof] == 0xff && jpeg[sof + 1] == 0xc0)) {
    sof += 2 + ((size_t{jpeg[sof + 2]} << 8) | jpeg[sof + 3]);
  }
  ASSERT_LT(sof + 9, jpeg.size());
  EXPECT_EQ((jpeg[sof + 5] << 8) | jpeg[sof + 6], 400);  // height
  EXPECT_EQ((jpeg[sof + 7] << 8) | jpeg[sof + 8], 600);  // width
  std::vector<uint8_t> big = jpeg;
  big[sof + 5] = big[sof + 7] = 60000 >> 8;
  big[sof + 6] = big[sof + 8] = 60000 & 0xff;
  expect_error<FormatError>([&] { decode(big, "bomb.jpg"); }, {"bomb.jpg", "60000x60000", "limit"});
  // The limit is inclusive.
  EXPECT_EQ(decode(jpeg, "coffee.jpg", 600 * 400).width, 600);
  expect_error<FormatError>([&] { decode(jpeg, "coffee.jpg", 600 * 400 - 1); }, {"600x400", "limit of 239999"});
  expect_error<ConfigError>([&] { decode(jpeg, "coffee.jpg", 0); }, {"max_pixels"});
}

// open_image reads the header alone: the size it gives is the decoded image's, the refusals that need no pixel are
// read_image's, and an image whose data is damaged after a sound header opens (and fails only when decoded).
TEST(ImageDecode, OpeningReadsTheSizeFromTheHeaderWithoutDecoding) {
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  for (const char* name : {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png", "astronaut_224.png"}) {
    const EncodedImage opened = open_image(images_dir() / name);
    const Image decoded = read_image(images_dir() / name);
    EXPECT_EQ(opened.height, decoded.height) << name;
    EXPECT_EQ(opened.width, decoded.width) << name;
    EXPECT_EQ(decode_image(opened).pixels, decoded.pixels) << name;
  }
  const fs::path dir = test::temp_dir("image_open");
  std::vector<uint8_t> png = kPngSignature;
  png_chunk(png, "IHDR", ihdr(100000, 100000, 8, 2));
  png_chunk(png, "IDAT", zlib_stored({0, 1, 2, 3}));
  png_chunk(png, "IEND", {});
  const fs::path bomb = write_bytes(dir / "bomb.png", png);
  expect_error<FormatError>([&] { open_image(bomb); }, {"bomb.png", "100000x100000", "limit"});
  expect_error<FormatError>([&] { open_image(write_bytes(dir / "x.gif", {'G', 'I', 'F', '8', '9', 'a', 0, 0})); },
                            {"x.gif", "GIF"});
  expect_error<IoError>([&] { open_image(dir / "absent.png"); }, {"absent.png"});
  // camera.png cut in the middle of its image data: the header is whole, the pixels are not.
  const std::vector<uint8_t> bytes = read_bytes(images_dir() / "camera.png");
  const fs::path cut = write_bytes(dir / "cut.png", std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  const EncodedImage opened = open_image(cut);
  EXPECT_EQ(opened.height, 512);
  EXPECT_EQ(opened.width, 512);
  expect_error<FormatError>([&] { decode_image(opened); }, {"cut.png", "PNG"});
  expect_error<FormatError>([&] { open_image(images_dir() / "coffee.jpg", 600 * 400 - 1); }, {"coffee.jpg", "limit"});
}

TEST(ImageDecode, PngPaletteIgnoresTransparency) {
  // 2-bit palette, 3 entries, tRNS making entry 1 transparent: convert("RGB") keeps the palette colours.
  const std::vector<uint8_t> plte = {10, 20, 30, 200, 100, 50, 7, 8, 9};
  const std::vector<uint8_t> trns = {255, 0};
  // Indices 0 1 2 1 0 (2 bits each, packed from the high bits): 00 01 10 01 | 00 000000.
  const std::vector<uint8_t> png = make_png(5, 2, 3, {{0x19, 0x00}}, {{"PLTE", plte}, {"tRNS", trns}});
  const Image image = decode(png);
  EXPECT_EQ(image.height, 1);
  EXPECT_EQ(image.width, 5);
  EXPECT_EQ(image.pixels, (std::vector<uint8_t>{10, 20, 30, 200, 100, 50, 7, 8, 9, 200, 100, 50, 10, 20, 30}));

  // Index 3 with only 3 entries.
  const std::vector<uint8_t> bad = make_png(5, 2, 3, {{0x1b, 0x00}}, {{"PLTE", plte}});
  expect_error<FormatError>([&] { decode(bad, "bad_palette.png"); },
                            {"bad_palette.png", "palette index 3", "3 entries"});
}

TEST(ImageDecode, PngGrayDepthsAreScaledAndCopied) {
  // 1-bit: 0 -> 0, 1 -> 255. Pixels 1 0 1 1.
  EXPECT_EQ(decode(make_png(4, 1, 0, {{0xb0}})).pixels,
            (std::vector<uint8_t>{255, 255, 255, 0, 0, 0, 255, 255, 255, 255, 255, 255}));
  // 2-bit: v * 85. Pixels 0 1 2 3.
  EXPECT_EQ(decode(make_png(4, 2, 0, {{0x1b}})).pixels,
            (std::vector<uint8_t>{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
  // 4-bit: v * 17. Pixels 3 12.
  EXPECT_EQ(decode(make_png(2, 4, 0, {{0x3c}})).pixels, (std::vector<uint8_t>{51, 51, 51, 204, 204, 204}));
  // 8-bit with a tRNS colour: no effect on the pixels.
  const std::vector<uint8_t> trns = {0, 77};
  EXPECT_EQ(decode(make_png(2, 8, 0, {{77, 200}}, {{"tRNS", trns}})).pixels,
            (std::vector<uint8_t>{77, 77, 77, 200, 200, 200}));
  // Gray + alpha, 8 and 16-bit: alpha dropped, gray (its high byte) copied.
  EXPECT_EQ(decode(make_png(2, 8, 4, {{90, 0, 180, 128}})).pixels, (std::vector<uint8_t>{90, 90, 90, 180, 180, 180}));
  EXPECT_EQ(decode(make_png(1, 16, 4, {{0x12, 0xff, 0x00, 0x01}})).pixels, (std::vector<uint8_t>{0x12, 0x12, 0x12}));
  // 16-bit gray is refused.
  const std::vector<uint8_t> deep = make_png(1, 16, 0, {{0x12, 0x34}});
  expect_error<FormatError>([&] { decode(deep, "deep.png"); }, {"deep.png", "16-bit grayscale"});
}

TEST(ImageDecode, Png16BitColourKeepsTheHighByte) {
  EXPECT_EQ(decode(make_png(1, 16, 2, {{0x12, 0x34, 0xab, 0xcd, 0x00, 0xff}})).pixels,
            (std::vector<uint8_t>{0x12, 0xab, 0x00}));
  // RGBA 16-bit: alpha 0 still keeps the colour.
  EXPECT_EQ(decode(make_png(1, 16, 6, {{0xfe, 0x01, 0x80, 0x80, 0x01, 0xfe, 0x00, 0x00}})).pixels,
            (std::vector<uint8_t>{0xfe, 0x80, 0x01}));
  // RGBA 8-bit: the colour under alpha 0 is kept, no compositing.
  EXPECT_EQ(decode(make_png(2, 8, 6, {{1, 2, 3, 0, 250, 251, 252, 7}})).pixels,
            (std::vector<uint8_t>{1, 2, 3, 250, 251, 252}));
}

TEST(ImageDecode, InterlacedPngEqualsItsPixels) {
  // 11 x 9 covers every Adam7 pass, partial ones included.
  Image image = rgb_image(9, 11, std::vector<uint8_t>(9 * 11 * 3));
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  const Image decoded = decode(make_interlaced_rgb_png(image));
  EXPECT_EQ(decoded.height, 9);
  EXPECT_EQ(decoded.width, 11);
  EXPECT_EQ(decoded.pixels, image.pixels);
}

TEST(ImageDecode, GrayscaleJpegIsCopiedToRgb) {
  const int width = 16, height = 8;
  std::vector<uint8_t> gray(width * height);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) gray[y * width + x] = static_cast<uint8_t>(40 + 10 * x + 3 * y);
  }
  const Image image = decode(make_jpeg(width, height, 1, JCS_GRAYSCALE, gray));
  ASSERT_EQ(image.height, height);
  ASSERT_EQ(image.width, width);
  for (int i = 0; i < width * height; ++i) {
    EXPECT_EQ(image.pixels[3 * i], image.pixels[3 * i + 1]) << i;
    EXPECT_EQ(image.pixels[3 * i], image.pixels[3 * i + 2]) << i;
    EXPECT_NEAR(image.pixels[3 * i], gray[i], 2) << i;  // quality 100: within 2 of the source
  }
}

TEST(ImageDecode, CmykJpegIsRefused) {
  const std::vector<uint8_t> cmyk(8 * 8 * 4, 100);
  expect_error<FormatError>([&] { decode(make_jpeg(8, 8, 4, JCS_CMYK, cmyk), "print.jpg"); }, {"print.jpg", "CMYK"});
}

TEST(ImageDecode, JpegWithTooManyScansIsRefused) {
  std::vector<uint8_t> samples(16 * 16 * 3);
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<uint8_t>(i * 7);
  // Progressive: one DC scan, then every AC coefficient of every component in its own scan, first at 2 bits of
  // precision less and, with `refine`, refined twice: 1 + 189 = 190 scans, or 1 + 3 * 189 = 568.
  auto script = [](bool refine) {
    std::vector<jpeg_scan_info> scans = {{3, {0, 1, 2, 0}, 0, 0, 0, 0}};
    for (int c = 0; c < 3; ++c) {
      for (int k = 1; k < 64; ++k) {
        scans.push_back({1, {c, 0, 0, 0}, k, k, 0, refine ? 2 : 0});
        if (refine) {
          scans.push_back({1, {c, 0, 0, 0}, k, k, 2, 1});
          scans.push_back({1, {c, 0, 0, 0}, k, k, 1, 0});
        }
      }
    }
    return scans;
  };
  const Image fine = decode(make_jpeg(16, 16, 3, JCS_RGB, samples, script(false)));
  EXPECT_EQ(fine.width, 16);
  EXPECT_EQ(fine.pixels, decode(make_jpeg(16, 16, 3, JCS_RGB, samples)).pixels);  // same quality, same pixels
  expect_error<FormatError>([&] { decode(make_jpeg(16, 16, 3, JCS_RGB, samples, script(true)), "scans.jpg"); },
                            {"scans.jpg", "more than 500 scans"});
}

// A progressive JPEG keeps every coefficient of the whole image until its last scan: a small file declaring 12000 x
// 12000 pixels (under the pixel limit; 4:2:0) would take 432 MB of coefficients and 432 MB of output. Refused by the
// decoder's memory budget before either is taken; a real progressive image decodes as before.
TEST(ImageDecode, ProgressiveJpegOverTheMemoryBudgetIsRefusedBeforeItsBuffers) {
  std::vector<uint8_t> samples(16 * 16 * 3);
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<uint8_t>(i * 5);
  std::vector<jpeg_scan_info> scans = {{3, {0, 1, 2, 0}, 0, 0, 0, 0}};
  for (int c = 0; c < 3; ++c) scans.push_back({1, {c, 0, 0, 0}, 1, 63, 0, 0});
  std::vector<uint8_t> jpeg = make_jpeg(16, 16, 3, JCS_RGB, samples, scans);
  EXPECT_EQ(decode(jpeg).width, 16);
  size_t sof = 2;
  while (sof + 9 < jpeg.size() && !(jpeg[sof] == 0xff && jpeg[sof + 1] == 0xc2)) {
    sof += 2 + ((size_t{jpeg[sof + 2]} << 8) | jpeg[sof + 3]);
  }
  ASSERT_LT(sof + 9, jpeg.size()) << "no SOF2 marker: not progressive";
  jpeg[sof + 5] = jpeg[sof + 7] = 12000 >> 8;
  jpeg[sof + 6] = jpeg[sof + 8] = 12000 & 0xff;
  expect_error<FormatError>([&] { decode(jpeg, "huge.jpg"); },
                            {"huge.jpg", "progressive", "12000x12000", "needs more than 384 MiB"});
}

// ---------------------------------------------------------------------------------------------------------------
// Processor

TEST(ImageProcessor, PixelValuesMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(reference_dir() / "clip_preprocess.safetensors");
  const Json root = reference_json().raw();
  const auto reference = SafetensorsFile::open(reference_dir() / "clip_preprocess.safetensors");
  for (const char* name : kImages) {
    const Image image = read_image(images_dir() / name);
    for (int size : kSizes) {
      SCOPED_TRACE(fmt::format("{} at {}", name, size));
      const ImageProcessorConfig config = reference_config(root, size);
      const Json& facts = root.at("images").at(name).at("pixel_values").at(std::to_string(size));
      const ImageSize resized = resize_output_size(image.height, image.width, config);
      EXPECT_EQ(resized.height, facts.at("resized_hw").at(0).get<int64_t>());
      EXPECT_EQ(resized.width, facts.at("resized_hw").at(1).get<int64_t>());
      const Image crop = prepare_image(image, config);
      EXPECT_EQ(sha256_hex(crop.pixels), facts.at("crop_u8_sha256").get<std::string>());

      // pixel_values: [3, s, s] float32; the same float32 operations in the same order, so bit-identical (the
      // 1e-6 bound only makes a failure print the size of the difference).
      const at::Tensor got = preprocess_image(image, config);
      const at::Tensor want = reference->tensor(facts.at("key").get<std::string>());
      ASSERT_EQ(got.sizes(), want.sizes());
      ASSERT_EQ(got.scalar_type(), at::kFloat);
      const double gap = (got - want).abs().max().item<double>();
      EXPECT_LE(gap, 1e-6);
      EXPECT_TRUE(at::equal(got, want)) << "largest difference " << gap;
    }
  }
}

TEST(ImageProcessor, AnImageAtTheTargetSizeIsNotResampled) {
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "astronaut_224.png");
  const Image image = read_image(images_dir() / "astronaut_224.png");
  ImageProcessorConfig config;  // class defaults: 224
  const ImageSize size = resize_output_size(image.height, image.width, config);
  EXPECT_EQ(size.height, 224);
  EXPECT_EQ(size.width, 224);
  EXPECT_EQ(prepare_image(image, config).pixels, image.pixels);
  EXPECT_EQ(resize_bicubic(image, 224, 224).pixels, image.pixels);
  // A bicubic round trip through another size does change it: the skip is what keeps the pixels.
  EXPECT_NE(resize_bicubic(resize_bicubic(image, 225, 224), 224, 224).pixels, image.pixels);
}

TEST(ImageProcessor, CenterCropOfWideImages) {
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  ImageProcessorConfig config;
  const std::vector<std::tuple<const char*, int64_t, int64_t>> cases = {{"coffee.jpg", 336, 56},
                                                                        {"rocket.jpg", 335, 55}};
  for (const auto& [name, width, left] : cases) {
    SCOPED_TRACE(name);
    const Image image = read_image(images_dir() / name);
    const ImageSize size = resize_output_size(image.height, image.width, config);
    EXPECT_EQ(size.height, 224);
    EXPECT_EQ(size.width, width);
    const Image resized = resize_bicubic(image, size.height, size.width);
    const Image crop = center_crop(resized, 224, 224);
    ASSERT_EQ(crop.pixels.size(), size_t{224 * 224 * 3});
    for (int64_t r = 0; r < 224; r += 37) {
      for (int64_t c = 0; c < 224; c += 29) {
        for (int k = 0; k < 3; ++k) {
          ASSERT_EQ(crop.pixels[static_cast<size_t>((r * 224 + c) * 3 + k)],
                    resized.pixels[static_cast<size_t>((r * width + c + left) * 3 + k)]);
        }
      }
    }
  }
}

TEST(ImageProcessor, CenterCropPadsWithZeros) {
  // 2 x 3 image, crop 4 x 4: top = (2 - 4) // 2 = -1, left = (3 - 4) // 2 = -1 (floor division).
  std::vector<uint8_t> pixels(2 * 3 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i + 1);
  const Image image = rgb_image(2, 3, pixels);
  const Image crop = center_crop(image, 4, 4);
  ASSERT_EQ(crop.height, 4);
  ASSERT_EQ(crop.width, 4);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      const int64_t sr = r - 1, sc = c - 1;
      const bool inside = sr >= 0 && sr < 2 && sc >= 0 && sc < 3;
      for (int k = 0; k < 3; ++k) {
        const uint8_t want = inside ? pixels[static_cast<size_t>((sr * 3 + sc) * 3 + k)] : 0;
        EXPECT_EQ(crop.pixels[static_cast<size_t>((r * 4 + c) * 3 + k)], want) << r << "," << c << "," << k;
      }
    }
  }
  // 5 x 5 image, crop 2 x 3: top = 3 // 2 = 1, left = 2 // 2 = 1.
  std::vector<uint8_t> big(5 * 5 * 3);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i);
  const Image small = center_crop(rgb_image(5, 5, big), 2, 3);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(small.pixels[static_cast<size_t>((r * 3 + c) * 3)],
                big[static_cast<size_t>(((r + 1) * 5 + c + 1) * 3)]);
    }
  }
}

TEST(ImageProcessor, ResamplingHandComputed) {
  // Bilinear 4 -> 2 (filterscale 2, support 2): output 0 weighs inputs 0..2 by 3/7, 3/7, 1/7 and output 1 inputs
  // 1..3 by 1/7, 3/7, 3/7, so [0, 70, 140, 210] -> [50, 160] and [255, 185, 115, 45] -> [205, 95] (exact
  // integers, which the round-to-nearest of the fixed-point sums keeps); a constant 255 stays 255.
  const Image row = rgb_image(1, 4, {0, 255, 255, 70, 185, 255, 140, 115, 255, 210, 45, 255});
  EXPECT_EQ(resize_image(row, 1, 2, Resample::kBilinear).pixels, (std::vector<uint8_t>{50, 205, 255, 160, 95, 255}));
  const Image column = rgb_image(4, 1, row.pixels);
  EXPECT_EQ(resize_image(column, 2, 1, Resample::kBilinear).pixels, (std::vector<uint8_t>{50, 205, 255, 160, 95, 255}));

  // Bicubic 2 -> 4 (a = -0.5, support 2): output 0 has center 0.25 and weights 0.8671875, -0.0703125 (normalized
  // 1.0882, -0.0882); output 1 center 0.75 and weights 0.8671875, 0.2265625 (0.7929, 0.2071); outputs 2 and 3
  // mirror them. [100, 200] -> [91.18, 120.71, 179.29, 208.82] -> [91, 121, 179, 209] (rounded to nearest);
  // [0, 255] -> [-22.5, 52.82, 202.18, 277.5] -> [0, 53, 202, 255] (clipped).
  const Image pair = rgb_image(1, 2, {100, 0, 255, 200, 255, 0});
  EXPECT_EQ(resize_bicubic(pair, 1, 4).pixels,
            (std::vector<uint8_t>{91, 0, 255, 121, 53, 202, 179, 202, 53, 209, 255, 0}));
}

TEST(ImageProcessor, ResizeOutputSizeTruncatesTheLongSide) {
  ImageProcessorConfig config;
  config.shortest_edge = 224;
  auto size = [&](int64_t h, int64_t w) {
    const ImageSize s = resize_output_size(h, w, config);
    return std::make_pair(s.height, s.width);
  };
  EXPECT_EQ(size(400, 600), std::make_pair(int64_t{224}, int64_t{336}));
  EXPECT_EQ(size(427, 640), std::make_pair(int64_t{224}, int64_t{335}));  // 335.74
  EXPECT_EQ(size(640, 427), std::make_pair(int64_t{335}, int64_t{224}));
  EXPECT_EQ(size(300, 300), std::make_pair(int64_t{224}, int64_t{224}));
  config.do_resize = false;
  EXPECT_EQ(size(427, 640), std::make_pair(int64_t{427}, int64_t{640}));
  config.do_resize = true;
  config.shortest_edge = 0;
  config.resize_height = 30;
  config.resize_width = 40;
  EXPECT_EQ(size(427, 640), std::make_pair(int64_t{30}, int64_t{40}));
}

TEST(ImageProcessor, ExtremeAspectRatioIsRefused) {
  const Image strip = rgb_image(1, 2000, std::vector<uint8_t>(2000 * 3, 9));
  ImageProcessorConfig config;
  config.shortest_edge = 336;
  // 336 x 672000 pixels after the resize.
  expect_error<FormatError>([&] { preprocess_image(strip, config, 1 << 20); }, {"1x2000", "336x672000", "limit"});
  config.crop_height = config.crop_width = 2048;
  config.do_resize = false;
  expect_error<FormatError>([&] { preprocess_image(strip, config, 1 << 20); }, {"2048x2048", "limit"});
}

TEST(ImageProcessor, PixelValuesWithoutRescaleOrNormalize) {
  const Image image = rgb_image(1, 2, {0, 128, 255, 10, 20, 30});
  ImageProcessorConfig config;
  config.do_resize = config.do_center_crop = false;
  config.do_rescale = config.do_normalize = false;
  const at::Tensor raw = preprocess_image(image, config);  // [3, 1, 2]
  ASSERT_EQ(raw.sizes(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_TRUE(at::equal(raw, at::tensor({0.f, 10.f, 128.f, 20.f, 255.f, 30.f}).view({3, 1, 2})));
  config.do_rescale = true;
  config.do_normalize = true;
  const at::Tensor values = preprocess_image(image, config);
  // Channel 0, pixel 1: float32(10 / 255) then (x - float32(mean)) / float32(std) in float32.
  const float x = static_cast<float>(10.0 * (1.0 / 255.0));
  const float want = (x - static_cast<float>(0.48145466)) / static_cast<float>(0.26862954);
  EXPECT_EQ(values[0][0][1].item<float>(), want);
}

TEST(ImageProcessor, LoadsTheTinyLlavaConfig) {
  SWIFTCPP_REQUIRE_SHARED(reference_dir() / "tiny-llava" / "preprocessor_config.json");
  const ImageProcessorConfig config = load_image_processor_config(reference_dir() / "tiny-llava");
  EXPECT_TRUE(config.do_resize);
  EXPECT_EQ(config.shortest_edge, 56);
  EXPECT_EQ(config.crop_height, 56);
  EXPECT_EQ(config.crop_width, 56);
  EXPECT_EQ(config.resample, Resample::kBicubic);
  EXPECT_EQ(config.rescale_factor, 1.0 / 255.0);
  EXPECT_EQ(config.image_mean[1], 0.4578275);
  EXPECT_EQ(config.image_std[2], 0.27577711);
  expect_error<IoError>([&] { load_image_processor_config(test::temp_dir("image_no_config")); },
                        {"preprocessor_config.json"});
}

TEST(ImageProcessor, ConfigForms) {
  auto parse = [](const std::string& text) {
    return parse_image_processor_config(JsonObject(parse_json(text, "pp.json"), "pp.json"));
  };
  const ImageProcessorConfig defaults = parse("{}");
  EXPECT_EQ(defaults.shortest_edge, 224);
  EXPECT_EQ(defaults.crop_height, 224);
  // Older CLIP configs write plain integers.
  const ImageProcessorConfig old =
      parse(R"({"size": 336, "crop_size": 336, "feature_extractor_type": "CLIPFeatureExtractor"})");
  EXPECT_EQ(old.shortest_edge, 336);
  EXPECT_EQ(old.crop_height, 336);
  EXPECT_EQ(old.crop_width, 336);
  const ImageProcessorConfig hw = parse(R"({"size": {"height": 20, "width": 30}, "crop_size": [10, 12], "resample": 2,
                                            "image_mean": 0.5, "processor_class": "LlavaProcessor"})");
  EXPECT_EQ(hw.shortest_edge, 0);
  EXPECT_EQ(hw.resize_height, 20);
  EXPECT_EQ(hw.resize_width, 30);
  EXPECT_EQ(hw.crop_height, 10);
  EXPECT_EQ(hw.crop_width, 12);
  EXPECT_EQ(hw.resample, Resample::kBilinear);
  EXPECT_EQ(hw.image_mean[2], 0.5);
}

TEST(ImageProcessor, ConfigErrorsNameTheFileAndKey) {
  auto parse = [](const std::string& text) {
    return parse_image_processor_config(JsonObject(parse_json(text, "pp.json"), "pp.json"));
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"crop_size": "224"})", {"pp.json", "crop_size", "string"}},
      {R"({"crop_size": {"height": 224}})", {"pp.json", "crop_size"}},
      {R"({"crop_size": {"height": 224, "width": 1.5}})", {"pp.json", "crop_size.width"}},
      {R"({"size": {"shortest_edge": 0}})", {"pp.json", "size.shortest_edge", "1..65536"}},
      {R"({"size": {"longest_edge": 300}})", {"pp.json", "'size'"}},
      {R"({"size": 100000})", {"pp.json", "size", "1..65536"}},
      {R"({"resample": 1})", {"pp.json", "resample", "lanczos", "not supported"}},
      {R"({"resample": 0})", {"pp.json", "resample", "nearest"}},
      {R"({"resample": "bicubic"})", {"pp.json", "resample", "integer"}},
      {R"({"do_resize": "yes"})", {"pp.json", "do_resize", "boolean"}},
      {R"({"image_mean": [0.5, 0.5]})", {"pp.json", "image_mean", "3"}},
      {R"({"image_std": [0.5, 0, 0.5]})", {"pp.json", "image_std", "[0.0001, 10000]"}},
      {R"({"image_std": [-0.2, 0.2, 0.2]})", {"pp.json", "image_std", "[0.0001, 10000]"}},
      {R"({"image_std": 1e-300})", {"pp.json", "image_std"}},
      {R"({"image_mean": [1e308, 0, 0]})", {"pp.json", "image_mean", "[-10000, 10000]"}},
      {R"({"rescale_factor": "1/255"})", {"pp.json", "rescale_factor"}},
      {R"({"rescale_factor": 0})", {"pp.json", "rescale_factor", "(0, 1]"}},
      {R"({"rescale_factor": -0.004})", {"pp.json", "rescale_factor", "(0, 1]"}},
      {R"({"rescale_factor": 1e308})", {"pp.json", "rescale_factor", "(0, 1]"}},
      {R"({"image_processor_type": "SiglipImageProcessor"})",
       {"pp.json", "SiglipImageProcessor", "CLIPImageProcessor"}},
      {R"({"image_processor_type": 3})", {"pp.json", "image_processor_type"}},
  };
  for (const auto& [text, needles] : cases) {
    SCOPED_TRACE(text);
    expect_error<ConfigError>([&] { parse(text); }, needles);
  }
}

// The tower embeds images of one size: a CLIP processor whose output is another size (a missing crop_size is
// CLIP's 224, a 1x1 crop, or no crop after a shortest-edge resize) is refused naming both files and keys, instead
// of failing at the first forward. A rescale factor the processor does not apply is not checked.
TEST(ImageProcessor, OutputSizeMustBeTheTowersImageSize) {
  const fs::path dir = test::temp_dir("clip_tower_size");
  write_file_atomic(dir / "config.json", R"({"vision_config": {"image_size": 56}})");
  const auto load = [&](const std::string& processor) {
    write_file_atomic(dir / "preprocessor_config.json", processor);
    return load_image_processor(dir, 16);
  };
  EXPECT_NO_THROW(load(R"({"crop_size": {"height": 56, "width": 56}, "size": {"shortest_edge": 56}})"));
  EXPECT_NO_THROW(load(R"({"do_center_crop": false, "size": {"height": 56, "width": 56}})"));
  EXPECT_NO_THROW(load(R"({"crop_size": 56, "do_rescale": false, "rescale_factor": 0})"));
  const std::string pp = (dir / "preprocessor_config.json").string(), cfg = (dir / "config.json").string();
  expect_error<ConfigError>([&] { load(R"({"size": {"shortest_edge": 56}})"); },
                            {pp, "'crop_size' 224x224", cfg, "vision_config.image_size' 56"});
  expect_error<ConfigError>([&] { load(R"({"crop_size": {"height": 1, "width": 1}})"); }, {pp, "1x1", cfg});
  expect_error<ConfigError>([&] { load(R"({"do_center_crop": false, "size": {"shortest_edge": 56}})"); },
                            {pp, "do_center_crop", "\"height\": 56", cfg});
  // Without a vision_config the tower's default (CLIPVisionConfig: 224) applies.
  write_file_atomic(dir / "config.json", R"({"model_type": "llava"})");
  EXPECT_NO_THROW(load(R"({"crop_size": 224})"));
}

TEST(ImageProcessor, MalformedImagesAreRefused) {
  Image bad = rgb_image(2, 2, std::vector<uint8_t>(11));
  ImageProcessorConfig config;
  expect_error<FormatError>([&] { preprocess_image(bad, config); }, {"2x2", "11 bytes"});
  expect_error<FormatError>([&] { resize_bicubic(bad, 4, 4); }, {"11 bytes"});
  expect_error<FormatError>([&] { preprocess_image(Image{}, config); }, {"empty"});
  expect_error<ConfigError>([&] { resize_bicubic(rgb_image(1, 1, {1, 2, 3}), 0, 4); }, {"0x4"});
  expect_error<ConfigError>([&] { center_crop(rgb_image(1, 1, {1, 2, 3}), 3, -1); }, {"3x-1"});
}

}  // namespace
}  // namespace swiftcpp::vision
