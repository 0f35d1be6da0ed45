// Fuzzes image decoding and CLIP preprocessing (lib/vision/*): decode_image on arbitrary bytes (format sniffing,
// libjpeg-turbo and libpng behind their longjmp error handling, palette lookup, the pixel limit), then
// preprocess_image on what decodes, with the target size, crop size and filter taken from the input's last bytes
// so that upscaling, downscaling and zero-padded crops are all reached.
#include <ATen/ATen.h>

#include <cstdlib>

#include "fuzz_util.h"
#include "vision/image.h"
#include "vision/processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  constexpr int64_t kMaxPixels = int64_t{1} << 22;
  fuzz::expect_clean([&] {
    const vision::Image image = vision::decode_image(data, size, "fuzz", kMaxPixels);
    if (image.height <= 0 || image.width <= 0 || image.height * image.width > kMaxPixels ||
        image.pixels.size() != static_cast<size_t>(image.height * image.width * 3)) {
      std::abort();
    }
    auto from_end = [&](size_t i) { return i < size ? data[size - 1 - i] : uint8_t{0}; };
    vision::ImageProcessorConfig config;
    config.shortest_edge = 1 + from_end(0) % 64;
    config.crop_height = 1 + from_end(1) % 80;
    config.crop_width = 1 + from_end(2) % 80;
    config.resample = from_end(3) % 2 == 0 ? vision::Resample::kBicubic : vision::Resample::kBilinear;
    const at::Tensor values = vision::preprocess_image(image, config, kMaxPixels);  // [3, crop_h, crop_w]
    if (values.size(0) != 3 || values.size(1) != config.crop_height || values.size(2) != config.crop_width ||
        !values.isfinite().all().item<bool>()) {
      std::abort();
    }
  });
  return 0;
}
