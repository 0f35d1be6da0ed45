// Fuzzes the multimodal benchmark readers and scorers (lib/eval/mm_bench, mm_rules, pycompat): the bytes as a
// VLMEvalKit TSV (first byte even) or lmms-eval rows (odd) of the benchmark first byte / 2 % 6 names, read, their
// prompts built and their images resolved, then scored under both toolkits' rules; and the bytes as a prediction
// through every parsing rule and Python helper on their own.
#include "eval/mm_bench.h"
#include "eval/mm_rules.h"
#include "eval/pycompat.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  namespace mm = eval::mm;
  if (size == 0) return 0;
  const bool tsv = data[0] % 2 == 0;
  const auto benchmark = static_cast<mm::Benchmark>((data[0] / 2) % 6);
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto path = fuzz::write_scratch(tsv ? "bench.tsv" : "bench.jsonl", body);
  fuzz::expect_clean([&] {
    mm::BenchData bench = mm::read_benchmark(path, benchmark);
    for (const auto& item : bench.items) {
      for (mm::Rules rules : {mm::Rules::kVLMEvalKit, mm::Rules::kLmmsEval}) {
        (void)mm::prompt_text(mm::benchmark_prompt(item, benchmark, rules));
      }
    }
    fuzz::expect_clean([&] { (void)mm::benchmark_images(bench); });
    for (auto& item : bench.items) {
      if (!item.prediction) item.prediction = item.question;
    }
    for (mm::Rules rules : {mm::Rules::kVLMEvalKit, mm::Rules::kLmmsEval}) {
      for (bool official : {true, false}) {
        mm::ScoreOptions options;
        options.rules = rules;
        options.mmmu_official_open = official;
        options.strip_reasoning = official;
        (void)mm::result_markdown(mm::score_benchmark(bench, options));
      }
    }
  });
  // The bytes as one model answer through every rule.
  const std::string text(body);
  const mm::Options options = {{'A', "a cat"}, {'B', "the 2 dogs"}, {'C', "1,000"}, {'D', ""}};
  (void)mm::vlmeval_can_infer(text, options);
  (void)mm::vlmeval_yes_no(text);
  (void)mm::vlmeval_process_answer(text);
  (void)mm::lmms_strip_reasoning(text);
  (void)mm::lmms_mmbench_prefetch(text, options);
  (void)mm::lmms_extract_mcq_answer(text, {'A', 'B', 'C', 'D'});
  (void)mm::lmms_vqa_normalize(text);
  eval::py::Random rng(0);
  (void)mm::lmms_mmmu_choice(text, options, rng);
  (void)mm::mmmu_eval_open(text, mm::mmmu_parse_open(text));
  (void)mm::relaxed_correctness(text, "12%");
  (void)eval::py::to_float(text);
  (void)eval::py::list_literal(text);
  (void)eval::py::lower(text);
  (void)eval::py::split(text);
  return 0;
}
