// GGUF, llama.cpp's model file (version 3): magic "GGUF", version, tensor count, metadata count, typed metadata
// key/values, tensor infos (name, dimensions innermost first, ggml type, offset), padding to the alignment
// (general.alignment, default 32), then the tensor data, each tensor at an aligned offset. Little-endian.
// The writer and reader here, and the block codecs of the quantised types swiftcpp writes (Q8_0, Q4_0).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/fs.h"
#include "core/json.h"

namespace swiftcpp {

/// ggml tensor types swiftcpp reads and writes (values as in ggml.h).
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8 };

/// "F32", "F16", "Q4_0", "Q8_0".
std::string ggml_type_name(GgmlType type);
/// Parses "f32" | "f16" | "q8_0" | "q4_0" (any case). Throws ConfigError.
GgmlType parse_ggml_type(const std::string& name);
/// Elements per block: 1 for F32/F16, 32 for Q8_0/Q4_0.
int64_t ggml_block_size(GgmlType type);
/// Bytes of one row of `n` elements; n must be a multiple of the block size.
int64_t ggml_row_bytes(GgmlType type, int64_t n);

/// Q8_0: per block of 32, an f16 scale d = max|x| / 127 and 32 int8 values round(x / d). n % 32 == 0.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
/// Q4_0 (llama.cpp's reference rounding): per block of 32, m = the element of largest magnitude (sign kept),
/// d = m / -8, an f16 d, then 16 bytes: byte j holds element j in its low nibble and element j + 16 in its high
/// nibble, each min(15, trunc(x / d + 8.5)). n % 32 == 0.
void quantize_q4_0(const float* x, int64_t n, uint8_t* out);
/// Decodes `n` elements of `type` from `data` into float32.
void dequantize_row(GgmlType type, const uint8_t* data, int64_t n, float* out);

/// Metadata value types (gguf_type).
enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12
};

/// One metadata value: its type (and element type for arrays) and the value as JSON (numbers, bool, string, or
/// an array of those).
struct GgufValue {
  GgufType type = GgufType::STRING;
  GgufType element = GgufType::STRING;  // arrays only
  Json value;
};

/// One tensor as a GGUF file describes it.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: innermost (row length) first
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;        // from the start of the data section
  int64_t numel() const;
  int64_t bytes() const;
  /// The shape in LibTorch order (dims reversed): a [out, in] weight is stored as dims {in, out}.
  std::vector<int64_t> torch_shape() const;
};

/// Builds a GGUF file: metadata in insertion order, then tensors converted to their type when written.
class GgufWriter {
 public:
  void set(const std::string& key, GgufValue value);
  void set_string(const std::string& key, const std::string& v) { set(key, {GgufType::STRING, GgufType::STRING, v}); }
  void set_u32(const std::string& key, uint32_t v) { set(key, {GgufType::UINT32, GgufType::STRING, v}); }
  void set_i32(const std::string& key, int32_t v) { set(key, {GgufType::INT32, GgufType::STRING, v}); }
  void set_f32(const std::string& key, double v) { set(key, {GgufType::FLOAT32, GgufType::STRING, v}); }
  void set_bool(const std::string& key, bool v) { set(key, {GgufType::BOOL, GgufType::STRING, v}); }
  void set_array(const std::string& key, GgufType element, Json values) {
    set(key, {GgufType::ARRAY, element, std::move(values)});
  }

  /// Adds a tensor (any float dtype, any device; LibTorch shape) to be written as `type`. Throws ConfigError when
  /// the innermost dimension is not a multiple of the type's block size, or the name repeats.
  void add_tensor(const std::string& name, const at::Tensor& tensor, GgmlType type);

  /// Writes the file (to a temporary name, renamed into place). Throws IoError.
  void write(const fs::path& file, uint64_t alignment = 32) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  struct Pending {
    std::string name;
    at::Tensor tensor;
    GgmlType type;
  };
  std::vector<Pending> tensors_;
};

/// A GGUF file mapped read-only. Opening validates the header, every metadata entry, every tensor info and that
/// every tensor lies inside the file; errors are FormatError naming the file, the byte offset and what was expected.
class GgufFile {
 public:
  static std::shared_ptr<GgufFile> open(const fs::path& file);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const fs::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  /// The value of `key`; throws FormatError naming the file when it is missing.
  const GgufValue& at(const std::string& key) const;
  bool contains(const std::string& key) const { return metadata_.count(key) > 0; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  /// A tensor decoded to float32, in LibTorch shape. Throws FormatError for an unknown name.
  at::Tensor tensor(const std::string& name) const;
  /// The raw bytes of a tensor.
  const uint8_t* data(const GgufTensorInfo& info) const { return base_ + data_offset_ + info.offset; }

 private:
  GgufFile() = default;
  fs::path path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace swiftcpp
