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

// Sanitizer runtimes refuse RTLD_DEEPBIND (their interceptors must see every call). Sanitizer builds load the shim
// (built without sanitizers) into a link namespace of its own instead: there the shim, libsentencepiece and the
// protobuf runtime inside it resolve symbols among themselves alone, as RTLD_DEEPBIND has them do, and never bind to
// LibTorch's protobuf. Memory crosses the boundary only through the shim's own free functions, so the namespace's
// separate C library heap is never mixed with ours.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SWIFTCPP_SPM_OWN_NAMESPACE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define SWIFTCPP_SPM_OWN_NAMESPACE 1
#endif
#endif

void* open_library(const fs::path& path) {
#ifdef SWIFTCPP_SPM_OWN_NAMESPACE
  return dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
#else
  // RTLD_DEEPBIND: the shim and libsentencepiece resolve symbols in their own dependencies first, so the protobuf
  // runtime linked into libsentencepiece binds to itself and not to LibTorch's protobuf. RTLD_LOCAL keeps their
  // symbols out of the global namespace for later libraries.
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
#endif
}

ShimApi open_shim() {
  std::string tried;
  for (const fs::path& candidate : shim_candidates()) {
    void* library = open_library(candidate);
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
  require_regular_file(model_file, "sentencepiece model");
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

namespace {

constexpr size_t kCutBytes = 16 * 1024;  // texts longer than this are encoded in pieces of about this size

// The piece sentencepiece writes for a space ("▁", U+2581).
const std::string kSpacePiece = "\xE2\x96\x81";

bool ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// Where a text may be cut: a single space whose neighbours are both in `cut_chars`; SIZE_MAX when there is no
// such space in [from, to).
size_t find_cut(std::string_view text, size_t from, size_t to, const std::bitset<128>& cut_chars, bool backwards) {
  const auto ok = [&](size_t i) {
    return i > 0 && i + 1 < text.size() && text[i] == ' ' && static_cast<unsigned char>(text[i - 1]) < 128 &&
           static_cast<unsigned char>(text[i + 1]) < 128 && cut_chars[static_cast<unsigned char>(text[i - 1])] &&
           cut_chars[static_cast<unsigned char>(text[i + 1])];
  };
  if (backwards) {
    for (size_t i = to; i-- > from;) if (ok(i)) return i;
  } else {
    for (size_t i = from; i < to; ++i) if (ok(i)) return i;
  }
  return SIZE_MAX;
}

// Encodes `text` cut at spaces between characters of `cut_chars` into pieces of about `piece_bytes`; the space
// at a cut is dropped (the next piece's dummy prefix stands for it).
template <typename Encode>
std::vector<int> encode_in_pieces(std::string_view text, size_t piece_bytes, const std::bitset<128>& cut_chars,
                                  const Encode& encode_whole) {
  std::vector<int> out;
  size_t start = 0;
  while (text.size() - start > piece_bytes) {
    const size_t target = start + piece_bytes;
    size_t cut = find_cut(text, start + piece_bytes / 2, target, cut_chars, /*backwards=*/true);
    if (cut == SIZE_MAX) cut = find_cut(text, target, text.size(), cut_chars, /*backwards=*/false);
    if (cut == SIZE_MAX) break;
    const std::vector<int> ids = encode_whole(text.substr(start, cut - start));
    out.insert(out.end(), ids.begin(), ids.end());
    start = cut + 1;
  }
  const std::vector<int> ids = encode_whole(text.substr(start));
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(swiftcpp_spm* handle, fs::path model_file)
    : handle_(handle), model_file_(std::move(model_file)), vocab_size_(shim().vocab_size(handle)) {
  // Long texts may be cut at "X Y" (X, Y ASCII letters or digits, both pieces of the model, and "▁" a piece too)
  // when no piece has a "▁" after another character: the normalised text then holds "X▁Y", no piece can span
  // X and "▁", and BPE merges and unigram segmentations on either side are independent. The right part's dummy
  // prefix "▁" stands for the dropped space. A probe checks this on sample text; any doubt disables cutting.
  try {
    if (piece_to_id(kSpacePiece) < 0) return;
    for (int id = 0; id < vocab_size_; ++id) {
      const int kind = id_kind(id);
      if (kind < 0 || (kind & (SWIFTCPP_SPM_KIND_CONTROL | SWIFTCPP_SPM_KIND_UNKNOWN | SWIFTCPP_SPM_KIND_BYTE)) != 0)
        continue;
      std::string_view piece;
      const std::string text = id_to_piece(id);
      piece = text;
      while (piece.substr(0, kSpacePiece.size()) == kSpacePiece) piece.remove_prefix(kSpacePiece.size());
      if (piece.find(kSpacePiece) != std::string_view::npos || piece.find(' ') != std::string_view::npos) return;
    }
    std::bitset<128> chars;
    for (int c = 0; c < 128; ++c) {
      if (ascii_alnum(static_cast<char>(c)) && piece_to_id(std::string(1, static_cast<char>(c))) >= 0) chars[c] = true;
    }
    const std::string probe =
        "Once upon a time 42 little cats and 7 dogs lived in a big house by the sea a b c 1 2 3 X Y Z end";
    const auto whole = [&](std::string_view t) { return encode_whole(t); };
    if (encode_in_pieces(probe, 4, chars, whole) == encode_whole(probe)) cut_chars_ = chars;
  } catch (const Error&) {
    cut_chars_.reset();
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() { shim().free(handle_); }

std::vector<int> SentencePieceTokenizer::encode(const std::string& text) const {
  if (text.size() <= kCutBytes || cut_chars_.none()) return encode_whole(text);
  return encode_in_pieces(text, kCutBytes, cut_chars_, [&](std::string_view t) { return encode_whole(t); });
}

std::vector<int> SentencePieceTokenizer::encode_whole(std::string_view text) const {
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
