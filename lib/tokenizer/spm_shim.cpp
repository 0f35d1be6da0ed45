// libswiftcpp_spm: the C interface of tokenizer/spm_shim.h over libsentencepiece. Built as a MODULE library
// that links libsentencepiece and nothing from LibTorch; libswiftcpp loads it with
// dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND), so the protobuf runtime inside libsentencepiece binds to itself
// and never to the (different) protobuf LibTorch carries. Linking both into one process crashes before main().
//
// Rules here: no exception crosses the C boundary (every entry point catches everything), and memory handed to
// the caller comes from malloc and goes back through the matching swiftcpp_spm_free_* function.
#include "spm_shim.h"  // same folder: the shim target has no include path of its own

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#define SWIFTCPP_SPM_EXPORT __attribute__((visibility("default")))

struct swiftcpp_spm {
  sentencepiece::SentencePieceProcessor processor;
  int vocab_size = 0;
};

namespace {

void write_error(char* err, size_t err_size, const char* message) {
  if (err == nullptr || err_size == 0) return;
  std::snprintf(err, err_size, "%s", message);
}

void write_error(char* err, size_t err_size, const std::string& message) {
  write_error(err, err_size, message.c_str());
}

// Runs `body`, turning any exception into SWIFTCPP_SPM_INTERNAL and a message.
template <typename Body>
int guarded(char* err, size_t err_size, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    write_error(err, err_size, "sentencepiece shim: out of memory");
  } catch (const std::exception& e) {
    write_error(err, err_size, std::string("sentencepiece shim: ") + e.what());
  } catch (...) {
    write_error(err, err_size, "sentencepiece shim: unknown exception");
  }
  return SWIFTCPP_SPM_INTERNAL;
}

bool in_range(const swiftcpp_spm* handle, int id) { return id >= 0 && id < handle->vocab_size; }

// Copies `size` bytes plus a NUL into malloc'd memory.
int copy_out(const std::string& value, char** text, size_t* text_size, char* err, size_t err_size) {
  char* buffer = static_cast<char*>(std::malloc(value.size() + 1));
  if (buffer == nullptr) {
    write_error(err, err_size, "sentencepiece shim: out of memory");
    return SWIFTCPP_SPM_INTERNAL;
  }
  std::memcpy(buffer, value.data(), value.size());
  buffer[value.size()] = '\0';
  *text = buffer;
  *text_size = value.size();
  return SWIFTCPP_SPM_OK;
}

}  // namespace

extern "C" {

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_abi_version(void) { return SWIFTCPP_SPM_ABI_VERSION; }

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_load(const char* path, swiftcpp_spm** out, char* err, size_t err_size) {
  if (out == nullptr) {
    write_error(err, err_size, "sentencepiece shim: null output handle");
    return SWIFTCPP_SPM_BAD_ARGUMENT;
  }
  *out = nullptr;
  if (path == nullptr) {
    write_error(err, err_size, "sentencepiece shim: null path");
    return SWIFTCPP_SPM_BAD_ARGUMENT;
  }
  return guarded(err, err_size, [&]() -> int {
    // Owned until it is handed out, so an exception from Load (protobuf reports fatal errors by throwing) frees it.
    auto owned = std::make_unique<swiftcpp_spm>();
    swiftcpp_spm* handle = owned.get();
    const sentencepiece::util::Status status = handle->processor.Load(path);
    if (!status.ok()) {
      const auto code = status.code();
      const std::string message = status.ToString();
      // A file that is not a serialised ModelProto fails in ParseFromArray with a source-location message.
      write_error(err, err_size,
                  message.find("ParseFromArray") != std::string::npos
                      ? "not a serialised sentencepiece model (protobuf parsing failed)"
                      : message);
      const bool io = code == sentencepiece::util::StatusCode::kNotFound ||
                      code == sentencepiece::util::StatusCode::kPermissionDenied;
      return io ? SWIFTCPP_SPM_IO_ERROR : SWIFTCPP_SPM_FORMAT_ERROR;
    }
    handle->vocab_size = handle->processor.GetPieceSize();
    if (handle->vocab_size <= 0) {
      write_error(err, err_size, "the model has an empty vocabulary");
      return SWIFTCPP_SPM_FORMAT_ERROR;
    }
    *out = owned.release();
    return SWIFTCPP_SPM_OK;
  });
}

SWIFTCPP_SPM_EXPORT void swiftcpp_spm_free(swiftcpp_spm* handle) {
  try {
    delete handle;
  } catch (...) {
  }
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_encode(const swiftcpp_spm* handle, const char* text, size_t text_size,
                                            int** ids, size_t* n_ids, char* err, size_t err_size) {
  if (handle == nullptr || ids == nullptr || n_ids == nullptr || (text == nullptr && text_size != 0)) {
    write_error(err, err_size, "sentencepiece shim: null argument to encode");
    return SWIFTCPP_SPM_BAD_ARGUMENT;
  }
  *ids = nullptr;
  *n_ids = 0;
  return guarded(err, err_size, [&]() -> int {
    std::vector<int> result;
    const sentencepiece::util::Status status =
        handle->processor.Encode(absl::string_view(text == nullptr ? "" : text, text_size), &result);
    if (!status.ok()) {
      write_error(err, err_size, status.ToString());
      return SWIFTCPP_SPM_INTERNAL;
    }
    if (result.empty()) return SWIFTCPP_SPM_OK;
    int* buffer = static_cast<int*>(std::malloc(result.size() * sizeof(int)));
    if (buffer == nullptr) {
      write_error(err, err_size, "sentencepiece shim: out of memory");
      return SWIFTCPP_SPM_INTERNAL;
    }
    std::memcpy(buffer, result.data(), result.size() * sizeof(int));
    *ids = buffer;
    *n_ids = result.size();
    return SWIFTCPP_SPM_OK;
  });
}

SWIFTCPP_SPM_EXPORT void swiftcpp_spm_free_ids(int* ids) { std::free(ids); }

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_decode(const swiftcpp_spm* handle, const int* ids, size_t n_ids, char** text,
                                            size_t* text_size, char* err, size_t err_size) {
  if (handle == nullptr || text == nullptr || text_size == nullptr || (ids == nullptr && n_ids != 0)) {
    write_error(err, err_size, "sentencepiece shim: null argument to decode");
    return SWIFTCPP_SPM_BAD_ARGUMENT;
  }
  *text = nullptr;
  *text_size = 0;
  for (size_t i = 0; i < n_ids; ++i) {
    if (!in_range(handle, ids[i])) {
      char message[160];
      std::snprintf(message, sizeof(message), "token id %d at position %zu is outside the vocabulary [0, %d)",
                    ids[i], i, handle->vocab_size);
      write_error(err, err_size, message);
      return SWIFTCPP_SPM_BAD_ARGUMENT;
    }
  }
  return guarded(err, err_size, [&]() -> int {
    const std::vector<int> input(ids, ids + n_ids);
    std::string result;
    const sentencepiece::util::Status status = handle->processor.Decode(input, &result);
    if (!status.ok()) {
      write_error(err, err_size, status.ToString());
      return SWIFTCPP_SPM_INTERNAL;
    }
    return copy_out(result, text, text_size, err, err_size);
  });
}

SWIFTCPP_SPM_EXPORT void swiftcpp_spm_free_string(char* text) { std::free(text); }

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_vocab_size(const swiftcpp_spm* handle) {
  return handle == nullptr ? 0 : handle->vocab_size;
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_id_to_piece(const swiftcpp_spm* handle, int id, char** piece,
                                                 size_t* piece_size, char* err, size_t err_size) {
  if (handle == nullptr || piece == nullptr || piece_size == nullptr) {
    write_error(err, err_size, "sentencepiece shim: null argument to id_to_piece");
    return SWIFTCPP_SPM_BAD_ARGUMENT;
  }
  *piece = nullptr;
  *piece_size = 0;
  if (!in_range(handle, id)) {
    char message[120];
    std::snprintf(message, sizeof(message), "token id %d is outside the vocabulary [0, %d)", id,
                  handle->vocab_size);
    write_error(err, err_size, message);
    return SWIFTCPP_SPM_BAD_ARGUMENT;
  }
  return guarded(err, err_size,
                 [&]() -> int { return copy_out(handle->processor.IdToPiece(id), piece, piece_size, err, err_size); });
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_piece_to_id(const swiftcpp_spm* handle, const char* piece, size_t piece_size) {
  if (handle == nullptr || (piece == nullptr && piece_size != 0)) return -1;
  try {
    const absl::string_view view(piece == nullptr ? "" : piece, piece_size);
    const int id = handle->processor.PieceToId(view);
    if (!in_range(handle, id)) return -1;
    // PieceToId answers the unknown id for pieces it does not know; only the unknown piece itself maps there.
    if (handle->processor.IsUnknown(id) && handle->processor.IdToPiece(id) != view) return -1;
    return id;
  } catch (...) {
    return -1;
  }
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_bos_id(const swiftcpp_spm* handle) {
  return handle == nullptr ? -1 : handle->processor.bos_id();
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_eos_id(const swiftcpp_spm* handle) {
  return handle == nullptr ? -1 : handle->processor.eos_id();
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_unk_id(const swiftcpp_spm* handle) {
  return handle == nullptr ? -1 : handle->processor.unk_id();
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_pad_id(const swiftcpp_spm* handle) {
  return handle == nullptr ? -1 : handle->processor.pad_id();
}

SWIFTCPP_SPM_EXPORT int swiftcpp_spm_id_kind(const swiftcpp_spm* handle, int id) {
  if (handle == nullptr || !in_range(handle, id)) return -1;
  try {
    int kind = SWIFTCPP_SPM_KIND_NORMAL;
    if (handle->processor.IsUnknown(id)) kind |= SWIFTCPP_SPM_KIND_UNKNOWN;
    if (handle->processor.IsControl(id)) kind |= SWIFTCPP_SPM_KIND_CONTROL;
    if (handle->processor.IsByte(id)) kind |= SWIFTCPP_SPM_KIND_BYTE;
    if (handle->processor.IsUnused(id)) kind |= SWIFTCPP_SPM_KIND_UNUSED;
    return kind;
  } catch (...) {
    return -1;
  }
}

}  // extern "C"
