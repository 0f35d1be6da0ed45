// safetensors: a memory-mapped reader, sharded checkpoints (model.safetensors.index.json) and an atomic writer.
//
// File layout: u64 little-endian N | N bytes of JSON header | data.
// Header: {"<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//          "__metadata__": {"<key>": "<string value>", ...}}   (metadata optional)
// Offsets are byte offsets relative to the start of the data section, i.e. to byte 8 + N of the file.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace swiftcpp {

namespace fs = std::filesystem;

/// One tensor entry of a safetensors header, validated against the file.
struct TensorInfo {
  std::string name;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data start; end - begin == numel * itemsize

  /// Bytes the tensor occupies in the file.
  uint64_t nbytes() const { return end - begin; }
  /// Number of elements (1 for a 0-dim tensor).
  int64_t numel() const;
};

/// A read-only view of one .safetensors file. The file is mapped privately and writably (MAP_PRIVATE,
/// PROT_READ | PROT_WRITE), so the tensors it hands out are copy-on-write: writing to them never touches the
/// file and never faults.
class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  /// Maps `path` and validates the whole header against the file size (dtypes, shapes, offsets, sizes,
  /// overlaps, metadata). Throws IoError when the file cannot be opened or mapped, FormatError naming the
  /// file (and the tensor, where one is at fault) when it is malformed.
  static std::shared_ptr<SafetensorsFile> open(const fs::path& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  /// The path the file was opened from.
  const fs::path& path() const { return path_; }
  /// Every tensor of the file, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Whether the file holds a tensor of that name.
  bool contains(const std::string& name) const;
  /// The entry of a tensor. Throws FormatError naming the file and the tensor when it is absent.
  const TensorInfo& info(const std::string& name) const;
  /// A CPU tensor viewing the mapped bytes without copying; it keeps the mapping alive for as long as it
  /// lives. Data not aligned to its element size (possible in foreign files) is copied instead. Throws
  /// FormatError when the tensor is absent, or when a BOOL tensor holds bytes other than 0 and 1.
  at::Tensor tensor(const std::string& name) const;
  /// The "__metadata__" map of the header (empty when the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  explicit SafetensorsFile(fs::path path) : path_(std::move(path)) {}
  void map_file();
  void parse_header();

  fs::path path_;
  uint8_t* base_ = nullptr;  // the whole file, mapped
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// The weights of a model: a folder holding model.safetensors or a sharded model.safetensors.index.json,
/// an index file itself, or a single .safetensors file. Copies share the mapped files.
class Checkpoint {
 public:
  /// Opens a checkpoint folder or file. For a sharded checkpoint every shard named by the index's
  /// weight_map is opened and checked to hold the tensors the index assigns to it. Throws IoError when the
  /// path, the folder's weight file or a shard is missing or unreadable; FormatError naming the file (and the
  /// tensor) when the index or a shard is malformed.
  static Checkpoint open(const fs::path& dir_or_file);

  /// The path the checkpoint was opened from.
  const fs::path& path() const { return path_; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  /// Whether the checkpoint holds a tensor of that name.
  bool contains(const std::string& name) const;
  /// The entry of a tensor. Throws FormatError naming the checkpoint and the tensor when it is absent.
  const TensorInfo& info(const std::string& name) const;
  /// The tensor as a zero-copy CPU view of its file (see SafetensorsFile::tensor). Throws FormatError when
  /// it is absent.
  at::Tensor tensor(const std::string& name) const;
  /// The .safetensors file holding a tensor. Throws FormatError when it is absent.
  fs::path file_of(const std::string& name) const;

 private:
  const SafetensorsFile& file_for(const std::string& name) const;

  fs::path path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_index_;  // tensor name -> index into files_
};

/// Writes `tensors` (any device, any of the dtypes F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL; each is
/// copied to CPU contiguous memory one at a time) and `metadata` to `path` atomically: the file is written
/// under a temporary name and renamed into place, so an existing file survives any failure. The header is
/// padded with spaces so that the data starts 8-byte aligned; tensors are laid out without gaps, larger
/// element sizes first, so every tensor is aligned to its element size. Throws FormatError on an undefined
/// tensor, a duplicate or reserved ("__metadata__") name, an unsupported dtype or a name/metadata string that
/// is not valid UTF-8; IoError when the file cannot be written.
void save_safetensors(const fs::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The files of a Hugging Face checkpoint folder besides config.json and the weights that travel with a model
/// written from it (tokenizer, chat template, generation defaults, image processor, licence).
const std::vector<std::string>& model_asset_files();

/// Writes a Hugging Face checkpoint folder: `tensors` as model.safetensors, `config_json` as config.json, and the
/// tokenizer and generation files of `source_dir` copied. The folder is filled under a temporary name beside
/// `out_dir` and renamed into place (an existing `out_dir` is replaced only then); on failure nothing is left
/// behind. Throws IoError, and the errors of save_safetensors.
void write_checkpoint_folder(const fs::path& out_dir, const fs::path& source_dir,
                             const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                             const std::string& config_json);

}  // namespace swiftcpp
