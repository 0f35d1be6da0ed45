#include "io/gguf.h"

#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string_view>

#include "core/error.h"

namespace swiftcpp {

namespace {
constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int64_t kBlock = 32;

uint16_t to_f16(float x) { return c10::Half(x).x; }
float from_f16(uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }
}  // namespace

std::string ggml_type_name(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q8_0: return "Q8_0";
  }
  return "type " + std::to_string(static_cast<uint32_t>(type));
}

GgmlType parse_ggml_type(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "f32") return GgmlType::F32;
  if (n == "f16") return GgmlType::F16;
  if (n == "q8_0") return GgmlType::Q8_0;
  if (n == "q4_0") return GgmlType::Q4_0;
  fail<ConfigError>("unknown GGUF tensor type '{}' (expected f32, f16, q8_0 or q4_0)", name);
}

int64_t ggml_block_size(GgmlType type) { return type == GgmlType::Q8_0 || type == GgmlType::Q4_0 ? kBlock : 1; }

int64_t ggml_row_bytes(GgmlType type, int64_t n) {
  switch (type) {
    case GgmlType::F32: return 4 * n;
    case GgmlType::F16: return 2 * n;
    case GgmlType::Q8_0: return n / kBlock * (2 + 32);
    case GgmlType::Q4_0: return n / kBlock * (2 + 16);
  }
  return 0;
}

void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock, out += 34) {
    float amax = 0;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t h = to_f16(d);
    std::memcpy(out, &h, 2);
    for (int j = 0; j < kBlock; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  }
}

void quantize_q4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock, out += 18) {
    float amax = 0, max = 0;
    for (int j = 0; j < kBlock; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t h = to_f16(d);
    std::memcpy(out, &h, 2);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      out[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void dequantize_row(GgmlType type, const uint8_t* data, int64_t n, float* out) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out, data, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = from_f16(h);
      }
      return;
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < n / kBlock; ++b, data += 34, out += kBlock) {
        uint16_t h;
        std::memcpy(&h, data, 2);
        const float d = from_f16(h);
        for (int j = 0; j < kBlock; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(data[2 + j]));
      }
      return;
    case GgmlType::Q4_0:
      for (int64_t b = 0; b < n / kBlock; ++b, data += 18, out += kBlock) {
        uint16_t h;
        std::memcpy(&h, data, 2);
        const float d = from_f16(h);
        for (int j = 0; j < 16; ++j) {
          out[j] = d * static_cast<float>((data[2 + j] & 0x0F) - 8);
          out[j + 16] = d * static_cast<float>((data[2 + j] >> 4) - 8);
        }
      }
      return;
  }
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t GgufTensorInfo::bytes() const {
  const int64_t row = dims.empty() ? 1 : dims[0];
  return ggml_row_bytes(type, row) * (numel() / std::max<int64_t>(1, row));
}

std::vector<int64_t> GgufTensorInfo::torch_shape() const { return {dims.rbegin(), dims.rend()}; }

// ---------------------------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------------------------

namespace {

class ByteSink {
 public:
  explicit ByteSink(std::ofstream& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    out_.write(reinterpret_cast<const char*>(&v), sizeof v);
    pos_ += sizeof v;
  }
  void bytes(const void* p, size_t n) {
    out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    pos_ += n;
  }
  void string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[64] = {};
    while (pos_ % alignment != 0) bytes(zeros, std::min<uint64_t>(64, alignment - pos_ % alignment));
  }
  uint64_t pos() const { return pos_; }

 private:
  std::ofstream& out_;
  uint64_t pos_ = 0;
};

void put_scalar(ByteSink& s, GgufType type, const Json& v, const std::string& key) {
  try {
    switch (type) {
      case GgufType::UINT8: s.put<uint8_t>(v.get<uint8_t>()); return;
      case GgufType::INT8: s.put<int8_t>(v.get<int8_t>()); return;
      case GgufType::UINT16: s.put<uint16_t>(v.get<uint16_t>()); return;
      case GgufType::INT16: s.put<int16_t>(v.get<int16_t>()); return;
      case GgufType::UINT32: s.put<uint32_t>(v.get<uint32_t>()); return;
      case GgufType::INT32: s.put<int32_t>(v.get<int32_t>()); return;
      case GgufType::FLOAT32: s.put<float>(v.get<float>()); return;
      case GgufType::BOOL: s.put<uint8_t>(v.get<bool>() ? 1 : 0); return;
      case GgufType::STRING: s.string(v.get<std::string>()); return;
      case GgufType::UINT64: s.put<uint64_t>(v.get<uint64_t>()); return;
      case GgufType::INT64: s.put<int64_t>(v.get<int64_t>()); return;
      case GgufType::FLOAT64: s.put<double>(v.get<double>()); return;
      case GgufType::ARRAY: break;
    }
  } catch (const Json::exception& e) {
    fail<ConfigError>("GGUF metadata {}: value {} does not fit its type: {}", key, v.dump().substr(0, 80), e.what());
  }
  fail<ConfigError>("GGUF metadata {}: nested arrays are not supported", key);
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, const at::Tensor& tensor, GgmlType type) {
  for (const auto& t : tensors_) {
    if (t.name == name) fail<ConfigError>("GGUF tensor {} added twice", name);
  }
  const int64_t row = tensor.dim() == 0 ? 1 : tensor.size(-1);
  if (row % ggml_block_size(type) != 0) {
    fail<ConfigError>("GGUF tensor {}: rows of {} elements do not divide into {} blocks of {}", name, row,
                      ggml_type_name(type), ggml_block_size(type));
  }
  tensors_.push_back({name, tensor.detach(), type});
}

void GgufWriter::write(const fs::path& file, uint64_t alignment) const {
  AtomicFile atomic(file);
  ByteSink s(atomic.stream());
  s.put<uint32_t>(kMagic);
  s.put<uint32_t>(3);
  s.put<uint64_t>(tensors_.size());
  const bool has_alignment =
      std::any_of(metadata_.begin(), metadata_.end(), [](const auto& kv) { return kv.first == "general.alignment"; });
  s.put<uint64_t>(metadata_.size() + (has_alignment || alignment == 32 ? 0 : 1));
  for (const auto& [key, v] : metadata_) {
    s.string(key);
    s.put<uint32_t>(static_cast<uint32_t>(v.type));
    if (v.type == GgufType::ARRAY) {
      if (!v.value.is_array()) fail<ConfigError>("GGUF metadata {}: an ARRAY value must be a JSON array", key);
      s.put<uint32_t>(static_cast<uint32_t>(v.element));
      s.put<uint64_t>(v.value.size());
      for (const auto& e : v.value) put_scalar(s, v.element, e, key);
    } else {
      put_scalar(s, v.type, v.value, key);
    }
  }
  if (!has_alignment && alignment != 32) {
    s.string("general.alignment");
    s.put<uint32_t>(static_cast<uint32_t>(GgufType::UINT32));
    s.put<uint32_t>(static_cast<uint32_t>(alignment));
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors_) {
    s.string(t.name);
    s.put<uint32_t>(static_cast<uint32_t>(std::max<int64_t>(1, t.tensor.dim())));
    if (t.tensor.dim() == 0) s.put<uint64_t>(1);
    for (int64_t d = t.tensor.dim() - 1; d >= 0; --d) s.put<uint64_t>(static_cast<uint64_t>(t.tensor.size(d)));
    s.put<uint32_t>(static_cast<uint32_t>(t.type));
    s.put<uint64_t>(offset);
    offsets.push_back(offset);
    const int64_t row = t.tensor.dim() == 0 ? 1 : t.tensor.size(-1);
    offset += static_cast<uint64_t>(ggml_row_bytes(t.type, row) * (t.tensor.numel() / row));
    offset = (offset + alignment - 1) / alignment * alignment;
  }
  s.pad_to(alignment);
  const uint64_t data_start = s.pos();
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    while (s.pos() - data_start < offsets[i]) s.put<uint8_t>(0);
    const at::Tensor f = t.tensor.to(at::kCPU, at::kFloat).contiguous();
    const int64_t n = f.numel();
    const float* x = f.data_ptr<float>();
    buffer.resize(static_cast<size_t>(ggml_row_bytes(t.type, n)));
    switch (t.type) {
      case GgmlType::F32: std::memcpy(buffer.data(), x, buffer.size()); break;
      case GgmlType::F16:
        for (int64_t j = 0; j < n; ++j) {
          const uint16_t h = to_f16(x[j]);
          std::memcpy(buffer.data() + 2 * j, &h, 2);
        }
        break;
      case GgmlType::Q8_0: quantize_q8_0(x, n, buffer.data()); break;
      case GgmlType::Q4_0: quantize_q4_0(x, n, buffer.data()); break;
    }
    s.bytes(buffer.data(), buffer.size());
  }
  s.pad_to(alignment);
  atomic.commit();
}

// ---------------------------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------------------------

namespace {

class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const fs::path& file) : base_(base), size_(size), file_(file) {}
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  // GGUF strings are UTF-8; others are refused here (JSON, which holds metadata values, cannot write them).
  std::string string(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(n));
    if (!valid_utf8(s)) fail<FormatError>("{}: {} at byte {} is not valid UTF-8", file_.string(), what, pos_);
    pos_ += n;
    return s;
  }
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) {
      fail<FormatError>("{}: truncated at byte {}: {} needs {} more bytes, the file has {}", file_.string(), pos_, what, n,
                        size_ - pos_);
    }
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const fs::path& file_;
};

// Bytes a metadata key/value takes at least (key length, type, one byte of value) and a tensor info (name length,
// dimension count, one dimension, type, offset): bounds on what counts a file of a given size can declare.
constexpr uint64_t kMinMetadataBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr uint64_t kMaxTensorElements = uint64_t{1} << 60;

// Bytes one scalar of `type` takes at least (a string: its length field); 0 for a type that is not a scalar.
uint64_t scalar_min_bytes(GgufType type) {
  switch (type) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 0;
  }
  return 0;
}

Json read_scalar(Cursor& c, GgufType type, const fs::path& file, const std::string& key, size_t at) {
  switch (type) {
    case GgufType::UINT8: return c.get<uint8_t>("a uint8");
    case GgufType::INT8: return c.get<int8_t>("an int8");
    case GgufType::UINT16: return c.get<uint16_t>("a uint16");
    case GgufType::INT16: return c.get<int16_t>("an int16");
    case GgufType::UINT32: return c.get<uint32_t>("a uint32");
    case GgufType::INT32: return c.get<int32_t>("an int32");
    case GgufType::FLOAT32: return c.get<float>("a float32");
    case GgufType::BOOL: {
      const uint8_t b = c.get<uint8_t>("a bool");
      if (b > 1) fail<FormatError>("{}: metadata {} at byte {}: bool byte {} (expected 0 or 1)", file.string(), key, at, b);
      return b == 1;
    }
    case GgufType::STRING: return c.string("a string");
    case GgufType::UINT64: return c.get<uint64_t>("a uint64");
    case GgufType::INT64: return c.get<int64_t>("an int64");
    case GgufType::FLOAT64: return c.get<double>("a float64");
    case GgufType::ARRAY: break;
  }
  fail<FormatError>("{}: metadata {} at byte {}: unknown value type {}", file.string(), key, at, static_cast<uint32_t>(type));
}

}  // namespace

std::shared_ptr<GgufFile> GgufFile::open(const fs::path& file) {
  std::shared_ptr<GgufFile> g(new GgufFile());
  g->path_ = file;
  require_regular_file(file, "GGUF file");
  // O_NONBLOCK: opening a FIFO does not wait for a writer; it is then refused as not a regular file.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail<IoError>("cannot open {}: {}", file.string(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail<IoError>("cannot stat {}", file.string());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail<IoError>("{} is not a regular file", file.string());
  }
  g->size_ = static_cast<size_t>(st.st_size);
  if (g->size_ > 0) {
    void* p = mmap(nullptr, g->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail<IoError>("cannot map {}", file.string());
    g->base_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  Cursor c(g->base_, g->size_, g->path_);
  if (c.get<uint32_t>("the magic 'GGUF'") != kMagic) {
    fail<FormatError>("{}: not a GGUF file (the first 4 bytes are not 'GGUF')", file.string());
  }
  g->version_ = c.get<uint32_t>("the version");
  if (g->version_ != 2 && g->version_ != 3) {
    fail<FormatError>("{}: GGUF version {} (expected 2 or 3)", file.string(), g->version_);
  }
  const uint64_t n_tensors = c.get<uint64_t>("the tensor count");
  const uint64_t n_kv = c.get<uint64_t>("the metadata count");
  // Counts the rest of the file cannot hold are refused before anything is read or reserved for them.
  const uint64_t left = g->size_ - c.pos();
  if (n_kv > left / kMinMetadataBytes) {
    fail<FormatError>("{}: header declares {} metadata entries; the {} bytes after it hold at most {}", file.string(),
                      n_kv, left, left / kMinMetadataBytes);
  }
  if (n_tensors > left / kMinTensorInfoBytes) {
    fail<FormatError>("{}: header declares {} tensors; the {} bytes after it hold at most {}", file.string(),
                      n_tensors, left, left / kMinTensorInfoBytes);
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.string("a metadata key");
    const size_t at = c.pos();
    GgufValue v;
    v.type = static_cast<GgufType>(c.get<uint32_t>("a metadata type"));
    if (v.type == GgufType::ARRAY) {
      v.element = static_cast<GgufType>(c.get<uint32_t>("an array element type"));
      const uint64_t n = c.get<uint64_t>("an array length");
      if (v.element == GgufType::ARRAY) fail<FormatError>("{}: metadata {}: nested arrays are not supported", file.string(), key);
      const uint64_t element_bytes = scalar_min_bytes(v.element);
      if (element_bytes == 0) {
        fail<FormatError>("{}: metadata {} at byte {}: unknown array element type {}", file.string(), key, at,
                          static_cast<uint32_t>(v.element));
      }
      if (n > (g->size_ - c.pos()) / element_bytes) {
        fail<FormatError>("{}: metadata {} at byte {}: array of {} elements of at least {} bytes each runs past the end "
                          "of the file ({} bytes left)", file.string(), key, at, n, element_bytes, g->size_ - c.pos());
      }
      v.value = Json::array();
      for (uint64_t j = 0; j < n; ++j) v.value.push_back(read_scalar(c, v.element, file, key, at));
    } else {
      v.value = read_scalar(c, v.type, file, key, at);
    }
    if (!g->metadata_.emplace(key, std::move(v)).second) {
      fail<FormatError>("{}: metadata key {} appears twice", file.string(), key);
    }
  }
  uint64_t alignment = 32;
  if (g->contains("general.alignment")) {
    const Json& a = g->metadata_["general.alignment"].value;
    if (!a.is_number_unsigned() || a.get<uint64_t>() == 0 || (a.get<uint64_t>() & (a.get<uint64_t>() - 1)) != 0) {
      fail<FormatError>("{}: general.alignment {} (expected a power of two)", file.string(), a.dump());
    }
    alignment = a.get<uint64_t>();
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.string("a tensor name");
    const uint32_t n_dims = c.get<uint32_t>("a tensor's dimension count");
    if (n_dims == 0 || n_dims > 4) fail<FormatError>("{}: tensor {}: {} dimensions (expected 1 to 4)", file.string(), t.name, n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.get<uint64_t>("a tensor dimension");
      if (dim == 0 || dim > (uint64_t{1} << 40)) fail<FormatError>("{}: tensor {}: dimension {}", file.string(), t.name, dim);
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    // numel() and bytes() must not overflow: at most 2^60 elements (8 bytes each, at most, in any type).
    uint64_t numel = 1;
    for (const int64_t d : t.dims) {
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) || numel > kMaxTensorElements) {
        fail<FormatError>("{}: tensor {}: dimensions {} describe more than 2^60 elements", file.string(), t.name,
                          fmt::join(t.dims, " x "));
      }
    }
    const uint32_t type = c.get<uint32_t>("a tensor type");
    if (type != 0 && type != 1 && type != 2 && type != 8) {
      fail<FormatError>("{}: tensor {}: ggml type {} is not supported (F32, F16, Q8_0, Q4_0 are)", file.string(), t.name, type);
    }
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % ggml_block_size(t.type) != 0) {
      fail<FormatError>("{}: tensor {}: rows of {} do not divide into {} blocks", file.string(), t.name, t.dims[0],
                        ggml_type_name(t.type));
    }
    t.offset = c.get<uint64_t>("a tensor offset");
    if (t.offset % alignment != 0) fail<FormatError>("{}: tensor {}: offset {} is not {}-aligned", file.string(), t.name, t.offset, alignment);
    if (!names.insert(t.name).second) fail<FormatError>("{}: tensor {} appears twice", file.string(), t.name);
    g->tensors_.push_back(std::move(t));
  }
  g->data_offset_ = (c.pos() + alignment - 1) / alignment * alignment;
  for (const auto& t : g->tensors_) {
    const uint64_t bytes = static_cast<uint64_t>(t.bytes());
    const uint64_t room = g->size_ >= g->data_offset_ ? g->size_ - g->data_offset_ : 0;
    if (t.offset > room || bytes > room - t.offset) {
      fail<FormatError>("{}: tensor {} ({} bytes at data offset {}) runs past the end of the file ({} bytes, data from "
                        "byte {}): truncated?", file.string(), t.name, bytes, t.offset, g->size_, g->data_offset_);
    }
  }
  return g;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
}

const GgufValue& GgufFile::at(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) fail<FormatError>("{}: metadata key {} is missing", path_.string(), key);
  return it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

at::Tensor GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* info = find_tensor(name);
  if (info == nullptr) fail<FormatError>("{}: no tensor {}", path_.string(), name);
  at::Tensor out = at::empty(info->torch_shape(), at::kFloat);
  dequantize_row(info->type, data(*info), info->numel(), out.data_ptr<float>());
  return out;
}

}  // namespace swiftcpp
