// Preprocessing at scale: dataset files streamed through worker threads into tokenised samples, with a cache
// keyed by the content of everything that determines the result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/encode.h"

namespace swiftcpp {

struct DataOptions {
  std::vector<std::string> dataset;      // "path[#N]" each
  std::vector<std::string> val_dataset;  // "path[#N]" each
  double split_dataset_ratio = 0.0;      // share of `dataset` held out for validation when val_dataset is empty
  bool dataset_shuffle = true;
  uint64_t seed = 42;
  bool strict = true;                    // false: bad rows are skipped and counted instead of failing
  std::optional<std::string> system;     // replaces every row's system prompt
  int num_threads = 0;                   // 0: every usable core
  fs::path cache_dir;                    // empty: no cache
};

/// Rows read, samples made and what was skipped, with throughput.
struct DataStats {
  int64_t rows = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t label_tokens = 0;
  SkipCounts skipped;
  double seconds = 0;
  bool from_cache = false;
};

struct TokenizedData {
  std::vector<Sample> train;
  std::vector<Sample> validation;
  DataStats stats;
};

/// Reads every dataset file (streamed: a file is never held whole in memory), normalises and encodes rows on
/// `num_threads` workers in input order (relative image paths resolved against each dataset file's folder; the
/// workers read and preprocess images as they encode text), drops rows too long for truncation "delete" (counted
/// as "longer than max_length"), splits off validation data and shuffles with `seed`. With strict, the first bad
/// row throws BadRowError naming file:line; otherwise bad rows are counted by reason in stats.skipped.
/// With a cache_dir, the result (token ids, labels and preprocessed pixel_values) is stored under a key hashed
/// from the dataset files' bytes, the tokenizer files, `fingerprint` (template and encoder settings), the
/// encoder's image settings (image_encoding_fingerprint) and these options; the file also records the hash of
/// every image file the rows reference (each hashed once, before it is decoded), and a later call with the same
/// key loads it instead of preprocessing unless one of those images changed, appeared or disappeared. A damaged
/// cache file or one of another format version is rebuilt. Throws IoError / FormatError / ConfigError as the
/// readers do.
TokenizedData prepare_data(const DataOptions& options, const SampleEncoder& encoder, const std::string& fingerprint);

/// Hashes of the tokenizer and config files of a checkpoint folder, for cache keys and resume checks. Throws IoError.
std::string tokenizer_files_fingerprint(const fs::path& dir);

/// 64-bit FNV-1a over a file's bytes, streamed. Throws IoError.
uint64_t hash_file(const fs::path& path, uint64_t seed = 1469598103934665603ULL);

}  // namespace swiftcpp
