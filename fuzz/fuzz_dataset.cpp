// Fuzzes dataset reading (lib/data/dataset.*): the bytes as a JSONL file (first byte even) or a JSON array file
// (odd), streamed by for_each_row; every row goes through normalise_row (messages, ShareGPT, Alpaca,
// query/response, text), with and without a system override.
#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  if (size == 0) return 0;
  const bool jsonl = data[0] % 2 == 0;
  const auto path = fuzz::write_scratch(jsonl ? "rows.jsonl" : "rows.json",
                                        {reinterpret_cast<const char*>(data) + 1, size - 1});
  const std::optional<std::string> system = (data[0] & 2) ? std::optional<std::string>("Be brief.") : std::nullopt;
  fuzz::expect_clean([&] {
    DatasetSource source{path, (data[0] & 4) ? std::optional<int64_t>(3) : std::nullopt};
    SkipCounts skips;
    for_each_row(
        source,
        [&](Json&& row, const std::string& where) {
          try {
            const Conversation c = normalise_row(row, where, system);
            (void)c.messages.size();
          } catch (const BadRowError& e) {
            skips.add(e.reason());
          }
        },
        [&](const std::string&, const std::string& reason, const std::string&) { skips.add(reason); });
    (void)skips.summary();
  });
  fuzz::expect_clean([&] { (void)parse_dataset_source(std::string(reinterpret_cast<const char*>(data), std::min<size_t>(size, 64))); });
  return 0;
}
