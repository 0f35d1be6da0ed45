#include "data/pipeline.h"

#include <ATen/ATen.h>
#include <array>

#include <algorithm>
#include <cmath>
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
#include "data/prepare.h"

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

namespace data_detail {

void ImageManifest::add(const fs::path& path) {
  const std::string key = path.string();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!entries_.emplace(key, std::nullopt).second) return;
  }
  const std::optional<uint64_t> h = hash_if_readable(path);
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = h;
}

std::optional<uint64_t> ImageManifest::hash_if_readable(const fs::path& path) {
  try {
    return hash_file(path);
  } catch (const IoError&) {
    return std::nullopt;
  }
}

bool CacheReader::read(void* dst, uint64_t n) {
  if (n > left_ || !in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n))) return false;
  left_ -= n;
  return true;
}

void write_u64(std::ostream& out, uint64_t v) { out.write(reinterpret_cast<const char*>(&v), 8); }

void write_sample(std::ostream& out, const Sample& s) {
  const uint64_t len = s.input_ids.size();
  write_u64(out, len);
  out.write(reinterpret_cast<const char*>(s.input_ids.data()), static_cast<std::streamsize>(len * 4));
  out.write(reinterpret_cast<const char*>(s.labels.data()), static_cast<std::streamsize>(len * 4));
  write_u64(out, s.pixel_values.size());
  TORCH_CHECK(s.image_grids.empty() || s.image_grids.size() == s.pixel_values.size(),
              "a sample's image grids do not match its images");
  for (size_t i = 0; i < s.pixel_values.size(); ++i) {
    const at::Tensor data = s.pixel_values[i].to(at::kFloat).contiguous();  // [C, H, W], [patches, C T P P], ...
    TORCH_CHECK(data.dim() >= 2 && data.dim() <= 4, "pixel_values of a sample must have 2 to 4 dims, got ",
                data.sizes());
    write_u64(out, static_cast<uint64_t>(data.dim()));
    for (int64_t d = 0; d < data.dim(); ++d) write_u64(out, static_cast<uint64_t>(data.size(d)));
    const std::array<int64_t, 3> grid = s.image_grids.empty() ? std::array<int64_t, 3>{0, 0, 0} : s.image_grids[i];
    for (const int64_t g : grid) write_u64(out, static_cast<uint64_t>(g));
    write_u64(out, static_cast<uint64_t>(i < s.image_tokens.size() ? s.image_tokens[i] : 0));
    out.write(reinterpret_cast<const char*>(data.data_ptr<float>()), static_cast<std::streamsize>(data.numel() * 4));
  }
}

bool read_sample(CacheReader& in, Sample& s) {
  uint64_t len = 0;
  if (!in.count(len, 8) || len > (1ULL << 32)) return false;  // ids and labels: 8 bytes per token
  s.input_ids.resize(len);
  s.labels.resize(len);
  if (!in.read(s.input_ids.data(), len * 4) || !in.read(s.labels.data(), len * 4)) return false;
  uint64_t images = 0;
  if (!in.count(images, 60)) return false;  // each image: its rank, two sizes, a grid, its tokens and a float
  bool any_grid = false;
  for (uint64_t i = 0; i < images; ++i) {
    uint64_t rank = 0;
    if (!in.u64(rank) || rank < 2 || rank > 4) return false;
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (uint64_t k = 0; k < rank; ++k) {
      uint64_t d = 0;
      if (!in.u64(d) || d == 0 || d > in.left() / 4 || numel > in.left() / 4 / d) return false;  // numel * 4 <= left
      numel *= d;
      shape.push_back(static_cast<int64_t>(d));
    }
    std::array<int64_t, 3> grid{};
    for (auto& g : grid) {
      uint64_t v = 0;
      if (!in.u64(v) || v > (1ULL << 20)) return false;
      g = static_cast<int64_t>(v);
    }
    uint64_t tokens = 0;
    if (!in.u64(tokens) || tokens > (1ULL << 20)) return false;
    const bool has_grid = grid[0] != 0;
    if ((has_grid && (grid[1] == 0 || grid[2] == 0)) || (i > 0 && has_grid != any_grid)) return false;
    any_grid = has_grid;
    if (tokens > 0) s.image_tokens.push_back(static_cast<int64_t>(tokens));
    at::Tensor image = at::empty(shape, at::kFloat);
    if (!in.read(image.data_ptr<float>(), numel * 4)) return false;
    s.pixel_values.push_back(std::move(image));
    if (has_grid) s.image_grids.push_back(grid);
  }
  if (!s.image_tokens.empty() && s.image_tokens.size() != s.pixel_values.size()) return false;
  return true;
}

namespace {

constexpr size_t kChunkRows = 256;

struct Record {
  std::string where;
  std::string line;  // JSONL: the raw line, parsed by a worker
  Json value;        // JSON array: the parsed element
  bool is_line = false;
  fs::path base_dir;  // the dataset file's folder: relative image paths start there
};

struct ChunkResult {
  std::unique_ptr<ChunkItems> items;
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

ChunkResult process_chunk(std::vector<Record>& chunk, const DataOptions& options,
                          const std::function<std::unique_ptr<ChunkItems>()>& make_chunk,
                          const ErasedRowEncoder& encode) {
  ChunkResult out;
  out.items = make_chunk();
  for (Record& r : chunk) {
    ++out.rows;
    try {
      if (r.is_line) {
        std::string error;
        if (!try_parse_json(r.line, r.value, error)) throw BadRowError(r.where, "invalid JSON", error);
      }
      encode(r.value, r.where, r.base_dir, *out.items, out.skipped);
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

}  // namespace

EncodedChunks encode_chunks(const std::vector<std::string>& specs, const DataOptions& options,
                            const std::function<std::unique_ptr<ChunkItems>()>& make_chunk,
                            const ErasedRowEncoder& encode) {
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
      ChunkResult r = process_chunk(job.second, options, make_chunk, encode);
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

  EncodedChunks out;
  for (auto& r : results) {
    if (r.error) std::rethrow_exception(r.error);  // the earliest bad row in input order
    out.rows += r.rows;
    for (const auto& [reason, n] : r.skipped.by_reason) out.skipped.add(reason, n);
    out.chunks.push_back(std::move(r.items));
  }
  return out;
}

size_t validation_rows(double ratio, size_t rows) {
  if (!(ratio > 0) || rows == 0) return 0;
  const auto held = static_cast<size_t>(std::ceil(ratio * static_cast<double>(rows)));
  return std::min(held, rows - 1);
}

void check_data_options(const DataOptions& options) {
  if (options.dataset.empty()) fail<ConfigError>("no dataset given (dataset: [path[#N], ...])");
  if (!(options.split_dataset_ratio >= 0 && options.split_dataset_ratio < 1)) {  // NaN fails both comparisons
    fail<ConfigError>("split_dataset_ratio must be in [0, 1), got {}", options.split_dataset_ratio);
  }
}

std::string cache_key(const DataOptions& o, const std::vector<std::string>& settings) {
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
  for (const std::string& s : settings) mix(s);
  return fmt::format("{:016x}", h);
}

void write_cache_header(std::ostream& out, const std::array<char, 8>& magic, const DataStats& stats,
                        const ImageManifest* manifest) {
  out.write(magic.data(), 8);
  const std::string stats_json = Json{{"rows", stats.rows}, {"skipped", stats.skipped.by_reason}}.dump();
  write_u64(out, stats_json.size());
  out.write(stats_json.data(), static_cast<std::streamsize>(stats_json.size()));
  if (manifest == nullptr) {
    write_u64(out, 0);
    return;
  }
  write_u64(out, manifest->entries().size());
  for (const auto& [path, hash] : manifest->entries()) {
    write_u64(out, path.size());
    out.write(path.data(), static_cast<std::streamsize>(path.size()));
    const char present = hash ? 1 : 0;
    out.write(&present, 1);
    write_u64(out, hash.value_or(0));
  }
}

bool read_cache_header(CacheReader& in, const std::array<char, 8>& magic, DataStats& stats, int workers) {
  char seen[8];
  if (!in.read(seen, 8) || std::memcmp(seen, magic.data(), 8) != 0) return false;
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
  stats.rows = j.at("rows").get<int64_t>();
  for (const auto& [reason, n] : j.at("skipped").items()) {
    if (!n.is_number_integer()) return false;
    stats.skipped.add(reason, n.get<int64_t>());
  }
  return true;
}

}  // namespace data_detail

namespace {

// Version 2 added the image manifest and each sample's pixel_values; version 3 images of any rank with their grids.
const data_detail::ItemCodec<Sample>& sample_codec() {
  static const data_detail::ItemCodec<Sample> codec{
      {'S', 'W', 'D', 'C', 'A', 'C', 'H', '3'},
      [](std::ostream& out, const Sample& s) { data_detail::write_sample(out, s); },
      [](data_detail::CacheReader& in, Sample& s) { return data_detail::read_sample(in, s); },
      [] { return data_detail::kMinSampleBytes; },
      [](const Sample& s, DataStats& stats) {
        stats.tokens += static_cast<int64_t>(s.input_ids.size());
        stats.label_tokens += s.label_tokens();
      }};
  return codec;
}

}  // namespace

TokenizedData prepare_data(const DataOptions& options, const SampleEncoder& encoder, const std::string& fingerprint) {
  // Image files are hashed only when there is a cache to key.
  data_detail::ImageManifest manifest;
  data_detail::ImageManifest* images = !options.cache_dir.empty() && encoder.options().images ? &manifest : nullptr;
  const data_detail::RowEncoder<Sample> encode = [&](const Json& row, const std::string& where,
                                                     const fs::path& base_dir, std::vector<Sample>& out,
                                                     SkipCounts& skipped) {
    const Conversation c = normalise_row(row, where, options.system, base_dir);
    if (images != nullptr) {
      for (const fs::path& image : c.images) images->add(image);
    }
    std::optional<Sample> s = encoder.encode(c);  // reads and preprocesses the row's images
    if (!s) {
      skipped.add("longer than max_length or nothing to train");
      return;
    }
    out.push_back(std::move(*s));
  };
  const std::string image_settings =
      encoder.options().images ? image_encoding_fingerprint(*encoder.options().images) : "text only";
  data_detail::PreparedItems<Sample> prepared =
      data_detail::prepare_items(options, {fingerprint, image_settings}, encode, sample_codec(), images);
  TokenizedData data;
  data.train = std::move(prepared.train);
  data.validation = std::move(prepared.validation);
  data.stats = std::move(prepared.stats);
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
