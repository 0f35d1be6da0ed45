// `swiftcpp data inspect`: what the trainer will see — a rendered sample with its trained tokens marked, and
// statistics of the whole dataset.
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "apps/swiftcpp/commands.h"
#include "infer/session.h"
#include "models/registry.h"
#include "core/error.h"
#include "data/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::app {

namespace {

struct DataInspectOptions {
  std::string model;
  std::vector<std::string> dataset;
  std::vector<std::string> val_dataset;
  std::string chat_template;  // empty: detect from the checkpoint
  std::string system;
  int64_t max_length = 2048;
  std::string truncation = "delete";
  std::string loss_scale = "default";
  bool lenient = false;
  int64_t show = 1;
  std::string cache_dir;
  double split_dataset_ratio = 0.0;
  bool shuffle = false;
  uint64_t seed = 42;
};

// Text of ids with the trained tokens wrapped in markers (green on a terminal, «…» otherwise).
std::string marked_text(const TextTokenizer& tok, const Sample& s, bool color) {
  const std::string open = color ? "\x1b[32m" : "«", close = color ? "\x1b[0m" : "»";
  std::string out;
  std::vector<int> run;
  bool run_trained = false;
  auto flush = [&] {
    if (run.empty()) return;
    const std::string text = tok.decode_with_special_tokens(run);
    out += run_trained ? open + text + close : text;
    run.clear();
  };
  for (size_t t = 0; t < s.input_ids.size(); ++t) {
    // Token t is trained when position t - 1 predicts it.
    const bool trained = t > 0 && s.labels[t - 1] != kIgnoreIndex;
    if (trained != run_trained) flush();
    run_trained = trained;
    run.push_back(s.input_ids[t]);
  }
  flush();
  return out;
}


int run_inspect(const DataInspectOptions& o, int threads) {
  const fs::path model_dir = o.model;
  const ModelAssets assets = ModelAssets::open(model_dir, o.chat_template);
  const auto& tokenizer = assets.tokenizer;
  const std::string& template_name = assets.template_name;
  const std::shared_ptr<const ChatTemplate>& tmpl = assets.chat_template;
  EncodeOptions enc;
  enc.max_length = o.max_length;
  enc.truncation = parse_truncation_strategy(o.truncation);
  enc.loss_scale = parse_loss_scale(o.loss_scale);
  // A vision-language checkpoint: image rows are encoded as training encodes them (runs of image tokens, images
  // read and preprocessed).
  std::string image_fingerprint;
  if (assets.images) {
    enc.images = assets.images;
    image_fingerprint = "|images=" + image_encoding_fingerprint(*enc.images);
  }
  SampleEncoder encoder(tokenizer, tmpl, enc);

  DataOptions data;
  data.dataset = o.dataset;
  data.val_dataset = o.val_dataset;
  data.strict = !o.lenient;
  data.dataset_shuffle = o.shuffle;
  data.seed = o.seed;
  data.split_dataset_ratio = o.split_dataset_ratio;
  if (!o.system.empty()) data.system = o.system;
  data.cache_dir = o.cache_dir;
  data.num_threads = threads;  // swiftcpp --threads N; 0: every usable core
  const std::string fingerprint = fmt::format("{}|template={}|max_length={}|trunc={}|loss={}{}",
                                              tokenizer_files_fingerprint(model_dir), template_name, o.max_length,
                                              o.truncation, o.loss_scale, image_fingerprint);
  const TokenizedData result = prepare_data(data, encoder, fingerprint);
  const DataStats& st = result.stats;

  const bool color = isatty(STDOUT_FILENO) != 0;
  std::cout << "template: " << (template_name.empty() ? "raw text (the checkpoint has no chat template)" : template_name)
            << "\n";
  for (int64_t i = 0; i < o.show && i < static_cast<int64_t>(result.train.size()); ++i) {
    const Sample& s = result.train[i];
    std::cout << fmt::format("--- sample {} ({} tokens, {} trained; trained text marked {}) ---\n", i,
                             s.input_ids.size(), s.label_tokens(), color ? "in green" : "«like this»")
              << marked_text(*tokenizer, s, color) << "\n";
  }
  std::vector<int64_t> lengths;
  for (const auto* list : {&result.train, &result.validation}) {
    for (const auto& s : *list) lengths.push_back(static_cast<int64_t>(s.input_ids.size()));
  }
  std::sort(lengths.begin(), lengths.end());
  std::cout << "--- statistics ---\n"
            << fmt::format("rows read {}, samples {} (train {}, validation {}), tokens {}, trained tokens {} ({:.1f}%)\n",
                           st.rows, st.samples, result.train.size(), result.validation.size(), st.tokens,
                           st.label_tokens, st.tokens ? 100.0 * st.label_tokens / st.tokens : 0.0);
  if (!lengths.empty()) {
    std::cout << fmt::format("length min {}, median {}, max {}\n", lengths.front(), lengths[lengths.size() / 2],
                             lengths.back());
    // Histogram over power-of-two buckets.
    int64_t lo = 1;
    while (lo * 2 <= lengths.front()) lo *= 2;
    for (; lo <= lengths.back(); lo *= 2) {
      const auto first = std::lower_bound(lengths.begin(), lengths.end(), lo);
      const auto last = std::lower_bound(lengths.begin(), lengths.end(), lo * 2);
      const int64_t n = last - first;
      const int bar = static_cast<int>(std::lround(50.0 * n / static_cast<double>(lengths.size())));
      std::cout << fmt::format("  [{:>6}, {:>6}) {:>8} {}\n", lo, lo * 2, n, std::string(bar, '#'));
    }
  }
  std::cout << (st.skipped.total() ? st.skipped.summary() : std::string("0 rows skipped")) << "\n";
  std::cout << fmt::format("preprocessing {:.3f} s{}: {:.0f} rows/s, {:.0f} tokens/s\n", st.seconds,
                           st.from_cache ? " (from cache)" : "", st.rows / std::max(st.seconds, 1e-9),
                           st.tokens / std::max(st.seconds, 1e-9));
  return 0;
}

}  // namespace

CommandRun add_data_command(CLI::App& root, const GlobalOptions& globals) {
  auto o = std::make_shared<DataInspectOptions>();
  CLI::App* data = root.add_subcommand("data", "Inspect datasets as the trainer will see them");
  data->require_subcommand(1);
  CLI::App* cmd = data->add_subcommand("inspect", "Render samples with trained tokens marked, and dataset statistics");
  cmd->add_option("--model", o->model, "Model folder (tokenizer and chat template)")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--dataset", o->dataset, "Dataset file path[#N] (repeatable): JSON array or JSONL")->required();
  cmd->add_option("--val-dataset", o->val_dataset, "Validation dataset path[#N] (repeatable)");
  cmd->add_option("--template", o->chat_template, "Chat template name (default: the checkpoint's; raw for none)");
  cmd->add_option("--system", o->system, "System prompt replacing each row's");
  cmd->add_option("--max-length", o->max_length, "Maximum tokens per sample")->capture_default_str();
  cmd->add_option("--truncation-strategy", o->truncation, "delete | left | right")->capture_default_str();
  cmd->add_option("--loss-scale", o->loss_scale, "default (every assistant turn) | last_round")->capture_default_str();
  cmd->add_flag("--no-strict", o->lenient, "Skip bad rows (counted by reason) instead of failing");
  cmd->add_option("--show", o->show, "Samples to print")->capture_default_str();
  cmd->add_option("--cache-dir", o->cache_dir, "Tokenized-data cache folder");
  cmd->add_option("--split-dataset-ratio", o->split_dataset_ratio, "Share held out for validation (no --val-dataset)")
      ->capture_default_str();
  cmd->add_flag("--dataset-shuffle", o->shuffle, "Shuffle the rows (with --seed) before splitting");
  cmd->add_option("--seed", o->seed, "Shuffle seed")->capture_default_str();
  return [o, &globals]() { return run_inspect(*o, globals.threads); };
}

}  // namespace swiftcpp::app
