// Image input benchmark: decodes and preprocesses (CLIPImageProcessor at --size, LLaVA-1.5's 336 by default) the
// five real images of ../shared/assets/images over and over on --threads threads for --seconds, and reports
// images per second for decode + preprocess, and separately for preprocess alone (images decoded once up front).
// Each thread walks the images round-robin from its own starting image; files are read into memory once, so no
// disk I/O is timed. Prints one JSON line on stdout and a readable summary on stderr.
#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/fs.h"
#include "core/json.h"
#include "vision/image.h"
#include "vision/processor.h"

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
  app.add_option("--images", images_dir, "folder holding the five test images");
  app.add_option("--threads", threads, "threads decoding at once")->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "seconds per measurement")->check(CLI::Range(0.1, 3600.0));
  app.add_option("--size", size, "shortest edge and crop size of the processor")->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(1);  // the work is split across our own threads, not LibTorch's pool
    vision::ImageProcessorConfig config;
    config.shortest_edge = config.crop_height = config.crop_width = size;
    std::vector<std::string> files;
    std::vector<vision::Image> decoded;
    int64_t pixels = 0;
    for (const char* name : kImages) {
      files.push_back(read_text_file(fs::path(images_dir) / name));
      decoded.push_back(vision::read_image(fs::path(images_dir) / name));
      pixels += decoded.back().height * decoded.back().width;
      (void)vision::preprocess_image(decoded.back(), config);  // warm-up
    }
    const size_t n = files.size();
    std::atomic<double> checksum{0};  // keeps the results alive
    const auto full = run_for(threads, seconds, [&](int t, int64_t i) {
      const std::string& bytes = files[(static_cast<size_t>(t) + static_cast<size_t>(i)) % n];
      const vision::Image image =
          vision::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "bench");
      const at::Tensor values = vision::preprocess_image(image, config);  // [3, size, size]
      if (i == 0) checksum = checksum + values.data_ptr<float>()[0];
    });
    const auto preprocess = run_for(threads, seconds, [&](int t, int64_t i) {
      const at::Tensor values =
          vision::preprocess_image(decoded[(static_cast<size_t>(t) + static_cast<size_t>(i)) % n], config);
      if (i == 0) checksum = checksum + values.data_ptr<float>()[0];
    });
    const double full_rate = static_cast<double>(full.second) / full.first;
    const double preprocess_rate = static_cast<double>(preprocess.second) / preprocess.first;
    Json result = {{"threads", threads},
                   {"size", size},
                   {"seconds", seconds},
                   {"images", n},
                   {"mean_input_pixels", pixels / static_cast<int64_t>(n)},
                   {"decode_preprocess_images", full.second},
                   {"decode_preprocess_images_per_s", full_rate},
                   {"preprocess_images", preprocess.second},
                   {"preprocess_images_per_s", preprocess_rate}};
    std::cerr << "threads " << threads << ", size " << size << ", " << n << " images (mean "
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
