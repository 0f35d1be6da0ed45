// Every fuzz target of the build run over its seed corpus, without libFuzzer: fuzz/corpus/<target>/* in name order,
// each seed whole and cut in half, plus an empty input. A target aborts on anything but swiftcpp's typed errors
// (fuzz_util.h), which fails the run; so does a target without seeds. CTest FuzzSmoke runs it in every build.
//   swiftcpp_fuzz_smoke CORPUS_DIR [TARGET...]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_smoke_targets.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [TARGET...]\n", argv[0]);
    return 2;
  }
  const fs::path corpus = argv[1];
  const std::vector<std::string> only(argv + 2, argv + argc);
  int failures = 0, ran = 0;
  for (const SmokeTarget& target : kSmokeTargets) {
    if (!only.empty() && std::find(only.begin(), only.end(), target.name) == only.end()) continue;
    const fs::path dir = corpus / target.name;
    std::vector<fs::path> seeds;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_regular_file()) seeds.push_back(entry.path());
    }
    if (seeds.empty()) {
      std::fprintf(stderr, "%s: no seeds in %s (every target keeps a seed corpus)\n", target.name, dir.c_str());
      ++failures;
      continue;
    }
    std::sort(seeds.begin(), seeds.end());
    target.run(nullptr, 0);
    size_t inputs = 1;
    for (const fs::path& seed : seeds) {
      std::ifstream in(seed, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      target.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      target.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() / 2);
      inputs += 2;
    }
    std::printf("%s: %zu seeds, %zu inputs\n", target.name, seeds.size(), inputs);
    ++ran;
  }
  if (ran == 0 && failures == 0) {
    std::fprintf(stderr, "no fuzz target matched\n");
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
