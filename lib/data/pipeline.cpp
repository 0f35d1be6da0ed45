#include "data/pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/runtime.h"

namespace swiftcpp {

uint64_t hash_file(const fs::path& path, uint64_t seed) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("cannot open '{}' to hash it", path.string());
  uint64_t h = seed;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {  // word at a time: FNV-style multiply with an xor-shift
      uint64_t w;
      std::memcpy(&w, buf.data() + i, 8);
      h = (h ^ w) * 0x100000001b3ULL;
      h ^= h >> 29;
    }
    for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ULL;
    h ^= n;
  }
  return h;
}

namespace {

constexpr size_t kChunkRows = 256;
// Version 2 added the image manifest and each sample's pixel_values.
constexpr char kCacheMagic[8] = {'S', 'W', 'D', 'C', 'A', 'C', 'H', '2'};

struct Record {
  std::string where;
  std::string line;  // JSONL: the raw line, parsed by a worker
  Json value;        // JSON array: the parsed element
  bool is_line = false;
  fs::path base_dir;  // the dataset file's folder: relative image paths start there
};

// The content of every image file the rows reference, for the cache: each file hashed once, by the first worker
// that meets it, before any worker decodes it (so a file changed after hashing is seen as changed next time,
// never cached under its new hash with old pixels). A missing or unreadable file is recorded as such.
class ImageManifest {
 public:
  void add(const fs::path& path) {
    const std::string key = path.string();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!entries_.emplace(key, std::nullopt).second) return;
    }
    const std::optional<uint64_t> h = hash_if_readable(path);
    std::lock_guard<std::mutex> lock(mu_);
    entries_[key] = h;
  }
  // path -> hash (nullopt: missing or unreadable), sorted by path.
  const std::map<std::string, std::optional<uint64_t>>& entries() const { return entries_; }

  static std::optional<uint64_t> hash_if_readable(const fs::path& path) {
    try {
      return hash_file(path);
    } catch (const IoError&) {
      return std::nullopt;
    }
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::optional<uint64_t>> entries_;
};

struct ChunkResult {
  std::vector<Sample> samples;
  SkipCounts skipped;
  int64_t rows = 0;
  std::exception_ptr error;  // strict mode: the first bad row of this chunk
};

// Streams the records of one source: raw lines of a JSONL file (workers parse them), or the elements of a JSON
// array parsed one at a time.
void read_records(const DatasetSource& source, const std::function<bool(Record&&)>& emit) {
  const std::string file = source.path.string();
  require_regular_file(source.path, "dataset");
  std::ifstream in(source.path, std::ios::binary);
  if (!in) fail<IoError>("cannot open dataset '{}'", file);
  int64_t rows = 0;
  const int64_t limit = source.limit.value_or(INT64_MAX);
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {}
  if (!in) return;
  in.unget();
  if (first == '[') {
    // The JSON-array reader of dataset.cpp already streams elements; reuse it through for_each_row.
    in.close();
    struct Stop {};
    try {
      for_each_row(
          source,
          [&](Json&& row, const std::string& where) {
            Record r;
            r.where = where;
            r.value = std::move(row);
            r.base_dir = source.path.parent_path();
            if (!emit(std::move(r))) throw Stop{};
          },
          [](const std::string&, const std::string&, const std::string&) {});
    } catch (const Stop&) {
    }
    return;
  }
  std::string line;
  for (size_t number = 1; rows < limit && std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Record r;
    r.where = fmt::format("{}:{}", file, number);
    r.line = std::move(line);
    r.is_line = true;
    r.base_dir = source.path.parent_path();
    if (!emit(std::move(r))) return;
    ++rows;
  }
  if (in.bad()) fail<IoError>("error while reading dataset '{}'", file);
}

ChunkResult process_chunk(std::vector<Record>& chunk, const SampleEncoder& encoder, const DataOptions& options,
                          ImageManifest* manifest) {
  ChunkResult out;
  for (Record& r : chunk) {
    ++out.rows;
    try {
      if (r.is_line) {
        std::string error;
        if (!try_parse_json(r.line, r.value, error)) throw BadRowError(r.where, "invalid JSON", error);
      }
      const Conversation c = normalise_row(r.value, r.where, options.system, r.base_dir);
      if (manifest != nullptr) {
        for (const fs::path& image : c.images) manifest->add(image);
      }
      std::optional<Sample> s = encoder.encode(c);  // reads and preprocesses the row's images
      if (!s) {
        out.skipped.add("longer than max_length or nothing to train");
        continue;
      }
      out.samples.push_back(std::move(*s));
    } catch (const BadRowError& e) {
      if (options.strict) {
        out.error = std::current_exception();
        return out;
      }
      out.skipped.add(e.reason());
    }
  }
  return out;
}

// Reads all sources and encodes them on worker threads; samples come back in input order.
std::pair<std::vector<Sample>, DataStats> encode_sources(const std::vector<std::string>& specs,
                                                         const SampleEncoder& encoder, const DataOptions& options,
                                                         ImageManifest* manifest) {
  const int workers = options.num_threads > 0 ? options.num_threads : usable_cores();
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, std::vector<Record>>> queue;
  std::vector<ChunkResult> results;
  bool done_reading = false;
  bool failed = false;
  auto worker = [&] {
    while (true) {
      std::pair<size_t, std::vector<Record>> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !queue.empty() || done_reading; });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      cv.notify_all();
      ChunkResult r = process_chunk(job.second, encoder, options, manifest);
      std::lock_guard<std::mutex> lock(mu);
      if (r.error) failed = true;
      results[job.first] = std::move(r);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < workers; ++i) pool.emplace_back(worker);
  std::exception_ptr read_error;
  try {
    std::vector<Record> chunk;
    auto submit = [&]() {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return queue.size() < static_cast<size_t>(2 * workers) || failed; });
      results.emplace_back();
      queue.emplace_back(results.size() - 1, std::move(chunk));
      chunk.clear();
      cv.notify_all();
      return !failed;
    };
    bool go = true;
    for (const auto& spec : specs) {
      if (!go) break;
      read_records(parse_dataset_source(spec), [&](Record&& r) {
        chunk.push_back(std::move(r));
        if (chunk.size() >= kChunkRows) go = submit();
        return go;
      });
    }
    if (go && !chunk.empty()) submit();
  } catch (...) {
    read_error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done_reading = true;
  }
  cv.notify_all();
  for (auto& t : pool) t.join();
  if (read_error) std::rethrow_exception(read_error);

  std::vector<Sample> samples;
  DataStats stats;
  for (auto& r : results) {
    if (r.error) std::rethrow_exception(r.error);  // the earliest bad row in input order
    stats.rows += r.rows;
    for (const auto& [reason, n] : r.skipped.by_reason) stats.skipped.add(reason, n);
    for (auto& s : r.samples) samples.push_back(std::move(s));
  }
  return {std::move(samples), stats};
}

void write_u64(std::ostream& out, uint64_t v) { out.write(reinterpret_cast<const char*>(&v), 8); }

void write_samples(std::ostream& out, const std::vector<Sample>& samples) {
  write_u64(out, samples.size());
  for (const auto& s : samples) {
    const uint64_t len = s.input_ids.size();
    write_u64(out, len);
    out.write(reinterpret_cast<const char*>(s.input_ids.data()), static_cast<std::streamsize>(len * 4));
    out.write(reinterpret_cast<const char*>(s.labels.data()), static_cast<std::streamsize>(len * 4));
    write_u64(out, s.pixel_values.size());
    for (const at::Tensor& image : s.pixel_values) {
      TORCH_CHECK(image.dim() == 3, "pixel_values of a sample must be [C, H, W], got ", image.sizes());
      const at::Tensor data = image.to(at::kFloat).contiguous();  // [C, H, W]
      for (int64_t d = 0; d < 3; ++d) write_u64(out, static_cast<uint64_t>(data.size(d)));
      out.write(reinterpret_cast<const char*>(data.data_ptr<float>()), static_cast<std::streamsize>(data.numel() * 4));
    }
  }
}

// Reads the cache file with every length checked against the bytes left before anything is allocated for it.
class CacheReader {
 public:
  CacheReader(std::istream& in, uint64_t size) : in_(in), left_(size) {}
  bool read(void* dst, uint64_t n) {
    if (n > left_ || !in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n))) return false;
    left_ -= n;
    return true;
  }
  bool u64(uint64_t& v) { return read(&v, 8); }
  // A count of items each at least `min_bytes` long, which the bytes left could hold.
  bool count(uint64_t& n, uint64_t min_bytes) { return u64(n) && n <= left_ / min_bytes; }
  uint64_t left() const { return left_; }

 private:
  std::istream& in_;
  uint64_t left_;
};

bool read_samples(CacheReader& in, std::vector<Sample>& samples) {
  uint64_t n = 0;
  if (!in.count(n, 16)) return false;  // each sample: its length and image count at least
  samples.resize(n);
  for (auto& s : samples) {
    uint64_t len = 0;
    if (!in.count(len, 8) || len > (1ULL << 32)) return false;  // ids and labels: 8 bytes per token
    s.input_ids.resize(len);
    s.labels.resize(len);
    if (!in.read(s.input_ids.data(), len * 4) || !in.read(s.labels.data(), len * 4)) return false;
    uint64_t images = 0;
    if (!in.count(images, 28)) return false;  // each image: three sizes and at least one float
    for (uint64_t i = 0; i < images; ++i) {
      uint64_t dims[3];
      if (!in.u64(dims[0]) || !in.u64(dims[1]) || !in.u64(dims[2])) return false;
      uint64_t numel = 1;
      for (uint64_t d : dims) {
        if (d == 0 || d > in.left() / 4 || numel > in.left() / 4 / d) return false;  // numel * 4 <= bytes left
        numel *= d;
      }
      at::Tensor image = at::empty({static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1]),
                                    static_cast<int64_t>(dims[2])}, at::kFloat);  // [C, H, W]
      if (!in.read(image.data_ptr<float>(), numel * 4)) return false;
      s.pixel_values.push_back(std::move(image));
    }
  }
  return true;
}

void write_manifest(std::ostream& out, const ImageManifest& manifest) {
  write_u64(out, manifest.entries().size());
  for (const auto& [path, hash] : manifest.entries()) {
    write_u64(out, path.size());
    out.write(path.data(), static_cast<std::streamsize>(path.size()));
    const char present = hash ? 1 : 0;
    out.write(&present, 1);
    write_u64(out, hash.value_or(0));
  }
}

// Whether every image file recorded in the cache still has the recorded content (hashed again, each once, on
// `workers` threads); false when the manifest is malformed.
bool manifest_still_holds(CacheReader& in, int workers) {
  uint64_t n = 0;
  if (!in.count(n, 17)) return false;  // each entry: path length, presence byte, hash
  std::vector<std::pair<std::string, std::optional<uint64_t>>> entries(n);
  for (auto& [path, hash] : entries) {
    uint64_t len = 0;
    char present = 0;
    uint64_t h = 0;
    if (!in.count(len, 1)) return false;
    path.resize(len);
    if (!in.read(path.data(), len) || !in.read(&present, 1) || !in.u64(h) || (present != 0 && present != 1)) {
      return false;
    }
    if (present) hash = h;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> same{true};
  auto check = [&] {
    for (size_t i = next++; i < entries.size() && same; i = next++) {
      if (ImageManifest::hash_if_readable(entries[i].first) != entries[i].second) same = false;
    }
  };
  std::vector<std::thread> pool;
  const size_t threads = std::min<size_t>(static_cast<size_t>(std::max(1, workers)), entries.size());
  for (size_t i = 1; i < threads; ++i) pool.emplace_back(check);
  check();
  for (auto& t : pool) t.join();
  return same;
}

std::string cache_key(const DataOptions& o, const SampleEncoder& encoder, const std::string& fingerprint) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
  };
  for (const auto* list : {&o.dataset, &o.val_dataset}) {
    mix("list");
    for (const auto& spec : *list) {
      mix(spec);
      h = hash_file(parse_dataset_source(spec).path, h);
    }
  }
  mix(fmt::format("{}|{}|{}|{}|{}|{}", o.split_dataset_ratio, o.dataset_shuffle, o.seed, o.strict,
                  o.system.value_or("<none>"), o.system.has_value()));
  mix(fingerprint);
  mix(encoder.options().images ? image_encoding_fingerprint(*encoder.options().images) : "text only");
  return fmt::format("{:016x}", h);
}

void finish_stats(DataStats& stats, const std::vector<Sample>& train, const std::vector<Sample>& val) {
  stats.samples = static_cast<int64_t>(train.size() + val.size());
  stats.tokens = 0;
  stats.label_tokens = 0;
  for (const auto* list : {&train, &val}) {
    for (const auto& s : *list) {
      stats.tokens += static_cast<int64_t>(s.input_ids.size());
      stats.label_tokens += s.label_tokens();
    }
  }
}

// Loads a cache file written by prepare_data: false when there is none, it is damaged or of another version (every
// length is checked against the bytes left before anything is allocated), or an image it was built from changed.
bool load_cache(const fs::path& cache_file, TokenizedData& data, int workers) {
  std::error_code ec;  // only a regular file is read (a FIFO there would block); AtomicFile refuses others
  if (!fs::is_regular_file(cache_file, ec)) return false;
  const uintmax_t size = fs::file_size(cache_file, ec);
  if (ec) return false;
  std::ifstream file(cache_file, std::ios::binary);
  if (!file) return false;
  CacheReader in(file, size);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kCacheMagic, 8) != 0) return false;
  uint64_t len = 0;
  if (!in.count(len, 1) || len >= (1 << 24)) return false;
  std::string stats_json(len, '\0');
  if (!in.read(stats_json.data(), len)) return false;
  const Json j = Json::parse(stats_json, nullptr, false);
  if (!j.is_object() || !j.contains("rows") || !j.at("rows").is_number_integer() || !j.contains("skipped") ||
      !j.at("skipped").is_object()) {
    return false;
  }
  if (!manifest_still_holds(in, workers)) return false;
  if (!read_samples(in, data.train) || !read_samples(in, data.validation) || in.left() != 0) return false;
  data.stats.rows = j.at("rows").get<int64_t>();
  for (const auto& [reason, n] : j.at("skipped").items()) {
    if (!n.is_number_integer()) return false;
    data.stats.skipped.add(reason, n.get<int64_t>());
  }
  return true;
}

}  // namespace

TokenizedData prepare_data(const DataOptions& options, const SampleEncoder& encoder, const std::string& fingerprint) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.dataset.empty()) fail<ConfigError>("no dataset given (dataset: [path[#N], ...])");
  if (!(options.split_dataset_ratio >= 0 && options.split_dataset_ratio < 1)) {  // NaN fails both comparisons
    fail<ConfigError>("split_dataset_ratio must be in [0, 1), got {}", options.split_dataset_ratio);
  }
  TokenizedData data;
  fs::path cache_file;
  if (!options.cache_dir.empty()) {
    cache_file = options.cache_dir / ("tokenized-" + cache_key(options, encoder, fingerprint) + ".bin");
    const int workers = options.num_threads > 0 ? options.num_threads : usable_cores();
    if (load_cache(cache_file, data, workers)) {
      finish_stats(data.stats, data.train, data.validation);
      data.stats.from_cache = true;
      data.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return data;
    }
    data = TokenizedData{};  // no cache, a damaged one, or one whose images changed: rebuilt
  }

  // Image files are hashed only when there is a cache to key.
  ImageManifest manifest;
  ImageManifest* images = !cache_file.empty() && encoder.options().images ? &manifest : nullptr;
  auto [train, stats] = encode_sources(options.dataset, encoder, options, images);
  data.stats = stats;
  std::mt19937_64 rng(options.seed);
  if (options.dataset_shuffle) std::shuffle(train.begin(), train.end(), rng);
  if (!options.val_dataset.empty()) {
    auto [val, val_stats] = encode_sources(options.val_dataset, encoder, options, images);
    data.validation = std::move(val);
    data.stats.rows += val_stats.rows;
    for (const auto& [reason, n] : val_stats.skipped.by_reason) data.stats.skipped.add(reason, n);
  } else if (options.split_dataset_ratio > 0) {
    const size_t n_val = static_cast<size_t>(std::llround(options.split_dataset_ratio * static_cast<double>(train.size())));
    data.validation.assign(std::make_move_iterator(train.begin()), std::make_move_iterator(train.begin() + n_val));
    train.erase(train.begin(), train.begin() + n_val);
  }
  data.train = std::move(train);
  finish_stats(data.stats, data.train, data.validation);

  if (!cache_file.empty()) {
    create_folders(options.cache_dir);
    AtomicFile file(cache_file);
    auto& out = file.stream();
    out.write(kCacheMagic, 8);
    const std::string stats_json = Json{{"rows", data.stats.rows}, {"skipped", data.stats.skipped.by_reason}}.dump();
    const uint64_t len = stats_json.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(stats_json.data(), static_cast<std::streamsize>(len));
    write_manifest(out, manifest);
    write_samples(out, data.train);
    write_samples(out, data.validation);
    file.commit();
  }
  data.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return data;
}

std::string tokenizer_files_fingerprint(const fs::path& dir) {
  std::string fp;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json",
                           "generation_config.json", "config.json", "chat_template.jinja"}) {
    if (fs::exists(dir / name)) fp += fmt::format("{}={:016x};", name, hash_file(dir / name));
  }
  return fp;
}

}  // namespace swiftcpp
