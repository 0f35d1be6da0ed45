// Llama-family models as GGUF files llama.cpp runs: export (architecture metadata, sentencepiece vocabulary,
// llama.cpp's tensor names, q/k rows permuted for the `llama` rotary layout, per-tensor fallback types) and the
// way back into the shared decoder.
#pragma once

#include <string>

#include "io/gguf.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {

struct GgufExportOptions {
  GgmlType type = GgmlType::F32;  // 2-D weights; norms and biases are always F32
  // With type Q4_0, the output projection (output.weight, or token_embd.weight when tied) is written as Q8_0, as
  // llama.cpp's quantizer keeps it wider than the rest (Q6_K there; this writer has no k-quants).
  bool wide_output = true;
  std::string name;               // general.name (default: the model folder's name)
};

/// What export_gguf wrote.
struct GgufExportReport {
  int64_t tensors = 0;
  int64_t fallback_tensors = 0;  // 2-D weights whose rows do not divide into the type's blocks, written as F16
  int64_t wide_tensors = 0;      // the output projection kept at Q8_0 in a Q4_0 file (wide_output)
  std::string architecture;
  std::string tokenizer_model;   // "llama" (sentencepiece) or "gpt2" (byte-level BPE)
  std::string pre_tokenizer;     // BPE: tokenizer.ggml.pre ("gpt-2", "llama-bpe", "qwen2", or "default")
  bool pre_tokenizer_known = true;  // BPE: false when the split regex has no llama.cpp name ("default" written)
};

/// The GGUF architecture llama.cpp uses for a model_type: llama, mistral and mixtral -> "llama", qwen2_moe ->
/// "qwen2moe", qwen2, qwen3, gemma, starcoder2 and phi3 as they are. Throws ConfigError for others, with the reason
/// for phi and gemma2 (llama.cpp's versions of them do not compute every checkpoint of the family).
std::string gguf_architecture(const std::string& model_type);

/// llama.cpp's converter layout of q_proj / k_proj rows for the `llama` architecture: within each head the two
/// rotate-half halves are interleaved. rows [heads * head_dim, in] -> same shape. permute_qk_inverse undoes it.
at::Tensor permute_qk(const at::Tensor& weight, int64_t heads);
at::Tensor permute_qk_inverse(const at::Tensor& weight, int64_t heads);

/// Writes `model` (weights as the decoder holds them, e.g. after merge_lora) with the tokenizer of `model_dir`
/// (tokenizer.model) and its special tokens and chat template to `file`, atomically. Throws ConfigError for an
/// unsupported architecture, rope scaling or tokenizer, IoError when writing fails.
GgufExportReport export_gguf(CausalLM& model, const fs::path& model_dir, const fs::path& file,
                             const GgufExportOptions& options);

/// The decoder configuration a GGUF's metadata describes. Throws FormatError naming the file and key.
DecoderConfig gguf_decoder_config(const GgufFile& file);

/// Builds the decoder from a GGUF file, weights decoded to float32 then converted to `options.dtype`. Throws
/// FormatError (missing or misshaped tensors listed together), ConfigError for an unsupported architecture.
CausalLM load_gguf_model(const fs::path& file, const LoadOptions& options = {});

/// Checks that `tokenizer` has the GGUF's vocabulary (tokenizer.ggml.tokens, piece for piece) so a GGUF is never run
/// with another model's tokenizer. Throws ConfigError naming both and the first differing id.
class Tokenizer;
void check_gguf_vocabulary(const GgufFile& file, const Tokenizer& tokenizer, const std::string& tokenizer_origin);

/// A model given as a Hugging Face folder or as a .gguf file, with its tokenizer. For a GGUF, tokenizer, templates
/// and generation defaults come from `tokenizer_dir` (default: the file's folder), whose vocabulary must be the
/// GGUF's; `assets_dir` says which folder that was. Throws ConfigError when a GGUF has no tokenizer folder, a
/// tokenizer_dir is given for a folder model, or the vocabularies differ; otherwise the loaders' errors.
class TextTokenizer;
struct ModelWithTokenizer {
  CausalLM model{nullptr};
  std::shared_ptr<TextTokenizer> tokenizer;
  fs::path assets_dir;
  bool gguf = false;
};
ModelWithTokenizer load_model_with_tokenizer(const std::string& model, const std::string& tokenizer_dir,
                                             const LoadOptions& options);

/// Sentencepiece model proto fields: pieces, scores and types (NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4,
/// UNUSED 5, BYTE 6; the numbering llama.cpp's token types use). Throws FormatError naming the file.
struct SentencePieceVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
};
SentencePieceVocab read_sentencepiece_vocab(const fs::path& tokenizer_model);

}  // namespace swiftcpp
