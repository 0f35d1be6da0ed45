// The machinery under prepare_data (SFT) and the preference-data preparers: dataset rows streamed through worker
// threads into encoded items in input order, the train shuffle and validation split, and the content-keyed cache
// file with its bounds-checked reader. Internal to lib/data: the public entry points are in pipeline.h and
// preference_data.h.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <istream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "data/pipeline.h"

namespace swiftcpp::data_detail {

/// The content of every image file the rows reference, for the cache: each file hashed once, by the first worker
/// that meets it, before any worker decodes it (so a file changed after hashing is seen as changed next time,
/// never cached under its new hash with old pixels). A missing or unreadable file is recorded as such.
class ImageManifest {
 public:
  /// Records `path` and hashes it unless it was recorded before. Thread-safe; does not throw (an unreadable file is
  /// recorded without a hash).
  void add(const fs::path& path);
  /// path -> hash (nullopt: missing or unreadable), sorted by path.
  const std::map<std::string, std::optional<uint64_t>>& entries() const { return entries_; }
  /// hash_file(path), or nullopt when it throws IoError.
  static std::optional<uint64_t> hash_if_readable(const fs::path& path);

 private:
  std::mutex mu_;
  std::map<std::string, std::optional<uint64_t>> entries_;
};

/// Reads a cache file with every length checked against the bytes left before anything is allocated for it.
class CacheReader {
 public:
  CacheReader(std::istream& in, uint64_t size) : in_(in), left_(size) {}
  /// Reads n bytes; false (nothing consumed past the end) when fewer are left or the stream fails.
  bool read(void* dst, uint64_t n);
  bool u64(uint64_t& v) { return read(&v, 8); }
  /// A count of items each at least `min_bytes` long, which the bytes left could hold.
  bool count(uint64_t& n, uint64_t min_bytes) { return u64(n) && n <= left_ / min_bytes; }
  uint64_t left() const { return left_; }

 private:
  std::istream& in_;
  uint64_t left_;
};

void write_u64(std::ostream& out, uint64_t v);
/// One sample: u64 length L, L int32 ids, L int32 labels, u64 image count, per image u64 C, H, W and C*H*W float32.
void write_sample(std::ostream& out, const Sample& s);
/// Reads what write_sample wrote; false when it is malformed or runs past the file (checked before allocating).
bool read_sample(CacheReader& in, Sample& s);
/// The bytes a sample takes at least (its length and its image count).
constexpr uint64_t kMinSampleBytes = 16;

/// What a worker made of one chunk of rows. The items themselves are typed (ChunkOf<Item>); the threaded reader
/// sees only this base.
struct ChunkItems {
  virtual ~ChunkItems() = default;
};
template <typename Item>
struct ChunkOf : ChunkItems {
  std::vector<Item> items;
};

/// Encodes one parsed row into `chunk`, counting rows it drops (too long, nothing to train) in `skipped`; throws
/// BadRowError for a bad row.
using ErasedRowEncoder = std::function<void(const Json& row, const std::string& where, const fs::path& base_dir,
                                            ChunkItems& chunk, SkipCounts& skipped)>;

struct EncodedChunks {
  std::vector<std::unique_ptr<ChunkItems>> chunks;  // in input order
  int64_t rows = 0;
  SkipCounts skipped;
};

/// Streams the rows of every source in `specs` ("path[#N]") and encodes them on options.num_threads workers, in
/// chunks, each chunk on one worker in row order; a JSONL line that is not valid JSON is a BadRowError ("invalid
/// JSON"). With options.strict the first bad row in input order is rethrown after the workers stop; otherwise bad
/// rows are counted by reason. Throws IoError / FormatError as the readers do.
EncodedChunks encode_chunks(const std::vector<std::string>& specs, const DataOptions& options,
                            const std::function<std::unique_ptr<ChunkItems>()>& make_chunk,
                            const ErasedRowEncoder& encode);

/// Encodes one parsed row, appending what it makes to `out` (zero or more items); rows it drops are counted in
/// `skipped`. Throws BadRowError for a bad row.
template <typename Item>
using RowEncoder = std::function<void(const Json& row, const std::string& where, const fs::path& base_dir,
                                      std::vector<Item>& out, SkipCounts& skipped)>;

/// The items of `specs` in input order, with the rows read and skipped in `stats`.
template <typename Item>
std::vector<Item> encode_rows(const std::vector<std::string>& specs, const DataOptions& options,
                              const RowEncoder<Item>& encode, DataStats& stats) {
  EncodedChunks encoded = encode_chunks(
      specs, options, [] { return std::make_unique<ChunkOf<Item>>(); },
      [&](const Json& row, const std::string& where, const fs::path& base_dir, ChunkItems& chunk,
          SkipCounts& skipped) { encode(row, where, base_dir, static_cast<ChunkOf<Item>&>(chunk).items, skipped); });
  std::vector<Item> items;
  for (auto& chunk : encoded.chunks) {
    for (Item& item : static_cast<ChunkOf<Item>&>(*chunk).items) items.push_back(std::move(item));
  }
  stats.rows += encoded.rows;
  for (const auto& [reason, n] : encoded.skipped.by_reason) stats.skipped.add(reason, n);
  return items;
}

/// How one kind of item is stored in a cache file and counted in DataStats.
template <typename Item>
struct ItemCodec {
  std::array<char, 8> magic;  // the file's first 8 bytes: the kind of item and the layout version
  std::function<void(std::ostream&, const Item&)> write;
  std::function<bool(CacheReader&, Item&)> read;      // false: malformed (checked before allocating)
  std::function<uint64_t()> min_bytes;                // the fewest bytes one stored item takes
  std::function<void(const Item&, DataStats&)> count;  // adds the item's tokens and label tokens
};

template <typename Item>
struct PreparedItems {
  std::vector<Item> train;
  std::vector<Item> validation;
  DataStats stats;
};

/// Throws ConfigError when no dataset is given or split_dataset_ratio is outside [0, 1).
void check_data_options(const DataOptions& options);

/// How many of `rows` split_dataset_ratio holds out for validation, for every method (SFT, preference, KTO, GRPO):
/// ceil(ratio * rows), as Hugging Face datasets' train_test_split (which ms-swift calls) counts its test rows, and
/// never all of them. 0 for a ratio of 0.
size_t validation_rows(double ratio, size_t rows);

/// The cache file name's key: a hash of the dataset files' bytes, the data options and each of `settings`
/// (tokenizer, template, encoder and item-kind settings). Throws IoError when a dataset file cannot be read.
std::string cache_key(const DataOptions& options, const std::vector<std::string>& settings);

/// Cache header: magic, u64 length + JSON {"rows", "skipped"}, then the image manifest (u64 count; per file u64 path
/// length, path bytes, u8 present, u64 hash).
void write_cache_header(std::ostream& out, const std::array<char, 8>& magic, const DataStats& stats,
                        const ImageManifest* manifest);
/// Reads a header written by write_cache_header into stats.rows / stats.skipped; false when the magic differs, it
/// is malformed, or an image file of the manifest changed, appeared or vanished (re-hashed on `workers` threads).
bool read_cache_header(CacheReader& in, const std::array<char, 8>& magic, DataStats& stats, int workers);

/// Writes `items` as u64 count + each item by the codec.
template <typename Item>
void write_items(std::ostream& out, const std::vector<Item>& items, const ItemCodec<Item>& codec) {
  write_u64(out, items.size());
  for (const Item& item : items) codec.write(out, item);
}

/// Reads what write_items wrote; false when malformed (the count is checked against the bytes left first).
template <typename Item>
bool read_items(CacheReader& in, std::vector<Item>& items, const ItemCodec<Item>& codec) {
  uint64_t n = 0;
  if (!in.count(n, codec.min_bytes())) return false;
  items.resize(n);
  for (Item& item : items) {
    if (!codec.read(in, item)) return false;
  }
  return true;
}

/// Sets stats.samples, tokens and label_tokens from the items.
template <typename Item>
void count_items(DataStats& stats, const std::vector<Item>& train, const std::vector<Item>& validation,
                 const ItemCodec<Item>& codec) {
  stats.samples = static_cast<int64_t>(train.size() + validation.size());
  stats.tokens = 0;
  stats.label_tokens = 0;
  for (const auto* list : {&train, &validation}) {
    for (const Item& item : *list) codec.count(item, stats);
  }
}

/// Loads a cache file of `codec`'s kind: false when there is none, it is damaged or of another kind or version,
/// or an image it was built from changed.
template <typename Item>
bool load_cache(const fs::path& cache_file, PreparedItems<Item>& data, const ItemCodec<Item>& codec, int workers) {
  std::error_code ec;  // only a regular file is read (a FIFO there would block); AtomicFile refuses others
  if (!fs::is_regular_file(cache_file, ec)) return false;
  const uintmax_t size = fs::file_size(cache_file, ec);
  if (ec) return false;
  std::ifstream file(cache_file, std::ios::binary);
  if (!file) return false;
  CacheReader in(file, size);
  return read_cache_header(in, codec.magic, data.stats, workers) && read_items(in, data.train, codec) &&
         read_items(in, data.validation, codec) && in.left() == 0;
}

/// The whole preparation for one kind of item: the cache (when options.cache_dir is set) looked up under
/// cache_key(options, settings) and loaded when intact, else every row of options.dataset encoded on worker threads
/// in input order, the training items shuffled with options.seed (dataset_shuffle), validation taken from
/// options.val_dataset or split off the front of the shuffled items (split_dataset_ratio), and the result written
/// to the cache atomically. `manifest`, when given, is filled by `encode` with the image files the rows read and
/// stored in the cache header. Throws ConfigError for bad options, BadRowError (strict) and IoError / FormatError
/// as the readers do.
template <typename Item>
PreparedItems<Item> prepare_items(const DataOptions& options, const std::vector<std::string>& settings,
                                  const RowEncoder<Item>& encode, const ItemCodec<Item>& codec,
                                  ImageManifest* manifest) {
  const auto t0 = std::chrono::steady_clock::now();
  check_data_options(options);
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  PreparedItems<Item> data;
  fs::path cache_file;
  if (!options.cache_dir.empty()) {
    cache_file = options.cache_dir / ("tokenized-" + cache_key(options, settings) + ".bin");
    const int workers = options.num_threads > 0 ? options.num_threads : usable_cores();
    if (load_cache(cache_file, data, codec, workers)) {
      count_items(data.stats, data.train, data.validation, codec);
      data.stats.from_cache = true;
      data.stats.seconds = elapsed();
      return data;
    }
    data = PreparedItems<Item>{};  // no cache, a damaged one, or one whose images changed: rebuilt
  }

  std::vector<Item> train = encode_rows(options.dataset, options, encode, data.stats);
  std::mt19937_64 rng(options.seed);
  if (options.dataset_shuffle) std::shuffle(train.begin(), train.end(), rng);
  if (!options.val_dataset.empty()) {
    data.validation = encode_rows(options.val_dataset, options, encode, data.stats);
  } else if (options.split_dataset_ratio > 0) {
    const size_t n_val = validation_rows(options.split_dataset_ratio, train.size());
    data.validation.assign(std::make_move_iterator(train.begin()), std::make_move_iterator(train.begin() + n_val));
    train.erase(train.begin(), train.begin() + n_val);
  }
  data.train = std::move(train);
  count_items(data.stats, data.train, data.validation, codec);

  if (!cache_file.empty()) {
    create_folders(options.cache_dir);
    AtomicFile file(cache_file);
    write_cache_header(file.stream(), codec.magic, data.stats, manifest);
    write_items(file.stream(), data.train, codec);
    write_items(file.stream(), data.validation, codec);
    file.commit();
  }
  data.stats.seconds = elapsed();
  return data;
}

}  // namespace swiftcpp::data_detail
