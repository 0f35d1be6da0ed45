// Image input benchmark: decodes and preprocesses the five real images of ../shared/assets/images over and over on
// --threads threads for --seconds, and reports images per second for decode + preprocess, and separately for
// preprocess alone (images decoded once up front). The processor is --processor:
//   clip      CLIPImageProcessor at --size (LLaVA-1.5's 336 by default): vision/processor.h preprocess_image,
//             a [3, size, size] tensor per image;
//   qwen2_vl  Qwen2VLImageProcessor with --min-pixels (3136, the class default) and --max-pixels (1003520, the
//             class default): vision/qwen2_vl_processor.h preprocess_qwen2_vl (smart_resize, bicubic resize,
//             rescale, normalize, patchify), a [patches, 1176] tensor per image; the image tokens of each image
//             are reported.
// Each thread walks the images round-robin from its own starting image; files are read into memory once, so no
// disk I/O is timed. Prints one JSON line on stdout and a readable summary on stderr.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/fs.h"
#include "core/json.h"
#include "vision/image.h"
#include "vision/processor.h"
#include "vision/qwen2_vl_processor.h"

using namespace swiftcpp;

namespace {

const char* const kImages[] = {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png", "astronaut_224.png"};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs `work(thread, i)` for i = 0, 1, ... on `threads` threads until `seconds` have passed; returns {seconds,
// calls}.
template <typename Work>
std::pair<double, int64_t> run_for(int threads, double seconds, const Work& work) {
  std::atomic<bool> stop{false};
  std::vector<int64_t> counts(static_cast<size_t>(threads), 0);
  std::vector<std::thread> workers;
  const double t0 = now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      int64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) work(t, n++);
      counts[static_cast<size_t>(t)] = n;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& worker : workers) worker.join();
  const double elapsed = now() - t0;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return {elapsed, total};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swiftcpp image decode + CLIP preprocessing benchmark"};
  std::string images_dir = "../shared/assets/images";
  int threads = 2;
  double seconds = 5;
  int64_t size = 336;
  std::string processor = "clip";
  int64_t min_pixels = 56 * 56, max_pixels = 28 * 28 * 1280;
  app.add_option("--images", images_dir, "folder holding the five test images");
  app.add_option("--processor", processor, "clip (CLIPImageProcessor) or qwen2_vl (Qwen2VLImageProcessor)")
      ->check(CLI::IsMember({"clip", "qwen2_vl"}));
  app.add_option("--threads", threads, "threads decoding at once")->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "seconds per measurement")->check(CLI::Range(0.1, 3600.0));
  app.add_option("--size", size, "clip: shortest edge and crop size of the processor")->check(CLI::Range(1, 4096));
  const CLI::Range pixel_range(int64_t{1}, vision::kMaxQwen2VLPixels);
  app.add_option("--min-pixels", min_pixels, "qwen2_vl: min_pixels")->check(pixel_range);
  app.add_option("--max-pixels", max_pixels, "qwen2_vl: max_pixels")->check(pixel_range);
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(1);  // the work is split across our own threads, not LibTorch's pool
    const bool qwen = processor == "qwen2_vl";
    if (qwen && min_pixels > max_pixels) throw std::runtime_error("--min-pixels is larger than --max-pixels");
    vision::ImageProcessorConfig config;
    config.shortest_edge = config.crop_height = config.crop_width = size;
    vision::Qwen2VLProcessorConfig qwen_config;
    qwen_config.min_pixels = min_pixels;
    qwen_config.max_pixels = max_pixels;
    // One image -> its pixel_values ([3, size, size] or [patches, 1176]) and its language-model tokens.
    const auto process = [&](const vision::Image& image) -> std::pair<at::Tensor, int64_t> {
      if (!qwen) return {vision::preprocess_image(image, config), 0};
      vision::Qwen2VLImage q = vision::preprocess_qwen2_vl(image, qwen_config);
      const int64_t tokens = q.tokens();
      return {std::move(q.pixel_values), tokens};
    };
    std::vector<std::string> files;
    std::vector<vision::Image> decoded;
    int64_t pixels = 0, tokens = 0, patches = 0;
    Json per_image = Json::array();
    for (const char* name : kImages) {
      files.push_back(read_text_file(fs::path(images_dir) / name));
      decoded.push_back(vision::read_image(fs::path(images_dir) / name));
      pixels += decoded.back().height * decoded.back().width;
      const auto [values, image_tokens] = process(decoded.back());  // warm-up
      tokens += image_tokens;
      if (qwen) patches += values.size(0);
      per_image.push_back(
          {{"file", name}, {"shape", values.sizes().vec()}, {"tokens", qwen ? Json(image_tokens) : Json()}});
    }
    const size_t n = files.size();
    std::atomic<double> checksum{0};  // keeps the results alive
    const auto full = run_for(threads, seconds, [&](int t, int64_t i) {
      const std::string& bytes = files[(static_cast<size_t>(t) + static_cast<size_t>(i)) % n];
      const vision::Image image =
          vision::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "bench");
      const at::Tensor values = process(image).first;  // [3, size, size] or [patches, 1176]
      if (i == 0) checksum = checksum + values.data_ptr<float>()[0];
    });
    const auto preprocess = run_for(threads, seconds, [&](int t, int64_t i) {
      const at::Tensor values = process(decoded[(static_cast<size_t>(t) + static_cast<size_t>(i)) % n]).first;
      if (i == 0) checksum = checksum + values.data_ptr<float>()[0];
    });
    const double full_rate = static_cast<double>(full.second) / full.first;
    const double preprocess_rate = static_cast<double>(preprocess.second) / preprocess.first;
    const auto count = static_cast<int64_t>(n);
    Json result = {{"threads", threads},
                   {"processor", qwen ? "Qwen2VLImageProcessor" : "CLIPImageProcessor"},
                   {"size", qwen ? Json() : Json(size)},
                   {"min_pixels", qwen ? Json(min_pixels) : Json()},
                   {"max_pixels", qwen ? Json(max_pixels) : Json()},
                   {"mean_tokens", qwen ? Json(static_cast<double>(tokens) / static_cast<double>(count)) : Json()},
                   {"mean_patches", qwen ? Json(static_cast<double>(patches) / static_cast<double>(count)) : Json()},
                   {"per_image", per_image},
                   {"seconds", seconds},
                   {"images", n},
                   {"mean_input_pixels", pixels / static_cast<int64_t>(n)},
                   {"decode_preprocess_images", full.second},
                   {"decode_preprocess_images_per_s", full_rate},
                   {"preprocess_images", preprocess.second},
                   {"preprocess_images_per_s", preprocess_rate}};
    const std::string setting =
        qwen ? fmt::format("qwen2_vl, pixels {}..{} (mean {:.1f} tokens, {:.1f} patches an image)", min_pixels,
                           max_pixels, static_cast<double>(tokens) / count, static_cast<double>(patches) / count)
             : fmt::format("clip, size {}", size);
    std::cerr << "threads " << threads << ", " << setting << ", " << n << " images (mean "
              << pixels / static_cast<int64_t>(n) << " input pixels)\n"
              << "decode + preprocess: " << full_rate << " images/s (" << full.second << " in " << full.first << " s)\n"
              << "preprocess only:     " << preprocess_rate << " images/s (" << preprocess.second << " in "
              << preprocess.first << " s)\n";
    std::cout << result.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
