// Image files in: JPEG (libjpeg-turbo) and PNG (libpng) decoded to 8-bit RGB exactly as Pillow's
// `Image.open(f).convert("RGB")` gives them, which is what Hugging Face image processors see.
//
// What "as Pillow" means here:
// - JPEG: libjpeg's default decompression settings (islow IDCT, fancy upsampling) with out_color_space RGB;
//   grayscale JPEGs come out with the gray value in R, G and B. CMYK and YCCK JPEGs are refused.
// - PNG: palette images are looked up in their palette, gray is copied into R, G and B (1, 2 and 4-bit gray
//   scaled to 0..255), alpha is dropped without compositing (the stored colour under a transparent pixel is kept),
//   a tRNS chunk is ignored, 16-bit samples keep their high byte. 16-bit grayscale is refused: Pillow clips it to
//   0..255 rather than scaling it, which is never what a model was trained on.
// - No EXIF orientation is applied and no colour management (ICC profiles, gAMA) is done.
// - Stricter than Pillow: truncated files and corrupt JPEG entropy data are errors, not grey-filled images;
//   a palette index past the end of the palette is an error.
// The format is told by the leading bytes, never by the file name. Every function here is thread-safe: no
// global state, one decoder instance per call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fs.h"

namespace swiftcpp::vision {

/// An 8-bit RGB image: `pixels` holds height * width * 3 bytes, HWC, rows top to bottom, R G B per pixel.
struct Image {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;
};

/// The most pixels (width * height) an image may have before it is decoded: Pillow's own decompression-bomb
/// limit (2 x Image.MAX_IMAGE_PIXELS = 2 x 89,478,485), about 537 MB of RGB. Dimensions are read from the header
/// and checked against the limit before any pixel buffer is allocated.
constexpr int64_t kMaxImagePixels = 178956970;

/// Reads and decodes a JPEG or PNG file to RGB (see the top of this header for the exact conversion).
/// Throws IoError when the file is missing, unreadable or not a regular file; FormatError naming the file when it
/// is not JPEG or PNG (naming the format when it is recognisable: GIF, WebP, BMP, TIFF, ...), when it is truncated
/// or corrupt, when it is a kind of JPEG/PNG that is not supported (CMYK, 16-bit grayscale, 12-bit JPEG, ...),
/// or when width * height exceeds `max_pixels`. ConfigError when `max_pixels` is not positive.
Image read_image(const fs::path& file, int64_t max_pixels = kMaxImagePixels);

/// An image file read into memory with its header parsed and checked: the size is known, no pixel is decoded yet.
/// What lets a caller count an image's tokens, and refuse it, before paying for its pixels.
struct EncodedImage {
  std::string origin;  // the file name, named in errors
  std::string bytes;   // the whole file
  int64_t height = 0, width = 0;
};

/// Reads `file` and makes every check of read_image that needs no pixel: the format, the kind of JPEG/PNG, a
/// readable header, width * height within `max_pixels`. Throws as read_image does for those.
EncodedImage open_image(const fs::path& file, int64_t max_pixels = kMaxImagePixels);

/// The same for bytes held in memory (an image sent in a request); `origin` names them in errors.
EncodedImage open_image_bytes(std::string bytes, std::string origin, int64_t max_pixels = kMaxImagePixels);

/// Decodes an opened image (read_image's remaining steps). Throws FormatError as read_image does.
Image decode_image(const EncodedImage& image, int64_t max_pixels = kMaxImagePixels);

/// Decodes JPEG or PNG bytes held in memory, like read_image; `origin` names them in error messages (a file
/// name, "row 12 of data.jsonl", ...). Throws FormatError and ConfigError as read_image does.
Image decode_image(const uint8_t* data, size_t size, const std::string& origin,
                   int64_t max_pixels = kMaxImagePixels);

}  // namespace swiftcpp::vision
