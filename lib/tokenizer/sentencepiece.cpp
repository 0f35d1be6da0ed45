#include "tokenizer/sentencepiece.h"

#include <dlfcn.h>

#include <array>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "tokenizer/spm_shim.h"

#ifndef SWIFTCPP_SPM_SHIM_NAME
#define SWIFTCPP_SPM_SHIM_NAME "libswiftcpp_spm.so"
#endif

namespace swiftcpp {

namespace {

constexpr size_t kErrorSize = 1024;

// The shim's entry points, resolved once per process.
struct ShimApi {
  std::string path;
  decltype(&swiftcpp_spm_abi_version) abi_version = nullptr;
  decltype(&swiftcpp_spm_load) load = nullptr;
  decltype(&swiftcpp_spm_free) free = nullptr;
  decltype(&swiftcpp_spm_encode) encode = nullptr;
  decltype(&swiftcpp_spm_free_ids) free_ids = nullptr;
  decltype(&swiftcpp_spm_decode) decode = nullptr;
  decltype(&swiftcpp_spm_free_string) free_string = nullptr;
  decltype(&swiftcpp_spm_vocab_size) vocab_size = nullptr;
  decltype(&swiftcpp_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&swiftcpp_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&swiftcpp_spm_bos_id) bos_id = nullptr;
  decltype(&swiftcpp_spm_eos_id) eos_id = nullptr;
  decltype(&swiftcpp_spm_unk_id) unk_id = nullptr;
  decltype(&swiftcpp_spm_pad_id) pad_id = nullptr;
  decltype(&swiftcpp_spm_id_kind) id_kind = nullptr;
};

// Where to look for the shim, in order: next to the executable, <executable folder>/../lib, the build tree.
std::vector<fs::path> shim_candidates() {
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) {
    const fs::path dir = exe.parent_path();
    candidates.push_back(dir / SWIFTCPP_SPM_SHIM_NAME);
    candidates.push_back((dir / ".." / "lib" / SWIFTCPP_SPM_SHIM_NAME).lexically_normal());
  }
#ifdef SWIFTCPP_SPM_SHIM_BUILD_PATH
  const fs::path build_path = SWIFTCPP_SPM_SHIM_BUILD_PATH;
  bool seen = false;
  for (const auto& c : candidates) seen = seen || c == build_path;
  if (!seen) candidates.push_back(build_path);
#endif
  return candidates;
}

template <typename F>
void resolve(void* library, const std::string& path, const char* name, F& slot) {
  dlerror();
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    const char* why = dlerror();
    dlclose(library);
    fail<Error>("sentencepiece shim '{}' lacks the function '{}': {}", path, name, why ? why : "not found");
  }
  slot = reinterpret_cast<F>(symbol);
}

ShimApi open_shim() {
  std::string tried;
  for (const fs::path& candidate : shim_candidates()) {
    // RTLD_DEEPBIND: the shim and libsentencepiece resolve symbols in their own dependencies first, so the
    // protobuf runtime linked into libsentencepiece binds to itself and not to LibTorch's protobuf. RTLD_LOCAL
    // keeps their symbols out of the global namespace for later libraries.
    void* library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (library == nullptr) {
      const char* error = dlerror();
      const std::string why = error ? error : "unknown dlopen error";
      // dlerror() usually names the file already.
      tried += why.find(candidate.string()) == std::string::npos ? fmt::format("\n  {}: {}", candidate.string(), why)
                                                                  : "\n  " + why;
      continue;
    }
    ShimApi api;
    api.path = candidate.string();
    resolve(library, api.path, "swiftcpp_spm_abi_version", api.abi_version);
    if (const int version = api.abi_version(); version != SWIFTCPP_SPM_ABI_VERSION) {
      dlclose(library);
      fail<Error>("sentencepiece shim '{}' has interface version {}, this build expects {}; rebuild it", api.path,
                  version, SWIFTCPP_SPM_ABI_VERSION);
    }
    resolve(library, api.path, "swiftcpp_spm_load", api.load);
    resolve(library, api.path, "swiftcpp_spm_free", api.free);
    resolve(library, api.path, "swiftcpp_spm_encode", api.encode);
    resolve(library, api.path, "swiftcpp_spm_free_ids", api.free_ids);
    resolve(library, api.path, "swiftcpp_spm_decode", api.decode);
    resolve(library, api.path, "swiftcpp_spm_free_string", api.free_string);
    resolve(library, api.path, "swiftcpp_spm_vocab_size", api.vocab_size);
    resolve(library, api.path, "swiftcpp_spm_id_to_piece", api.id_to_piece);
    resolve(library, api.path, "swiftcpp_spm_piece_to_id", api.piece_to_id);
    resolve(library, api.path, "swiftcpp_spm_bos_id", api.bos_id);
    resolve(library, api.path, "swiftcpp_spm_eos_id", api.eos_id);
    resolve(library, api.path, "swiftcpp_spm_unk_id", api.unk_id);
    resolve(library, api.path, "swiftcpp_spm_pad_id", api.pad_id);
    resolve(library, api.path, "swiftcpp_spm_id_kind", api.id_kind);
    // The library stays loaded for the life of the process: unloading a protobuf runtime is not safe.
    return api;
  }
  fail<Error>("cannot load the sentencepiece shim {}; tried:{}", SWIFTCPP_SPM_SHIM_NAME, tried);
}

// Loaded on first use; a failed load throws and is retried on the next call.
const ShimApi& shim() {
  static const ShimApi api = open_shim();
  return api;
}

// Frees text returned by the shim when it goes out of scope.
struct ShimString {
  char* data = nullptr;
  size_t size = 0;
  ~ShimString() {
    if (data != nullptr) shim().free_string(data);
  }
  std::string str() const { return data == nullptr ? std::string() : std::string(data, size); }
};

}  // namespace

std::shared_ptr<SentencePieceTokenizer> SentencePieceTokenizer::load(const fs::path& model_file) {
  std::error_code ec;
  const auto status = fs::status(model_file, ec);
  if (!fs::exists(status)) fail<IoError>("sentencepiece model '{}' does not exist", model_file.string());
  if (fs::is_directory(status)) {
    fail<IoError>("sentencepiece model '{}' is a folder, not a model file", model_file.string());
  }
  const ShimApi& api = shim();
  std::array<char, kErrorSize> err{};
  swiftcpp_spm* handle = nullptr;
  const int code = api.load(model_file.c_str(), &handle, err.data(), err.size());
  if (code == SWIFTCPP_SPM_IO_ERROR) {
    fail<IoError>("cannot read sentencepiece model '{}': {}", model_file.string(), err.data());
  }
  if (code == SWIFTCPP_SPM_FORMAT_ERROR) {
    fail<FormatError>("'{}' is not a valid sentencepiece model: {}", model_file.string(), err.data());
  }
  if (code != SWIFTCPP_SPM_OK || handle == nullptr) {
    fail<Error>("loading sentencepiece model '{}' failed: {}", model_file.string(), err.data());
  }
  return std::shared_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(handle, model_file));
}

SentencePieceTokenizer::SentencePieceTokenizer(swiftcpp_spm* handle, fs::path model_file)
    : handle_(handle), model_file_(std::move(model_file)), vocab_size_(shim().vocab_size(handle)) {}

SentencePieceTokenizer::~SentencePieceTokenizer() { shim().free(handle_); }

std::vector<int> SentencePieceTokenizer::encode(const std::string& text) const {
  std::array<char, kErrorSize> err{};
  int* ids = nullptr;
  size_t n_ids = 0;
  if (shim().encode(handle_, text.data(), text.size(), &ids, &n_ids, err.data(), err.size()) != SWIFTCPP_SPM_OK) {
    fail<Error>("sentencepiece ({}) failed to encode {} bytes of text: {}", model_file_.string(), text.size(),
                err.data());
  }
  std::vector<int> result(ids, ids + n_ids);
  shim().free_ids(ids);
  return result;
}

std::string SentencePieceTokenizer::decode(const std::vector<int>& ids) const {
  std::array<char, kErrorSize> err{};
  ShimString text;
  if (shim().decode(handle_, ids.data(), ids.size(), &text.data, &text.size, err.data(), err.size()) !=
      SWIFTCPP_SPM_OK) {
    fail<Error>("sentencepiece ({}) failed to decode {} ids: {}", model_file_.string(), ids.size(), err.data());
  }
  return text.str();
}

std::string SentencePieceTokenizer::id_to_piece(int id) const {
  std::array<char, kErrorSize> err{};
  ShimString piece;
  if (shim().id_to_piece(handle_, id, &piece.data, &piece.size, err.data(), err.size()) != SWIFTCPP_SPM_OK) {
    fail<Error>("sentencepiece ({}): {}", model_file_.string(), err.data());
  }
  return piece.str();
}

int SentencePieceTokenizer::piece_to_id(const std::string& piece) const {
  return shim().piece_to_id(handle_, piece.data(), piece.size());
}

int SentencePieceTokenizer::bos_id() const { return shim().bos_id(handle_); }

std::vector<int> SentencePieceTokenizer::eos_ids() const {
  const int eos = eos_id();
  return eos >= 0 ? std::vector<int>{eos} : std::vector<int>{};
}

int SentencePieceTokenizer::eos_id() const { return shim().eos_id(handle_); }
int SentencePieceTokenizer::unk_id() const { return shim().unk_id(handle_); }
int SentencePieceTokenizer::pad_id() const { return shim().pad_id(handle_); }

int SentencePieceTokenizer::id_kind(int id) const { return shim().id_kind(handle_, id); }

bool SentencePieceTokenizer::is_byte(int id) const {
  const int kind = id_kind(id);
  return kind >= 0 && (kind & SWIFTCPP_SPM_KIND_BYTE) != 0;
}

bool SentencePieceTokenizer::is_control(int id) const {
  const int kind = id_kind(id);
  return kind >= 0 && (kind & SWIFTCPP_SPM_KIND_CONTROL) != 0;
}

bool SentencePieceTokenizer::is_unknown(int id) const {
  const int kind = id_kind(id);
  return kind >= 0 && (kind & SWIFTCPP_SPM_KIND_UNKNOWN) != 0;
}

}  // namespace swiftcpp
