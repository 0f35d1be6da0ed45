// Fuzzes the eval task readers (lib/eval/tasks.*). The first byte picks: CSV (parse_csv), the JSONL layouts of
// ARC, HellaSwag and GSM8K, HellaSwag's text layout, perplexity JSONL, a custom task YAML (the bytes before
// "\n%%\n") with its JSONL data (after it, as data.jsonl), or render_fields (template before "\n%%\n", JSON row after).
#include "core/json.h"
#include "eval/tasks.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  eval::TaskOptions options;
  options.num_fewshot = (data[0] >> 4) % 3;
  if (data[0] & 0x80) options.limit = 2;
  const fs::path dir = fuzz::scratch_dir();
  fuzz::expect_clean([&] {
    switch (data[0] % 8) {
      case 0: (void)eval::parse_csv(std::string(rest), "fuzz.csv"); break;
      case 1: (void)eval::load_task("arc_easy=" + fuzz::write_scratch("arc.jsonl", rest).string(), dir, options); break;
      case 2: (void)eval::load_task("hellaswag=" + fuzz::write_scratch("hs.jsonl", rest).string(), dir, options); break;
      case 3: (void)eval::load_task("hellaswag=" + fuzz::write_scratch("hellaswag_val_full.txt", rest).string(), dir, options); break;
      case 4: (void)eval::load_task("gsm8k=" + fuzz::write_scratch("test.jsonl", rest).string(), dir, options); break;
      case 5: (void)eval::load_task("perplexity=" + fuzz::write_scratch("ppl.jsonl", rest).string(), dir, options); break;
      case 6: {
        const auto [yaml, rows] = fuzz::split_once(rest, "\n%%\n");
        fuzz::write_scratch("data.jsonl", rows);
        (void)eval::load_task(fuzz::write_scratch("task.yaml", yaml).string(), dir, options);
        break;
      }
      default: {
        const auto [templ, row] = fuzz::split_once(rest, "\n%%\n");
        (void)eval::render_fields(std::string(templ), parse_json(std::string(row), "fuzz row"), "fuzz");
        (void)eval::hellaswag_preprocess(std::string(templ));
      }
    }
  });
  return 0;
}
