// Byte-level BPE (GPT-2, Llama 3, Qwen2, ...): Hugging Face tokenizer.json, or the older vocab.json + merges.txt.
//
// Pipeline of encode(), as Hugging Face tokenizers runs it:
//   1. added tokens not marked `normalized` are cut out of the raw text (AddedTokenMatcher);
//   2. each remaining part is normalized (null, NFC through ICU, Sequence), then the `normalized` added tokens
//      are cut out of it;
//   3. each part is pre-tokenized: Split (Regex through PCRE2 with UTF and UCP, or String; Isolated, Removed,
//      MergedWithPrevious, MergedWithNext, Contiguous; invert), Digits, Punctuation, ByteLevel (prefix space,
//      GPT-2 regex), Sequence. Steps after ByteLevel see the byte-to-unicode image of the text, as in HF;
//   4. each pre-token is merged by rank (lowest rank first, leftmost first among equals) on its bytes; results
//      are cached per pre-token in a bounded, sharded cache whose lookups take no lock (inserts do).
// Decoding (ByteLevel decoder) concatenates the bytes of each token; a token whose vocabulary string has a
// character outside the byte-to-unicode image contributes its UTF-8 bytes as written (HF does the same).
// Components that change results but are not implemented are FormatErrors naming the file and the type.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

/// A loaded byte-level BPE tokenizer. Immutable apart from its internal cache; encode/decode may run on several
/// threads at once.
class BpeTokenizer : public Tokenizer {
 public:
  /// Loads a Hugging Face tokenizer.json. Throws IoError when the file is missing or unreadable, FormatError
  /// naming the file when it is not JSON, its model is not BPE, a merge names a token outside the vocabulary,
  /// a regex does not compile, or a normalizer, pre-tokenizer, decoder or post-processor is unsupported.
  static std::shared_ptr<BpeTokenizer> load(const fs::path& tokenizer_json);
  /// Builds from an already parsed tokenizer.json; `origin` names it in errors. Throws like load().
  static std::shared_ptr<BpeTokenizer> from_json(const Json& root, const std::string& origin);
  /// Loads a GPT-2 style vocab.json + merges.txt pair: ByteLevel pre-tokenizer with the GPT-2 regex, no prefix
  /// space, no normalizer, ByteLevel decoder; `added_tokens` are matched in the raw text. Throws IoError when a
  /// file is missing, FormatError naming the file (and the line of merges.txt) when one is malformed.
  static std::shared_ptr<BpeTokenizer> load_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt,
                                                         std::vector<AddedToken> added_tokens = {});
  /// Whether a parsed tokenizer.json describes a byte-level tokenizer (a ByteLevel pre-tokenizer, directly or
  /// in a Sequence). Does not throw.
  static bool is_byte_level(const Json& root);

  ~BpeTokenizer() override;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  /// Encodes UTF-8 text; added tokens marked special are encoded as text, the other added tokens match.
  /// Throws FormatError when `text` is not valid UTF-8, Error when the regex engine fails.
  std::vector<int> encode(const std::string& text) const override;
  /// Encodes UTF-8 text in which every added token, special or not, matches. Throws like encode().
  std::vector<int> encode_with_special_tokens(const std::string& text) const override;
  /// Decodes ids; special added tokens decode to nothing. Throws Error for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const override;
  /// Decodes ids; special added tokens appear as their content. Throws like decode().
  std::string decode_with_special_tokens(const std::vector<int>& ids) const override;
  /// One more than the largest id of the vocabulary and the added tokens. Does not throw.
  int vocab_size() const override;
  /// The BOS the post-processor adds, -1 when it adds none. Does not throw.
  int bos_id() const override;
  /// The EOS the post-processor adds as a one-element list, empty when it adds none. Does not throw.
  std::vector<int> eos_ids() const override;
  /// The vocabulary string of `id` as written in tokenizer.json ("Ġthe"), or an added token's content. Throws
  /// Error when `id` has no entry.
  std::string id_to_piece(int id) const override;
  /// The id of a vocabulary string or added-token content, -1 when there is none. Does not throw.
  int piece_to_id(const std::string& piece) const override;

  /// The added tokens (tokenizer.json added_tokens, or the ones given to load_vocab_merges()).
  const std::vector<AddedToken>& added_tokens() const;
  /// The BOS id TemplateProcessing (or RobertaProcessing/BertProcessing) puts before a single sequence.
  std::optional<int> template_bos() const;
  /// The EOS id the post-processor puts after a single sequence.
  std::optional<int> template_eos() const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace swiftcpp
