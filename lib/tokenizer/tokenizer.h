// The model-facing tokenizer: an abstract Tokenizer (text <-> ids, no special tokens), the special tokens a
// checkpoint folder declares, and load_tokenizer(), which puts the two together from a Hugging Face folder.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.h"

namespace swiftcpp {

/// Text <-> token ids. Implementations are immutable after loading and safe to share between threads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Encodes UTF-8 text into ids, adding no BOS or EOS. Throws Error when the backend fails.
  virtual std::vector<int> encode(const std::string& text) const = 0;
  /// Decodes ids into UTF-8 text; control tokens such as BOS and EOS decode to nothing. Throws Error when an
  /// id is outside [0, vocab_size()).
  virtual std::string decode(const std::vector<int>& ids) const = 0;
  /// Number of ids the tokenizer knows. Does not throw.
  virtual int vocab_size() const = 0;
  /// The beginning-of-sequence id, -1 when there is none. Does not throw.
  virtual int bos_id() const = 0;
  /// The ids that end generation (several checkpoints declare more than one); empty when there are none.
  /// Does not throw.
  virtual std::vector<int> eos_ids() const = 0;
  /// The vocabulary entry of `id` (a sentencepiece piece such as "▁the" or "<0x0A>"). Throws Error when `id`
  /// is outside [0, vocab_size()).
  virtual std::string id_to_piece(int id) const = 0;
  /// The id of a vocabulary entry, -1 when `piece` is not in the vocabulary. Does not throw.
  virtual int piece_to_id(const std::string& piece) const = 0;
};

/// The special tokens of a checkpoint and whether plain encoding adds them.
struct SpecialTokens {
  std::optional<int> bos;
  std::vector<int> eos;
  bool add_bos = true;
  bool add_eos = false;
  std::optional<int> pad;
};

/// A Tokenizer together with the special tokens of its checkpoint. Its bos_id() and eos_ids() answer the
/// resolved special tokens, which may differ from the backend's own (generation_config.json wins).
class TextTokenizer : public Tokenizer {
 public:
  /// Wraps `base`. Throws ConfigError when `specials` asks to add a BOS or EOS it does not define, or holds a
  /// negative id.
  TextTokenizer(std::shared_ptr<const Tokenizer> base, SpecialTokens specials);

  /// Encodes `text` and adds the special tokens: BOS first when add_bos, EOS (the first eos id) last when
  /// add_eos. Throws like encode().
  std::vector<int> encode_with_specials(const std::string& text) const;

  /// The resolved special tokens.
  const SpecialTokens& specials() const { return specials_; }
  /// The backend tokenizer (sentencepiece for now).
  const Tokenizer& base() const { return *base_; }
  /// Whether `id` is one of the eos ids. Does not throw.
  bool is_eos(int id) const;

  std::vector<int> encode(const std::string& text) const override { return base_->encode(text); }
  std::string decode(const std::vector<int>& ids) const override { return base_->decode(ids); }
  int vocab_size() const override { return base_->vocab_size(); }
  int bos_id() const override { return specials_.bos.value_or(-1); }
  std::vector<int> eos_ids() const override { return specials_.eos; }
  std::string id_to_piece(int id) const override { return base_->id_to_piece(id); }
  int piece_to_id(const std::string& piece) const override { return base_->piece_to_id(piece); }

 private:
  std::shared_ptr<const Tokenizer> base_;
  SpecialTokens specials_;
};

/// Loads the tokenizer of a Hugging Face checkpoint folder: `tokenizer.model` (sentencepiece) plus special
/// tokens, each taken from the first of these that defines it:
///   generation_config.json (bos_token_id, eos_token_id as an int or a list, pad_token_id),
///   tokenizer_config.json  (bos_token, eos_token, pad_token as strings or {"content": ...} objects, looked up in
///                           added_tokens_decoder and then the vocabulary),
///   config.json            (bos_token_id, eos_token_id as an int or a list, pad_token_id),
///   the sentencepiece model's own bos/eos/pad ids.
/// add_bos / add_eos come from tokenizer_config.json's add_bos_token (default true, dropped silently only when
/// no BOS is defined anywhere) and add_eos_token (default false).
/// Throws IoError when the folder or tokenizer.model is missing (a folder with only tokenizer.json, a byte-level
/// BPE tokenizer, is not supported yet), FormatError when a file is malformed, ConfigError when a key has the
/// wrong type or a token string is not in the vocabulary, Error when the sentencepiece shim cannot be loaded.
std::shared_ptr<TextTokenizer> load_tokenizer(const fs::path& model_dir);

}  // namespace swiftcpp
