// C interface of libswiftcpp_spm, the shim that keeps libsentencepiece (and the protobuf inside it) out of the
// symbol namespace LibTorch lives in. libswiftcpp never links the shim: it dlopens it with RTLD_DEEPBIND and
// looks these functions up by name (tokenizer/sentencepiece.cpp). Nothing here throws; every failure comes
// back as a non-zero status and a message copied into the caller's buffer.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Bumped whenever a signature below changes; the loader refuses a shim with another version.
#define SWIFTCPP_SPM_ABI_VERSION 1

/// Status codes. 0 is success; the others say which kind of error the message describes.
enum {
  SWIFTCPP_SPM_OK = 0,
  SWIFTCPP_SPM_IO_ERROR = 1,      // the model file could not be found or read
  SWIFTCPP_SPM_FORMAT_ERROR = 2,  // the file was read but sentencepiece rejected it
  SWIFTCPP_SPM_BAD_ARGUMENT = 3,  // an id out of range, a null pointer
  SWIFTCPP_SPM_INTERNAL = 4       // anything else (out of memory, an unexpected exception)
};

/// Bit flags returned by swiftcpp_spm_id_kind().
enum {
  SWIFTCPP_SPM_KIND_NORMAL = 0,
  SWIFTCPP_SPM_KIND_UNKNOWN = 1,
  SWIFTCPP_SPM_KIND_CONTROL = 2,
  SWIFTCPP_SPM_KIND_BYTE = 4,
  SWIFTCPP_SPM_KIND_UNUSED = 8
};

/// An opaque loaded sentencepiece model. All functions taking a const handle may be called from several
/// threads at once.
typedef struct swiftcpp_spm swiftcpp_spm;

/// SWIFTCPP_SPM_ABI_VERSION of the shim as built.
int swiftcpp_spm_abi_version(void);

/// Loads the model file at `path` (NUL-terminated). On success stores a handle in `*out` and returns
/// SWIFTCPP_SPM_OK; otherwise stores NULL, returns an error code and writes a message into `err`.
int swiftcpp_spm_load(const char* path, swiftcpp_spm** out, char* err, size_t err_size);

/// Frees a handle from swiftcpp_spm_load(); NULL is ignored.
void swiftcpp_spm_free(swiftcpp_spm* handle);

/// Encodes `text_size` bytes of UTF-8 into ids, without BOS or EOS. On success `*ids` (free it with
/// swiftcpp_spm_free_ids) holds `*n_ids` ids; it may be NULL when there are none.
int swiftcpp_spm_encode(const swiftcpp_spm* handle, const char* text, size_t text_size, int** ids,
                        size_t* n_ids, char* err, size_t err_size);

/// Frees an id array from swiftcpp_spm_encode(); NULL is ignored.
void swiftcpp_spm_free_ids(int* ids);

/// Decodes `n_ids` ids into text. On success `*text` (free it with swiftcpp_spm_free_string) holds
/// `*text_size` bytes followed by a NUL. Ids outside [0, vocab size) are SWIFTCPP_SPM_BAD_ARGUMENT.
int swiftcpp_spm_decode(const swiftcpp_spm* handle, const int* ids, size_t n_ids, char** text,
                        size_t* text_size, char* err, size_t err_size);

/// Frees a string from swiftcpp_spm_decode() or swiftcpp_spm_id_to_piece(); NULL is ignored.
void swiftcpp_spm_free_string(char* text);

/// Number of pieces in the vocabulary.
int swiftcpp_spm_vocab_size(const swiftcpp_spm* handle);

/// The piece of `id`, like swiftcpp_spm_decode() in how it returns text.
int swiftcpp_spm_id_to_piece(const swiftcpp_spm* handle, int id, char** piece, size_t* piece_size, char* err,
                             size_t err_size);

/// The id of a piece, or -1 when the piece is not in the vocabulary (sentencepiece itself answers with the
/// unknown id; this tells the two apart).
int swiftcpp_spm_piece_to_id(const swiftcpp_spm* handle, const char* piece, size_t piece_size);

/// The model's reserved ids, -1 where the model defines none.
int swiftcpp_spm_bos_id(const swiftcpp_spm* handle);
int swiftcpp_spm_eos_id(const swiftcpp_spm* handle);
int swiftcpp_spm_unk_id(const swiftcpp_spm* handle);
int swiftcpp_spm_pad_id(const swiftcpp_spm* handle);

/// SWIFTCPP_SPM_KIND_* flags of `id`, or -1 when `id` is outside [0, vocab size).
int swiftcpp_spm_id_kind(const swiftcpp_spm* handle, int id);

#ifdef __cplusplus
}  // extern "C"
#endif
