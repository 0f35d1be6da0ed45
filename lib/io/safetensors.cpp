#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"

namespace swiftcpp {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and is mapped as is; a big-endian host would need byte swapping");

namespace {

// The reference implementation rejects larger headers too; it keeps a hostile length from costing a huge parse.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kSupportedDtypes = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL";

struct DtypeName {
  const char* name;
  at::ScalarType type;
};

constexpr DtypeName kDtypes[] = {
    {"F64", at::ScalarType::Double}, {"F32", at::ScalarType::Float}, {"F16", at::ScalarType::Half},
    {"BF16", at::ScalarType::BFloat16}, {"I64", at::ScalarType::Long}, {"I32", at::ScalarType::Int},
    {"I16", at::ScalarType::Short}, {"I8", at::ScalarType::Char}, {"U8", at::ScalarType::Byte},
    {"BOOL", at::ScalarType::Bool},
};

std::optional<at::ScalarType> dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  return std::nullopt;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Hostile headers may hold huge strings; messages quote at most this much of one.
std::string clip(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 80) + "..."; }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Describes a JSON value without dumping it: dump() recurses and a hostile value may be nested deeply.
std::string describe(const Json& v) {
  if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
  if (v.is_string()) return "the string \"" + clip(v.get<std::string>()) + "\"";
  if (v.is_array()) return "an array of size " + std::to_string(v.size());
  return std::string("a JSON ") + v.type_name();
}

TensorInfo parse_entry(const std::string& origin, const std::string& name, const Json& entry, uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor '{}'", origin, clip(name));
  if (!entry.is_object())
    fail<FormatError>("{}: entry must be an object with dtype, shape and data_offsets, got {}", where,
                      describe(entry));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) fail<FormatError>("{}: entry has no '{}'", where, key);

  TensorInfo info;
  info.name = name;

  const Json& dtype = entry.at("dtype");
  if (!dtype.is_string()) fail<FormatError>("{}: dtype must be a string, got {}", where, describe(dtype));
  const auto type = dtype_from_name(dtype.get<std::string>());
  if (!type)
    fail<FormatError>("{}: unknown dtype '{}' (expected one of {})", where, clip(dtype.get<std::string>()),
                      kSupportedDtypes);
  info.dtype = *type;

  const Json& shape = entry.at("shape");
  if (!shape.is_array()) fail<FormatError>("{}: shape must be an array of integers, got {}", where, describe(shape));
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const Json& dim = shape[i];
    if (dim.is_number_unsigned() &&
        dim.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      info.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
      has_zero = has_zero || info.shape.back() == 0;
    } else if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      fail<FormatError>("{}: shape[{}] is {}, expected a non-negative integer", where, i, dim.get<int64_t>());
    } else {
      fail<FormatError>("{}: shape[{}] must be a non-negative 64-bit integer, got {}", where, i, describe(dim));
    }
  }

  // numel * itemsize, refusing shapes whose byte count does not fit in 63 bits. The product of the non-zero
  // dimensions is checked even when one is zero: LibTorch multiplies them all when it makes the tensor.
  uint64_t product = c10::elementSize(info.dtype);
  for (const int64_t d : info.shape)
    if (d != 0 && (__builtin_mul_overflow(product, static_cast<uint64_t>(d), &product) ||
                   product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      fail<FormatError>("{}: shape {} of dtype {} overflows a 64-bit byte count", where, shape_str(info.shape),
                        dtype.get<std::string>());
  const uint64_t expected = has_zero ? 0 : product;

  const Json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail<FormatError>("{}: data_offsets must be [begin, end] with two non-negative integers, got {}", where,
                      offsets.is_array() && offsets.size() == 2
                          ? "[" + describe(offsets[0]) + ", " + describe(offsets[1]) + "]"
                          : describe(offsets));
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.begin > info.end)
    fail<FormatError>("{}: data_offsets [{}, {}] begin after end", where, info.begin, info.end);
  if (info.end > data_size)
    fail<FormatError>("{}: data_offsets [{}, {}] end past the data section, which holds {} bytes", where,
                      info.begin, info.end, data_size);
  if (info.end - info.begin != expected)
    fail<FormatError>("{}: data_offsets [{}, {}] span {} bytes but dtype {} with shape {} needs {} bytes", where,
                      info.begin, info.end, info.end - info.begin, dtype.get<std::string>(), shape_str(info.shape),
                      expected);
  return info;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------------------
// SafetensorsFile

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile(path));
  file->map_file();
  file->parse_header();
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(base_, file_size_);
}

void SafetensorsFile::map_file() {
  require_regular_file(path_, "safetensors file");
  // O_NONBLOCK: opening a FIFO does not wait for a writer; it is then refused as not a regular file.
  const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail<IoError>("cannot open '{}': {}", path_.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail<IoError>("cannot stat '{}': {}", path_.string(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail<IoError>("'{}' is not a regular file", path_.string());
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ == 0) {  // nothing to map; parse_header reports the short file
    ::close(fd);
    return;
  }
  // Private and writable: tensors viewing the mapping are copy-on-write and the file is never modified.
  void* p = ::mmap(nullptr, file_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail<IoError>("cannot map '{}' ({} bytes): {}", path_.string(), file_size_, std::strerror(err));
  base_ = static_cast<uint8_t*>(p);
}

void SafetensorsFile::parse_header() {
  const std::string origin = path_.string();
  if (file_size_ < 8)
    fail<FormatError>("{}: file has {} bytes, fewer than the 8-byte header length of a safetensors file", origin,
                      file_size_);
  const uint64_t header_len = read_u64_le(base_);
  if (header_len > kMaxHeaderBytes)
    fail<FormatError>("{}: header length {} exceeds the limit of {} bytes (not a safetensors file?)", origin,
                      header_len, kMaxHeaderBytes);
  if (header_len > file_size_ - 8)
    fail<FormatError>("{}: header length {} runs past the end of the file ({} bytes after the length field)",
                      origin, header_len, file_size_ - 8);
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size_ - data_start_;

  const Json header =
      parse_json(std::string(reinterpret_cast<const char*>(base_ + 8), header_len), origin + " (header)");
  if (!header.is_object()) fail<FormatError>("{}: header must be a JSON object, got {}", origin, describe(header));

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() != kMetadataKey) {
      tensors_.push_back(parse_entry(origin, it.key(), it.value(), data_size));
      continue;
    }
    const Json& meta = it.value();
    if (!meta.is_object())
      fail<FormatError>("{}: __metadata__ must be an object of strings, got {}", origin, describe(meta));
    for (auto m = meta.begin(); m != meta.end(); ++m) {
      if (!m.value().is_string())
        fail<FormatError>("{}: __metadata__ value of '{}' must be a string, got {}", origin, clip(m.key()),
                          describe(m.value()));
      metadata_.emplace(m.key(), m.value().get<std::string>());
    }
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });

  // No two non-empty tensors may share a byte (holes between tensors are tolerated).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_)
    if (t.nbytes() > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (b.begin < a.end)
      fail<FormatError>("{}: tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", origin,
                        clip(b.name), b.begin, b.end, clip(a.name), a.begin, a.end);
  }
}

bool SafetensorsFile::contains(const std::string& name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name)
    fail<FormatError>("{}: no tensor named '{}' in this file", path_.string(), name);
  return *it;
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const auto options = at::TensorOptions().dtype(ti.dtype);
  if (ti.nbytes() == 0) return at::empty(ti.shape, options);
  uint8_t* data = base_ + data_start_ + ti.begin;
  if (ti.dtype == at::ScalarType::Bool) {
    // A bool byte other than 0 or 1 is undefined behaviour once LibTorch reads it as bool.
    const auto* bad = std::find_if(data, data + ti.nbytes(), [](uint8_t b) { return b > 1; });
    if (bad != data + ti.nbytes())
      fail<FormatError>("{}: tensor '{}': BOOL element {} holds byte {}, expected 0 or 1", path_.string(), name,
                        bad - data, static_cast<int>(*bad));
  }
  if (reinterpret_cast<uintptr_t>(data) % c10::elementSize(ti.dtype) != 0) {
    at::Tensor copy = at::empty(ti.shape, options);
    std::memcpy(copy.data_ptr(), data, ti.nbytes());
    return copy;
  }
  std::shared_ptr<const SafetensorsFile> keep_alive = shared_from_this();
  return at::from_blob(data, ti.shape, [keep_alive](void*) {}, options);
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoint

Checkpoint Checkpoint::open(const fs::path& dir_or_file) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir_or_file, ec);
  if (!fs::exists(status)) fail<IoError>("checkpoint '{}' does not exist", dir_or_file.string());

  Checkpoint ckpt;
  ckpt.path_ = dir_or_file;
  fs::path index;
  fs::path single;
  if (fs::is_directory(status)) {
    // Transformers' order: a single file wins over an index.
    const fs::path single_file = dir_or_file / "model.safetensors";
    const fs::path index_file = dir_or_file / "model.safetensors.index.json";
    if (fs::exists(single_file)) single = single_file;
    else if (fs::exists(index_file)) index = index_file;
    else
      fail<IoError>("checkpoint folder '{}' holds neither model.safetensors nor model.safetensors.index.json",
                    dir_or_file.string());
  } else {
    const std::string name = dir_or_file.filename().string();
    const std::string suffix = ".index.json";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      index = dir_or_file;
    else
      single = dir_or_file;
  }

  if (!single.empty()) {
    ckpt.files_.push_back(SafetensorsFile::open(single));
    for (const auto& t : ckpt.files_[0]->tensors()) ckpt.file_index_.emplace(t.name, 0);
    return ckpt;
  }

  // model.safetensors.index.json: {"metadata": {...}, "weight_map": {"<tensor>": "<shard file>", ...}}
  const std::string origin = index.string();
  const Json root = load_json_file(index);
  if (!root.is_object()) fail<FormatError>("{}: index must be a JSON object, got {}", origin, describe(root));
  const auto weight_map = root.find("weight_map");
  if (weight_map == root.end()) fail<FormatError>("{}: index has no 'weight_map'", origin);
  if (!weight_map->is_object())
    fail<FormatError>("{}: 'weight_map' must be an object mapping tensor names to shard files, got {}", origin,
                      describe(*weight_map));

  std::map<std::string, size_t> shard_ids;  // shard file name -> index into files_
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    const std::string& name = it.key();
    if (!it.value().is_string())
      fail<FormatError>("{}: weight_map entry of tensor '{}' must be a shard file name, got {}", origin, clip(name),
                        describe(it.value()));
    const std::string shard_name = it.value().get<std::string>();
    const fs::path rel(shard_name);
    const bool escapes = std::any_of(rel.begin(), rel.end(), [](const fs::path& part) { return part == ".."; });
    if (shard_name.empty() || rel.is_absolute() || escapes)
      fail<FormatError>("{}: weight_map entry of tensor '{}' names shard '{}', which is not a file inside the "
                        "checkpoint folder",
                        origin, clip(name), clip(shard_name));
    const fs::path shard = index.parent_path() / rel;
    const auto [slot, inserted] = shard_ids.emplace(shard_name, ckpt.files_.size());
    if (inserted) {
      if (!fs::exists(shard))
        fail<IoError>("{}: shard '{}' (listed for tensor '{}') does not exist", origin, shard.string(), clip(name));
      ckpt.files_.push_back(SafetensorsFile::open(shard));
    }
    if (!ckpt.files_[slot->second]->contains(name))
      fail<FormatError>("{}: tensor '{}' is listed in shard '{}', which does not hold it", origin, clip(name),
                        shard.string());
    ckpt.file_index_.emplace(name, slot->second);
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(file_index_.size());
  for (const auto& entry : file_index_) out.push_back(entry.first);
  return out;
}

bool Checkpoint::contains(const std::string& name) const { return file_index_.count(name) != 0; }

const SafetensorsFile& Checkpoint::file_for(const std::string& name) const {
  const auto it = file_index_.find(name);
  if (it == file_index_.end())
    fail<FormatError>("checkpoint '{}': no tensor named '{}'", path_.string(), name);
  return *files_[it->second];
}

const TensorInfo& Checkpoint::info(const std::string& name) const { return file_for(name).info(name); }

at::Tensor Checkpoint::tensor(const std::string& name) const { return file_for(name).tensor(name); }

fs::path Checkpoint::file_of(const std::string& name) const { return file_for(name).path(); }

// ---------------------------------------------------------------------------------------------------------
// Writer

void save_safetensors(const fs::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string origin = path.string();
  struct Item {
    const std::string* name;
    const at::Tensor* tensor;
    std::string dtype;
    uint64_t itemsize;
    uint64_t nbytes;
  };
  std::vector<Item> items;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) fail<FormatError>("{}: '{}' is reserved and cannot name a tensor", origin, name);
    if (!seen.insert(name).second) fail<FormatError>("{}: duplicate tensor name '{}'", origin, name);
    if (!t.defined()) fail<FormatError>("{}: tensor '{}' is undefined", origin, name);
    if (t.layout() != at::kStrided) fail<FormatError>("{}: tensor '{}' is not a dense (strided) tensor", origin, name);
    const at::ScalarType scalar_type = t.scalar_type();  // (a lambda cannot capture a structured binding in C++17)
    const auto dtype = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                    [&](const DtypeName& d) { return d.type == scalar_type; });
    if (dtype == std::end(kDtypes))
      fail<FormatError>("{}: tensor '{}' has dtype {}, which cannot be stored (supported: {})", origin, name,
                        c10::toString(t.scalar_type()), kSupportedDtypes);
    const uint64_t itemsize = c10::elementSize(t.scalar_type());
    items.push_back({&name, &t, dtype->name, itemsize, static_cast<uint64_t>(t.numel()) * itemsize});
  }
  // Larger elements first, no gaps: with the data start 8-byte aligned every tensor is aligned to its element.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.itemsize != b.itemsize ? a.itemsize > b.itemsize : *a.name < *b.name;
  });

  Json header = Json::object();
  uint64_t offset = 0;
  for (const Item& item : items) {
    header[*item.name] = {{"dtype", item.dtype},
                          {"shape", std::vector<int64_t>(item.tensor->sizes().begin(), item.tensor->sizes().end())},
                          {"data_offsets", {offset, offset + item.nbytes}}};
    offset += item.nbytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    fail<FormatError>("{}: a tensor name or metadata string is not valid UTF-8: {}", origin, e.what());
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  AtomicFile file(path);
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  file.stream().write(length, 8);
  file.stream().write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Item& item : items) {
    if (item.nbytes == 0) continue;
    const at::Tensor cpu = item.tensor->detach().to(at::kCPU).contiguous();
    file.stream().write(static_cast<const char*>(cpu.data_ptr()), static_cast<std::streamsize>(item.nbytes));
    if (!file.stream()) fail<IoError>("{}: error while writing tensor '{}'", origin, *item.name);
  }
  file.commit();
}

void write_checkpoint_folder(const fs::path& out_dir_given, const fs::path& source_dir,
                             const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                             const std::string& config_json) {
  // "out/" names the folder "out": the temporary folder goes beside it, not inside it.
  const fs::path out_dir = out_dir_given.has_filename() ? out_dir_given : out_dir_given.parent_path();
  const fs::path parent = out_dir.has_parent_path() ? out_dir.parent_path() : fs::path(".");
  create_folders(parent);
  std::error_code ec;
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", out_dir.filename().string(), getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail<IoError>("cannot create {}: {}", tmp.string(), ec.message());
  try {
    save_safetensors(tmp / "model.safetensors", tensors, {{"format", "pt"}});
    for (const std::string& name : model_asset_files()) {
      if (fs::exists(source_dir / name)) fs::copy_file(source_dir / name, tmp / name);
    }
    write_file_atomic(tmp / "config.json", config_json);
    replace_folder(tmp, out_dir);  // an existing folder is swapped out in one step
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    fail<IoError>("cannot write {}: {}", out_dir.string(), e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

const std::vector<std::string>& model_asset_files() {
  static const std::vector<std::string> names = {
      "generation_config.json", "tokenizer.json",   "tokenizer.model",          "tokenizer_config.json",
      "special_tokens_map.json", "vocab.json",      "merges.txt",               "chat_template.jinja",
      "chat_template.json",     "added_tokens.json", "preprocessor_config.json", "processor_config.json",
      "LICENSE"};
  return names;
}

}  // namespace swiftcpp
