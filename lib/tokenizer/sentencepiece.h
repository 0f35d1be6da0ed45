// SentencePiece tokenizer. libsentencepiece lives in libswiftcpp_spm (tokenizer/spm_shim.cpp), a shim loaded at
// run time with RTLD_DEEPBIND so that its protobuf never meets LibTorch's in one symbol namespace.
#pragma once

#include <bitset>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/fs.h"
#include "tokenizer/tokenizer.h"

struct swiftcpp_spm;

namespace swiftcpp {

/// A loaded sentencepiece model. Immutable; encode/decode may run on several threads at once.
class SentencePieceTokenizer : public Tokenizer {
 public:
  /// Loads a sentencepiece model file (e.g. tokenizer.model). The shim library is loaded on first use, once per
  /// process, from the executable's folder, then `<executable folder>/../lib`, then the build tree.
  /// Throws IoError when the file is missing or unreadable, FormatError naming the file when sentencepiece
  /// rejects it, Error (listing the paths tried) when the shim cannot be loaded.
  static std::shared_ptr<SentencePieceTokenizer> load(const fs::path& model_file);

  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  /// Encodes UTF-8 text into ids without BOS/EOS. Sentencepiece's own normalisation applies, including the
  /// dummy "▁" prefix when the model asks for one. Text longer than 16 KiB is encoded in pieces cut at single
  /// spaces between ASCII letters or digits, when loading found that no piece of the model can span such a
  /// space (the result is then the same as one call; sentencepiece's cost and memory grow faster than
  /// linearly in the length of one call). Throws Error when sentencepiece fails.
  std::vector<int> encode(const std::string& text) const override;

  /// Encodes the whole text in one sentencepiece call (what encode() gives, without cutting long texts).
  /// Throws Error when sentencepiece fails.
  std::vector<int> encode_whole(std::string_view text) const;

  /// Whether encode() cuts long texts (see encode()). Does not throw.
  bool cuts_long_texts() const { return cut_chars_.any(); }
  /// Decodes ids into text; control ids (BOS, EOS) decode to nothing and the dummy prefix space is dropped.
  /// Throws Error when an id is outside [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const override;
  /// Number of pieces in the model. Does not throw.
  int vocab_size() const override { return vocab_size_; }
  /// The piece of `id`. Throws Error when `id` is outside [0, vocab_size()).
  std::string id_to_piece(int id) const override;
  /// The id of `piece`, -1 when the model has no such piece (unlike sentencepiece, which answers unk_id()).
  /// Does not throw.
  int piece_to_id(const std::string& piece) const override;
  /// The model's BOS id, -1 when it defines none. Does not throw.
  int bos_id() const override;
  /// The model's EOS id as a one-element list, empty when it defines none. Does not throw.
  std::vector<int> eos_ids() const override;
  /// The model's EOS id, -1 when it defines none. Does not throw.
  int eos_id() const;
  /// The model's unknown-piece id, -1 when it defines none. Does not throw.
  int unk_id() const;
  /// The model's padding id, -1 when it defines none (the usual case for Llama models). Does not throw.
  int pad_id() const;
  /// Whether `id` is a byte-fallback piece such as "<0x0A>"; false outside the vocabulary. Does not throw.
  bool is_byte(int id) const;
  /// Whether `id` is a control piece such as "<s>"; false outside the vocabulary. Does not throw.
  bool is_control(int id) const;
  /// Whether `id` is the unknown piece; false outside the vocabulary. Does not throw.
  bool is_unknown(int id) const;
  /// The file the model was loaded from.
  const fs::path& model_file() const { return model_file_; }

 private:
  SentencePieceTokenizer(swiftcpp_spm* handle, fs::path model_file);
  int id_kind(int id) const;

  swiftcpp_spm* handle_;
  fs::path model_file_;
  int vocab_size_ = 0;
  std::bitset<128> cut_chars_;  // ASCII characters a cut may have on both sides of its space (none: never cut)
};

}  // namespace swiftcpp
