#include "data/pipeline.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
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
constexpr char kCacheMagic[8] = {'S', 'W', 'D', 'C', 'A', 'C', 'H', '1'};

struct Record {
  std::string where;
  std::string line;  // JSONL: the raw line, parsed by a worker
  Json value;        // JSON array: the parsed element
  bool is_line = false;
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
    if (!emit(std::move(r))) return;
    ++rows;
  }
  if (in.bad()) fail<IoError>("error while reading dataset '{}'", file);
}

ChunkResult process_chunk(std::vector<Record>& chunk, const SampleEncoder& encoder, const DataOptions& options) {
  ChunkResult out;
  for (Record& r : chunk) {
    ++out.rows;
    try {
      if (r.is_line) {
        std::string error;
        if (!try_parse_json(r.line, r.value, error)) throw BadRowError(r.where, "invalid JSON", error);
      }
      const Conversation c = normalise_row(r.value, r.where, options.system);
      std::optional<Sample> s = encoder.encode(c);
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
std::pair<std::vector<Sample>, DataStats> encode_sources(const std::vector<std::string>& specs, const SampleEncoder& encoder,
                                                         const DataOptions& options) {
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
      ChunkResult r = process_chunk(job.second, encoder, options);
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

void write_samples(std::ostream& out, const std::vector<Sample>& samples) {
  const uint64_t n = samples.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  for (const auto& s : samples) {
    const uint64_t len = s.input_ids.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(reinterpret_cast<const char*>(s.input_ids.data()), static_cast<std::streamsize>(len * 4));
    out.write(reinterpret_cast<const char*>(s.labels.data()), static_cast<std::streamsize>(len * 4));
  }
}

bool read_samples(std::istream& in, std::vector<Sample>& samples) {
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), 8) || n > (1ULL << 40)) return false;
  samples.resize(n);
  for (auto& s : samples) {
    uint64_t len = 0;
    if (!in.read(reinterpret_cast<char*>(&len), 8) || len > (1ULL << 32)) return false;
    s.input_ids.resize(len);
    s.labels.resize(len);
    if (!in.read(reinterpret_cast<char*>(s.input_ids.data()), static_cast<std::streamsize>(len * 4))) return false;
    if (!in.read(reinterpret_cast<char*>(s.labels.data()), static_cast<std::streamsize>(len * 4))) return false;
  }
  return true;
}

std::string cache_key(const DataOptions& o, const std::string& fingerprint) {
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
    cache_file = options.cache_dir / ("tokenized-" + cache_key(options, fingerprint) + ".bin");
    std::error_code cache_ec;  // only a regular file is read (a FIFO there would block); AtomicFile refuses others
    std::ifstream in;
    if (fs::is_regular_file(cache_file, cache_ec)) in.open(cache_file, std::ios::binary);
    char magic[8];
    if (in && in.read(magic, 8) && std::memcmp(magic, kCacheMagic, 8) == 0) {
      std::string stats_json(0, '\0');
      uint64_t len = 0;
      if (in.read(reinterpret_cast<char*>(&len), 8) && len < (1 << 24)) {
        stats_json.resize(len);
        in.read(stats_json.data(), static_cast<std::streamsize>(len));
        if (in && read_samples(in, data.train) && read_samples(in, data.validation)) {
          const Json j = Json::parse(stats_json, nullptr, false);
          if (j.is_object()) {
            data.stats.rows = j.value("rows", int64_t{0});
            const Json skipped = j.value("skipped", Json::object());  // kept alive for the loop below
            for (const auto& [reason, n] : skipped.items()) data.stats.skipped.add(reason, n.get<int64_t>());
          }
          finish_stats(data.stats, data.train, data.validation);
          data.stats.from_cache = true;
          data.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          return data;
        }
      }
      data = TokenizedData{};  // a damaged cache file is rebuilt
    }
  }

  auto [train, stats] = encode_sources(options.dataset, encoder, options);
  data.stats = stats;
  std::mt19937_64 rng(options.seed);
  if (options.dataset_shuffle) std::shuffle(train.begin(), train.end(), rng);
  if (!options.val_dataset.empty()) {
    auto [val, val_stats] = encode_sources(options.val_dataset, encoder, options);
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
