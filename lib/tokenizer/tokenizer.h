// The model-facing tokenizer: an abstract Tokenizer (text <-> ids, no special tokens), the special tokens a
// checkpoint folder declares, and load_tokenizer(), which puts the two together from a Hugging Face folder.
//
// Special-token strings in text. encode() treats every character as text, so "<s>" or "<|im_start|>" typed by a
// user never becomes a control token. encode_with_special_tokens() maps those strings to their ids: chat
// templates render such strings into the prompt and need them parsed. For byte-level BPE the tokenizer.json
// added_tokens do it (lstrip/rstrip/single_word as Hugging Face does); for sentencepiece, TextTokenizer splits
// the text on the pieces of BOS/EOS/pad/unk and on tokenizer_config.json's added_tokens_decoder and encodes the
// parts in between with sentencepiece (one call per part, as the Hugging Face slow tokenizer does).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/fs.h"

namespace swiftcpp {

/// Text <-> token ids. Implementations are immutable after loading and safe to share between threads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Encodes UTF-8 text into ids, adding no BOS or EOS. Strings of special tokens ("<s>", "<|im_start|>") are
  /// encoded as text, never as the special token. Throws Error when the backend fails (FormatError for text that
  /// is not valid UTF-8, where the backend requires it).
  virtual std::vector<int> encode(const std::string& text) const = 0;
  /// Like encode(), except that the strings of the special and added tokens the tokenizer knows stand for those
  /// tokens. The default, for a tokenizer that knows no such strings, is encode(text). Throws like encode().
  virtual std::vector<int> encode_with_special_tokens(const std::string& text) const { return encode(text); }
  /// Decodes ids into UTF-8 text; control tokens such as BOS and EOS decode to nothing. A byte sequence that is
  /// not valid UTF-8 (a character cut in two) decodes to U+FFFD. Throws Error when an id is outside
  /// [0, vocab_size()).
  virtual std::string decode(const std::vector<int>& ids) const = 0;
  /// Like decode(), except that special tokens appear as their strings ("<|im_end|>"). The default is
  /// decode(ids). Throws like decode().
  virtual std::string decode_with_special_tokens(const std::vector<int>& ids) const { return decode(ids); }
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

/// A token matched as a whole in text before any other processing (tokenizer.json "added_tokens",
/// tokenizer_config.json "added_tokens_decoder").
struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false;      // a control token: decode() drops it, encode() without parsing ignores it
  bool lstrip = false;       // the match absorbs the whitespace on its left
  bool rstrip = false;       // the match absorbs the whitespace on its right
  bool normalized = false;   // matched in the normalized text rather than the raw text (byte-level BPE)
  bool single_word = false;  // only matches when no letter, digit or '_' touches it on either side
};

/// Finds added tokens in text the way Hugging Face tokenizers does: the leftmost match wins, the longest token
/// at that position first; a single_word match touched by a word character is dropped (its text stays text);
/// lstrip/rstrip extend the match over adjacent Unicode whitespace (never into an earlier match).
class AddedTokenMatcher {
 public:
  /// One match: text[begin, end) (including absorbed whitespace) stands for `tokens()[index]`.
  struct Match {
    size_t begin = 0;
    size_t end = 0;
    size_t index = 0;
  };

  AddedTokenMatcher() = default;
  /// Indexes `tokens`; empty contents are ignored. Does not throw except std::bad_alloc.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  /// Every match in `text`, left to right, non-overlapping. Does not throw except std::bad_alloc.
  std::vector<Match> find_all(std::string_view text) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::vector<size_t>> by_first_byte_;  // [256] -> indices into tokens_, longest content first
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
  /// Wraps `base`. `token_strings`, when not empty, are the special-token strings TextTokenizer itself splits
  /// the text on in encode_with_special_tokens() and renders in decode_with_special_tokens() (for backends such
  /// as sentencepiece that do not know them); when empty both calls go to `base`. Throws ConfigError when
  /// `specials` asks to add a BOS or EOS it does not define, or holds a negative id, or a token string has a
  /// negative id.
  TextTokenizer(std::shared_ptr<const Tokenizer> base, SpecialTokens specials,
                std::vector<AddedToken> token_strings = {});

  /// Encodes `text` and adds the special tokens: BOS first when add_bos, EOS (the first eos id) last when
  /// add_eos. With `parse_special`, special-token strings in `text` become their ids
  /// (encode_with_special_tokens()), otherwise they are text (encode()). Throws like encode().
  std::vector<int> encode_with_specials(const std::string& text, bool parse_special = false) const;

  /// The resolved special tokens.
  const SpecialTokens& specials() const { return specials_; }
  /// The backend tokenizer (SentencePieceTokenizer or BpeTokenizer).
  const Tokenizer& base() const { return *base_; }
  /// Whether `id` is one of the eos ids. Does not throw.
  bool is_eos(int id) const;

  std::vector<int> encode(const std::string& text) const override { return base_->encode(text); }
  /// Splits on the token strings given to the constructor, or asks the base when there are none.
  std::vector<int> encode_with_special_tokens(const std::string& text) const override;
  /// The base's decode, with the token strings given to the constructor handled here: special ones decode to
  /// nothing (as BOS and EOS), others to their text. Throws like the base for ids it does not know.
  std::string decode(const std::vector<int>& ids) const override;
  /// Whether decode() knows `id`: the base's vocabulary or one of the token strings. Models often have more
  /// embedding rows than their tokenizer has tokens; ids of those rows have no text. Does not throw.
  bool knows(int id) const;
  /// Renders the token strings given to the constructor, or asks the base when there are none.
  std::string decode_with_special_tokens(const std::vector<int>& ids) const override;
  int vocab_size() const override { return base_->vocab_size(); }
  int bos_id() const override { return specials_.bos.value_or(-1); }
  std::vector<int> eos_ids() const override { return specials_.eos; }
  /// The base's piece, or for an id past the base's vocabulary one of the token strings' (a sentencepiece model's
  /// added tokens: Qwen-style <|endoftext|> as BOS). Throws like the base for an id neither knows.
  std::string id_to_piece(int id) const override;
  int piece_to_id(const std::string& piece) const override { return base_->piece_to_id(piece); }

 private:
  /// Decodes with the token strings handled here: rendered as text (all of them with render_special, else the
  /// non-special ones, special ones dropped and base ids left to the base).
  std::string decode_added(const std::vector<int>& ids, bool render_special) const;

  std::shared_ptr<const Tokenizer> base_;
  SpecialTokens specials_;
  AddedTokenMatcher token_strings_;
};

/// Loads the tokenizer of a Hugging Face checkpoint folder, the first of:
///   tokenizer.json           byte-level BPE (BpeTokenizer). A tokenizer.json without a ByteLevel pre-tokenizer
///                            (Llama 2 and Mistral ship a sentencepiece-style one next to tokenizer.model) is
///                            skipped when tokenizer.model exists, and rejected (FormatError) when it does not;
///   tokenizer.model          sentencepiece;
///   vocab.json + merges.txt  GPT-2 style byte-level BPE, with tokenizer_config.json's added_tokens_decoder as
///                            the added tokens;
/// plus special tokens, each taken from the first of these that defines it:
///   generation_config.json (bos_token_id, eos_token_id as an int or a list, pad_token_id),
///   tokenizer_config.json  (bos_token, eos_token, pad_token as strings or {"content": ...} objects, looked up in
///                           added_tokens_decoder and then the vocabulary),
///   config.json            (bos_token_id, eos_token_id as an int or a list, pad_token_id),
///   the tokenizer's own: sentencepiece's bos/eos/pad ids, or the BOS/EOS of tokenizer.json's post-processor.
/// add_bos / add_eos come from tokenizer_config.json's add_bos_token and add_eos_token. Without them:
/// sentencepiece adds a BOS when one is defined (LlamaTokenizer) and no EOS; byte-level BPE adds what its
/// post-processor adds (TemplateProcessing, e.g. Llama 3's <|begin_of_text|>; nothing for GPT-2 and Qwen2).
/// For sentencepiece, the token strings parsed by encode_with_special_tokens() are the pieces of the BOS, EOS,
/// pad and unk ids and tokenizer_config.json's added_tokens_decoder; byte-level BPE uses its added_tokens.
/// Throws IoError when the folder is missing or holds none of the tokenizer files, FormatError when a file is
/// malformed or uses an unsupported component, ConfigError when a key has the wrong type or a token string is
/// not in the vocabulary, Error when the sentencepiece shim cannot be loaded.
std::shared_ptr<TextTokenizer> load_tokenizer(const fs::path& model_dir);

}  // namespace swiftcpp
