// Tokenizer benchmark: encodes every instruction, input and output string of an Alpaca-style JSON file with a
// tokenizer folder, on 1..N threads (rows split into contiguous blocks, one per std::thread), and prints
// tokens/s per thread count as one JSON line (plus a readable table on stderr).
//
// Two regimes per thread count, each the median of --runs repetitions:
//   cold: a freshly loaded tokenizer, so every distinct pre-token is merged once (loading is not timed);
//   warm: the same tokenizer after one untimed pass, so pre-tokens come from the cache.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/json.h"
#include "tokenizer/tokenizer.h"

using namespace swiftcpp;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Encodes all texts on `threads` threads; returns {seconds, tokens}.
std::pair<double, size_t> encode_all(const TextTokenizer& tokenizer, const std::vector<std::string>& texts,
                                     int threads) {
  std::vector<size_t> counts(threads, 0);
  std::vector<std::thread> workers;
  const double t0 = now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t]() {
      const size_t begin = texts.size() * t / threads, end = texts.size() * (t + 1) / threads;
      size_t n = 0;
      for (size_t i = begin; i < end; ++i) n += tokenizer.encode(texts[i]).size();
      counts[t] = n;
    });
  }
  for (auto& worker : workers) worker.join();
  const double seconds = now() - t0;
  size_t tokens = 0;
  for (size_t c : counts) tokens += c;
  return {seconds, tokens};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swiftcpp tokenizer benchmark"};
  std::string tokenizer_dir, data_file;
  std::vector<int> thread_counts{1, 2};
  int runs = 3;
  app.add_option("--tokenizer", tokenizer_dir, "tokenizer folder (tokenizer.json, tokenizer.model, ...)")->required();
  app.add_option("--data", data_file, "JSON list of {instruction, input, output} rows")->required();
  app.add_option("--threads", thread_counts, "thread counts to measure")->delimiter(',');
  app.add_option("--runs", runs, "timed repetitions per regime (median reported)");
  CLI11_PARSE(app, argc, argv);
  try {
    const Json rows = load_json_file(data_file);
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (const Json& row : rows) {
      for (const char* key : {"instruction", "input", "output"}) {
        if (!row.contains(key) || !row.at(key).is_string()) continue;
        texts.push_back(row.at(key).get<std::string>());
        bytes += texts.back().size();
      }
    }
    Json results = Json::array();
    for (int threads : thread_counts) {
      if (threads < 1) throw std::runtime_error("--threads values must be >= 1");
      std::vector<double> cold, warm;
      size_t tokens = 0;
      for (int r = 0; r < runs; ++r) {
        const auto fresh = load_tokenizer(tokenizer_dir);
        const auto [seconds, n] = encode_all(*fresh, texts, threads);
        cold.push_back(seconds);
        tokens = n;
      }
      const auto tokenizer = load_tokenizer(tokenizer_dir);
      encode_all(*tokenizer, texts, threads);
      for (int r = 0; r < runs; ++r) warm.push_back(encode_all(*tokenizer, texts, threads).first);
      const double cold_s = median(cold), warm_s = median(warm);
      results.push_back({{"threads", threads},
                         {"texts", texts.size()},
                         {"bytes", bytes},
                         {"tokens", tokens},
                         {"cold_seconds", cold_s},
                         {"cold_tokens_per_s", tokens / cold_s},
                         {"warm_seconds", warm_s},
                         {"warm_tokens_per_s", tokens / warm_s}});
      std::cerr << fmt::format("threads {}: {} tokens from {} texts ({:.2f} MB); cold {:.3f} s = {:.0f} tokens/s; "
                               "warm {:.3f} s = {:.0f} tokens/s ({:.1f} MB/s)",
                               threads, tokens, texts.size(), bytes / 1e6, cold_s, tokens / cold_s, warm_s,
                               tokens / warm_s, bytes / 1e6 / warm_s)
                << std::endl;
    }
    std::cout << Json{{"tokenizer", tokenizer_dir}, {"data", data_file}, {"runs", runs}, {"results", results}}.dump()
              << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "swiftcpp_bench_tokenizer: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
