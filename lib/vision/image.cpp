#include "vision/image.h"

// jpeglib.h needs FILE and size_t declared before it.
#include <cstdio>
#include <cstring>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include <csetjmp>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace swiftcpp::vision {

namespace {

// libjpeg and libpng report errors by longjmp. Every libjpeg/libpng call that can fail runs inside one of the
// *_phase functions below: each calls setjmp first, holds only plain C data, keeps everything that must survive
// the jump in the job struct (reached through a pointer), and returns false after a jump. The C++ caller owns
// the job and every buffer, and releases them in ordinary destructors; no jump ever crosses a C++ frame that
// owns a resource.

// A progressive JPEG with thousands of tiny scans makes the decoder walk the whole coefficient buffer once per
// scan; encoders write about 10. More than this many scans is refused.
constexpr int kMaxJpegScans = 500;

// The most memory libjpeg may take for one image: a progressive (or multi-scan) JPEG keeps every DCT coefficient of
// the whole image (2 bytes each: 6 bytes a pixel at 4:4:4, 3 at 4:2:0) until its last scan, so a 1 MB file
// declaring 13376 x 13376 pixels asked for 1.7 GB. 384 MiB holds such a buffer for 67 million pixels at 4:4:4
// (134 million at 4:2:0); a baseline image of any size under the pixel limit needs a few rows only.
constexpr long kMaxJpegMemory = 384L << 20;

// The first bytes of `data` in hex ("89 50 4e 47"), for messages about unrecognised files.
std::string leading_bytes(const uint8_t* data, size_t size) {
  std::string out;
  for (size_t i = 0; i < size && i < 8; ++i) out += fmt::format("{}{:02x}", i == 0 ? "" : " ", data[i]);
  return out;
}

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t n, size_t at = 0) {
  return size >= at + n && std::memcmp(data + at, magic, n) == 0;
}

// The name of a recognisable image format other than JPEG and PNG, or nullptr.
const char* other_format(const uint8_t* d, size_t n) {
  if (starts_with(d, n, "GIF87a", 6) || starts_with(d, n, "GIF89a", 6)) return "GIF";
  if (starts_with(d, n, "RIFF", 4) && starts_with(d, n, "WEBP", 4, 8)) return "WebP";
  if (starts_with(d, n, "II*\0", 4) || starts_with(d, n, "MM\0*", 4)) return "TIFF";
  if (starts_with(d, n, "BM", 2) && n >= 14) return "BMP";
  if (starts_with(d, n, "ftyp", 4, 4)) {
    if (starts_with(d, n, "avif", 4, 8) || starts_with(d, n, "avis", 4, 8)) return "AVIF";
    if (starts_with(d, n, "heic", 4, 8) || starts_with(d, n, "heix", 4, 8) || starts_with(d, n, "mif1", 4, 8) ||
        starts_with(d, n, "msf1", 4, 8) || starts_with(d, n, "hevc", 4, 8)) {
      return "HEIF";
    }
  }
  if (starts_with(d, n, "\0\0\0\x0cjP  \r\n\x87\n", 12) || starts_with(d, n, "\xff\x4f\xff\x51", 4)) return "JPEG 2000";
  if (starts_with(d, n, "\xff\x0a", 2) || starts_with(d, n, "\0\0\0\x0cJXL \r\n\x87\n", 12)) return "JPEG XL";
  if (starts_with(d, n, "8BPS", 4)) return "Photoshop (PSD)";
  if (starts_with(d, n, "qoif", 4)) return "QOI";
  if (starts_with(d, n, "\0\0\1\0", 4)) return "ICO";
  if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7' &&
      (d[2] == ' ' || d[2] == '\n' || d[2] == '\r' || d[2] == '\t')) {
    return "PNM";
  }
  return nullptr;
}

// Refuses an empty image and one of more than `max_pixels` pixels, before anything the size of the image is
// allocated.
void check_dimensions(const std::string& origin, const char* format, uint64_t width, uint64_t height,
                      int64_t max_pixels) {
  if (width == 0 || height == 0)
    fail<FormatError>("{}: the {} header gives an empty image ({}x{})", origin, format, width, height);
  // Both are below 2^32, so the product fits.
  const uint64_t pixels = width * height;
  if (pixels > static_cast<uint64_t>(max_pixels)) {
    fail<FormatError>(
        "{}: the {} image is {}x{} = {} pixels, over the limit of {} pixels (refused before decoding, "
        "as a possible decompression bomb)",
        origin, format, width, height, pixels, max_pixels);
  }
}

// ----------------------------------------------------------------------------------------------------------------
// JPEG

struct JpegJob {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int scans;
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* job = static_cast<JpegJob*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, job->message);
  std::longjmp(job->jump, 1);
}

// Warnings (level -1) that mean lost or corrupt pixel data are errors; the harmless ones are ignored, as Pillow
// ignores them. Trace messages are ignored except Start Of Scan, which is counted. Nothing is printed.
void jpeg_message(j_common_ptr cinfo, int level) {
  const int code = cinfo->err->msg_code;
  if (level < 0) {
    if (code == JWRN_ADOBE_XFORM || code == JWRN_EXTRANEOUS_DATA || code == JWRN_JFIF_MAJOR || code == JWRN_BOGUS_ICC) {
      return;
    }
    jpeg_fail(cinfo);
  }
  if (code == JTRC_SOS) {
    auto* job = static_cast<JpegJob*>(cinfo->client_data);
    if (++job->scans > kMaxJpegScans) {
      std::snprintf(job->message, sizeof job->message, "more than %d scans", kMaxJpegScans);
      std::longjmp(job->jump, 1);
    }
  }
}

void jpeg_no_output(j_common_ptr) {}

// Creates the decompressor over `data` and reads the header. False (message in job) on error.
bool jpeg_header_phase(JpegJob* job, const uint8_t* data, size_t size) {
  if (setjmp(job->jump) != 0) return false;
  jpeg_create_decompress(&job->cinfo);
  // libjpeg-turbo has no backing store: an image that needs more than this fails with JERR_NO_BACKING_STORE before
  // the memory is taken.
  job->cinfo.mem->max_memory_to_use = kMaxJpegMemory;
  jpeg_mem_src(&job->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&job->cinfo, TRUE);
  return true;
}

// Starts decompression as RGB: the decoder's own buffers (a multi-scan image's whole coefficient arrays) are taken
// here, under kMaxJpegMemory. False (message in job) on error.
bool jpeg_start_phase(JpegJob* job) {
  if (setjmp(job->jump) != 0) return false;
  job->cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&job->cinfo);
  if (job->cinfo.output_components != 3 || job->cinfo.output_width != job->cinfo.image_width ||
      job->cinfo.output_height != job->cinfo.image_height) {
    std::snprintf(job->message, sizeof job->message, "unexpected output layout (%d components, %ux%u)",
                  job->cinfo.output_components, job->cinfo.output_width, job->cinfo.output_height);
    return false;
  }
  return true;
}

// Decodes every scanline into `out` (rows of `stride` bytes, image_height of them) and reads to the end of the
// image. False (message in job) on error.
bool jpeg_decode_phase(JpegJob* job, uint8_t* out, size_t stride) {
  if (setjmp(job->jump) != 0) return false;
  while (job->cinfo.output_scanline < job->cinfo.output_height) {
    JSAMPROW row = out + static_cast<size_t>(job->cinfo.output_scanline) * stride;
    if (jpeg_read_scanlines(&job->cinfo, &row, 1) != 1) {
      std::snprintf(job->message, sizeof job->message, "the decoder returned no scanline");
      return false;
    }
  }
  jpeg_finish_decompress(&job->cinfo);
  return true;
}

// A JPEG decompressor over `data` with its header read and checked (colour space, dimensions); released with the
// object.
struct JpegDecoder {
  JpegJob job{};
  JpegDecoder(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
    job.cinfo.err = jpeg_std_error(&job.err);
    job.err.error_exit = jpeg_fail;
    job.err.emit_message = jpeg_message;
    job.err.output_message = jpeg_no_output;
    job.cinfo.client_data = &job;
    // jpeg_header_phase creates the decompressor first: from here on the destructor must release it, so the
    // checks that throw run in a constructed object.
    if (!jpeg_header_phase(&job, data, size)) {
      jpeg_destroy_decompress(&job.cinfo);
      fail<FormatError>("{}: invalid or truncated JPEG: {}", origin, job.message);
    }
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&job.cinfo); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  void check(const std::string& origin, int64_t max_pixels) const {
    const J_COLOR_SPACE space = job.cinfo.jpeg_color_space;
    if (space == JCS_CMYK || space == JCS_YCCK) {
      fail<FormatError>("{}: {} JPEG images are not supported (only grayscale, YCbCr and RGB JPEGs); convert it to RGB",
                        origin, space == JCS_CMYK ? "CMYK" : "YCCK");
    }
    check_dimensions(origin, "JPEG", job.cinfo.image_width, job.cinfo.image_height, max_pixels);
  }
};

std::pair<int64_t, int64_t> jpeg_size(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
  JpegDecoder decoder(data, size, origin, max_pixels);
  decoder.check(origin, max_pixels);
  return {decoder.job.cinfo.image_height, decoder.job.cinfo.image_width};
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
  JpegDecoder decoder(data, size, origin, max_pixels);
  decoder.check(origin, max_pixels);
  JpegJob& job = decoder.job;

  if (!jpeg_start_phase(&job)) {
    if (job.err.msg_code == JERR_NO_BACKING_STORE) {
      fail<FormatError>("{}: the {} JPEG of {}x{} pixels needs more than {} MiB to decode (its coefficients are kept "
                        "whole across scans); refused", origin, job.cinfo.progressive_mode ? "progressive" : "multi-scan",
                        job.cinfo.image_width, job.cinfo.image_height, kMaxJpegMemory >> 20);
    }
    fail<FormatError>("{}: invalid or truncated JPEG: {}", origin, job.message);
  }
  Image image;
  image.height = job.cinfo.image_height;
  image.width = job.cinfo.image_width;
  const size_t stride = static_cast<size_t>(image.width) * 3;
  image.pixels.resize(stride * static_cast<size_t>(image.height));
  if (!jpeg_decode_phase(&job, image.pixels.data(), stride)) {
    fail<FormatError>("{}: invalid or truncated JPEG: {}", origin, job.message);
  }
  return image;
}

// ----------------------------------------------------------------------------------------------------------------
// PNG

struct PngJob {
  png_structp png;
  png_infop info;
  const uint8_t* data;
  size_t size;
  size_t offset;
  char message[256];
  png_uint_32 width, height;
  int bit_depth, color_type, interlace;
};

void png_fail(png_structp png, png_const_charp message) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof job->message, "%s", message);
  png_longjmp(png, 1);
}

// libpng's warnings (unknown or malformed ancillary chunks, sRGB profile notes) do not affect the pixels.
void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_memory(png_structp png, png_bytep out, size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > job->size - job->offset) png_error(png, "unexpected end of file (the file is truncated)");
  std::memcpy(out, job->data + job->offset, n);
  job->offset += n;
}

// Reads the signature and every chunk up to the image data; fills width, height, bit depth, colour type and
// interlace. False (message in job) on error.
bool png_header_phase(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png)) != 0) return false;
  png_set_read_fn(job->png, job, png_read_memory);
  png_read_info(job->png, job->info);
  png_get_IHDR(job->png, job->info, &job->width, &job->height, &job->bit_depth, &job->color_type, &job->interlace,
               nullptr, nullptr);
  return true;
}

// Decodes the image into `rows` (height row pointers) as 8-bit RGB, or as one palette index per byte for a
// palette image, and reads to the end of the file. False (message in job) on error.
bool png_decode_phase(PngJob* job, png_bytep* rows) {
  if (setjmp(png_jmpbuf(job->png)) != 0) return false;
  const bool palette = job->color_type == PNG_COLOR_TYPE_PALETTE;
  if (palette) {
    png_set_packing(job->png);  // 1, 2 and 4-bit indices to one byte each, unscaled
  } else {
    if (job->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(job->png);  // scaled to 0..255, tRNS not expanded
    if (job->bit_depth == 16) png_set_strip_16(job->png);              // the high byte, as Pillow keeps
    if ((job->color_type & PNG_COLOR_MASK_ALPHA) != 0) png_set_strip_alpha(job->png);
    if ((job->color_type & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(job->png);
  }
  png_set_interlace_handling(job->png);
  png_read_update_info(job->png, job->info);
  const size_t expected = static_cast<size_t>(job->width) * (palette ? 1 : 3);
  if (png_get_bit_depth(job->png, job->info) != 8 || png_get_rowbytes(job->png, job->info) != expected) {
    std::snprintf(job->message, sizeof job->message, "unexpected row layout after conversion (%d-bit, %zu bytes a row)",
                  png_get_bit_depth(job->png, job->info), static_cast<size_t>(png_get_rowbytes(job->png, job->info)));
    return false;
  }
  png_read_image(job->png, rows);
  png_read_end(job->png, nullptr);
  return true;
}

// A PNG reader over `data` with every chunk up to the image data read and checked (kind, dimensions); released with
// the object.
struct PngDecoder {
  PngJob job{};
  PngDecoder(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
    job.data = data;
    job.size = size;
    job.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_fail, png_ignore_warning);
    if (job.png == nullptr) fail<FormatError>("{}: cannot create a PNG decoder (out of memory?)", origin);
    job.info = png_create_info_struct(job.png);
    if (job.info == nullptr) {
      png_destroy_read_struct(&job.png, nullptr, nullptr);
      fail<FormatError>("{}: cannot create a PNG decoder (out of memory?)", origin);
    }
    if (!png_header_phase(&job)) {
      png_destroy_read_struct(&job.png, &job.info, nullptr);
      fail<FormatError>("{}: invalid or truncated PNG: {}", origin, job.message);
    }
  }
  ~PngDecoder() { png_destroy_read_struct(&job.png, &job.info, nullptr); }
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;
  void check(const std::string& origin, int64_t max_pixels) const {
    if (job.color_type == PNG_COLOR_TYPE_GRAY && job.bit_depth == 16) {
      fail<FormatError>(
          "{}: 16-bit grayscale PNG images are not supported (Pillow clips them to 0..255 instead of "
          "scaling); convert it to 8 bits",
          origin);
    }
    check_dimensions(origin, "PNG", job.width, job.height, max_pixels);
  }
};

std::pair<int64_t, int64_t> png_size(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
  PngDecoder decoder(data, size, origin, max_pixels);
  decoder.check(origin, max_pixels);
  return {decoder.job.height, decoder.job.width};
}

Image decode_png(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
  PngDecoder decoder(data, size, origin, max_pixels);
  decoder.check(origin, max_pixels);
  PngJob& job = decoder.job;

  Image image;
  image.height = job.height;
  image.width = job.width;
  const size_t stride = static_cast<size_t>(image.width) * 3;
  image.pixels.resize(stride * static_cast<size_t>(image.height));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (size_t y = 0; y < rows.size(); ++y) rows[y] = image.pixels.data() + y * stride;
  if (!png_decode_phase(&job, rows.data())) fail<FormatError>("{}: invalid or truncated PNG: {}", origin, job.message);

  if (job.color_type == PNG_COLOR_TYPE_PALETTE) {
    png_colorp colors = nullptr;
    int count = 0;
    if (png_get_PLTE(job.png, job.info, &colors, &count) == 0 || colors == nullptr) count = 0;
    // Each row holds `width` indices at its start; expanded in place from the right, so that no index is
    // overwritten before it is read.
    for (size_t y = 0; y < rows.size(); ++y) {
      uint8_t* row = rows[y];
      for (size_t x = static_cast<size_t>(image.width); x-- > 0;) {
        const int index = row[x];
        if (index >= count) {
          fail<FormatError>("{}: invalid PNG: pixel ({}, {}) has palette index {}, but the palette has {} entries",
                            origin, x, y, index, count);
        }
        row[3 * x] = colors[index].red;
        row[3 * x + 1] = colors[index].green;
        row[3 * x + 2] = colors[index].blue;
      }
    }
  }
  return image;
}

enum class Format { kJpeg, kPng };

// The format of `data`: JPEG or PNG, told by the leading bytes; anything else is refused, named when recognisable.
Format image_format(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
  if (max_pixels <= 0) fail<ConfigError>("{}: max_pixels must be positive, got {}", origin, max_pixels);
  if (size == 0 || data == nullptr)
    fail<FormatError>("{}: empty image file; supported formats are JPEG and PNG", origin);
  if (starts_with(data, size, "\xff\xd8\xff", 3)) return Format::kJpeg;
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n", 8)) return Format::kPng;
  if (const char* format = other_format(data, size)) {
    fail<FormatError>("{}: {} images are not supported; supported formats are JPEG and PNG", origin, format);
  }
  fail<FormatError>("{}: not a recognised image (leading bytes {}); supported formats are JPEG and PNG", origin,
                    leading_bytes(data, size));
}

}  // namespace

Image decode_image(const uint8_t* data, size_t size, const std::string& origin, int64_t max_pixels) {
  return image_format(data, size, origin, max_pixels) == Format::kJpeg ? decode_jpeg(data, size, origin, max_pixels)
                                                                      : decode_png(data, size, origin, max_pixels);
}

Image read_image(const fs::path& file, int64_t max_pixels) {
  require_regular_file(file, "image");
  const std::string bytes = read_text_file(file);
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), file.string(), max_pixels);
}

EncodedImage open_image(const fs::path& file, int64_t max_pixels) {
  require_regular_file(file, "image");
  return open_image_bytes(read_text_file(file), file.string(), max_pixels);
}

EncodedImage open_image_bytes(std::string bytes, std::string origin, int64_t max_pixels) {
  EncodedImage out;
  out.origin = std::move(origin);
  out.bytes = std::move(bytes);
  const auto* data = reinterpret_cast<const uint8_t*>(out.bytes.data());
  const size_t size = out.bytes.size();
  std::tie(out.height, out.width) = image_format(data, size, out.origin, max_pixels) == Format::kJpeg
                                        ? jpeg_size(data, size, out.origin, max_pixels)
                                        : png_size(data, size, out.origin, max_pixels);
  return out;
}

Image decode_image(const EncodedImage& image, int64_t max_pixels) {
  return decode_image(reinterpret_cast<const uint8_t*>(image.bytes.data()), image.bytes.size(), image.origin,
                      max_pixels);
}

}  // namespace swiftcpp::vision
