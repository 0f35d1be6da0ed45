#include "tokenizer/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/bpe.h"
#include "tokenizer/sentencepiece.h"

namespace swiftcpp {

namespace {

// The code point that ends at text[end) (text is valid UTF-8 up to there); `len` gets its byte length.
char32_t code_point_before(std::string_view text, size_t end, size_t& len) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80 && end - begin < 4) --begin;
  len = end - begin;
  const auto at = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[k])); };
  const char32_t b0 = at(begin);
  if (len == 1 || b0 < 0xC0) return len = 1, b0;
  if (len == 2) return ((b0 & 0x1F) << 6) | (at(begin + 1) & 0x3F);
  if (len == 3) return ((b0 & 0x0F) << 12) | ((at(begin + 1) & 0x3F) << 6) | (at(begin + 2) & 0x3F);
  return ((b0 & 0x07) << 18) | ((at(begin + 1) & 0x3F) << 12) | ((at(begin + 2) & 0x3F) << 6) | (at(begin + 3) & 0x3F);
}

char32_t code_point_after(std::string_view text, size_t begin, size_t& len) {
  const auto at = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[k])); };
  const char32_t b0 = at(begin);
  len = b0 < 0xC0 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  if (begin + len > text.size()) return len = 1, b0;
  if (len == 1) return b0;
  if (len == 2) return ((b0 & 0x1F) << 6) | (at(begin + 1) & 0x3F);
  if (len == 3) return ((b0 & 0x0F) << 12) | ((at(begin + 1) & 0x3F) << 6) | (at(begin + 2) & 0x3F);
  return ((b0 & 0x07) << 18) | ((at(begin + 1) & 0x3F) << 12) | ((at(begin + 2) & 0x3F) << 6) | (at(begin + 3) & 0x3F);
}

// Unicode White_Space (Rust's char::is_whitespace).
bool is_space(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)) != 0; }

// Alphabetic, numeric or '_' (Rust's char::is_alphanumeric, plus the underscore).
bool is_word(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  return cp == '_' || u_isUAlphabetic(c) || (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : by_first_byte_(256) {
  for (AddedToken& token : tokens) {
    if (!token.content.empty()) tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
  }
}

std::vector<AddedTokenMatcher::Match> AddedTokenMatcher::find_all(std::string_view text) const {
  std::vector<Match> matches;
  if (tokens_.empty()) return matches;
  size_t previous_end = 0;
  size_t i = 0;
  while (i < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[i])];
    size_t hit = tokens_.size();
    for (size_t index : bucket) {
      const std::string& content = tokens_[index].content;
      if (content.size() <= text.size() - i && std::memcmp(text.data() + i, content.data(), content.size()) == 0) {
        hit = index;
        break;
      }
    }
    if (hit == tokens_.size()) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[hit];
    size_t begin = i, end = i + token.content.size(), len = 0;
    if (token.single_word) {
      const bool word_before = begin > 0 && is_word(code_point_before(text, begin, len));
      const bool word_after = end < text.size() && is_word(code_point_after(text, end, len));
      if (word_before || word_after) {
        i = end;
        continue;
      }
    }
    if (token.lstrip) {
      while (begin > previous_end && is_space(code_point_before(text, begin, len))) begin -= len;
    }
    if (token.rstrip) {
      while (end < text.size() && is_space(code_point_after(text, end, len))) end += len;
    }
    matches.push_back(Match{begin, end, hit});
    previous_end = i = end;
  }
  return matches;
}

TextTokenizer::TextTokenizer(std::shared_ptr<const Tokenizer> base, SpecialTokens specials,
                             std::vector<AddedToken> token_strings)
    : base_(std::move(base)), specials_(std::move(specials)) {
  for (const AddedToken& token : token_strings) {
    if (token.id < 0) fail<ConfigError>("special token '{}' has the negative id {}", token.content, token.id);
  }
  token_strings_ = AddedTokenMatcher(std::move(token_strings));
  if (!base_) fail<ConfigError>("TextTokenizer needs a tokenizer");
  if (specials_.bos && *specials_.bos < 0) fail<ConfigError>("BOS id {} is negative", *specials_.bos);
  if (specials_.pad && *specials_.pad < 0) fail<ConfigError>("pad id {} is negative", *specials_.pad);
  for (int id : specials_.eos) {
    if (id < 0) fail<ConfigError>("EOS id {} is negative", id);
  }
  if (specials_.add_bos && !specials_.bos) fail<ConfigError>("add_bos is set but no BOS token is defined");
  if (specials_.add_eos && specials_.eos.empty()) fail<ConfigError>("add_eos is set but no EOS token is defined");
}

std::vector<int> TextTokenizer::encode_with_specials(const std::string& text, bool parse_special) const {
  std::vector<int> body = parse_special ? encode_with_special_tokens(text) : base_->encode(text);
  std::vector<int> ids;
  ids.reserve(body.size() + 2);
  if (specials_.add_bos) ids.push_back(*specials_.bos);
  ids.insert(ids.end(), body.begin(), body.end());
  if (specials_.add_eos) ids.push_back(specials_.eos.front());
  return ids;
}

std::vector<int> TextTokenizer::encode_with_special_tokens(const std::string& text) const {
  if (token_strings_.empty()) return base_->encode_with_special_tokens(text);
  std::vector<int> ids;
  const auto encode_part = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    const std::vector<int> part = base_->encode(text.substr(begin, end - begin));
    ids.insert(ids.end(), part.begin(), part.end());
  };
  size_t pos = 0;
  for (const AddedTokenMatcher::Match& m : token_strings_.find_all(text)) {
    encode_part(pos, m.begin);
    ids.push_back(token_strings_.tokens()[m.index].id);
    pos = m.end;
  }
  encode_part(pos, text.size());
  return ids;
}

std::string TextTokenizer::decode_added(const std::vector<int>& ids, bool render_special) const {
  std::string text;
  std::vector<int> run;
  for (int id : ids) {
    const AddedToken* token = nullptr;
    for (const AddedToken& candidate : token_strings_.tokens()) {
      if (candidate.id == id) {
        token = &candidate;
        break;
      }
    }
    // decode(): ids of the base vocabulary go to the base (a token string may name a base piece too).
    if (token == nullptr || (!render_special && id >= 0 && id < base_->vocab_size())) {
      run.push_back(id);
      continue;
    }
    if (!run.empty()) text += base_->decode(run);
    run.clear();
    if (render_special || !token->special) text += token->content;
  }
  if (!run.empty()) text += base_->decode(run);
  return text;
}

std::string TextTokenizer::decode(const std::vector<int>& ids) const {
  if (token_strings_.empty()) return base_->decode(ids);
  return decode_added(ids, /*render_special=*/false);
}

bool TextTokenizer::knows(int id) const {
  if (id >= 0 && id < base_->vocab_size()) return true;
  for (const AddedToken& t : token_strings_.tokens()) {
    if (t.id == id) return true;
  }
  return false;
}

std::string TextTokenizer::decode_with_special_tokens(const std::vector<int>& ids) const {
  if (token_strings_.empty()) return base_->decode_with_special_tokens(ids);
  return decode_added(ids, /*render_special=*/true);
}

std::string TextTokenizer::id_to_piece(int id) const {
  if (id >= base_->vocab_size()) {
    for (const AddedToken& t : token_strings_.tokens()) {
      if (t.id == id) return t.content;
    }
  }
  return base_->id_to_piece(id);
}

bool TextTokenizer::is_eos(int id) const {
  return std::find(specials_.eos.begin(), specials_.eos.end(), id) != specials_.eos.end();
}

namespace {

std::optional<JsonObject> load_if_present(const fs::path& path) {
  if (!fs::exists(path)) return std::nullopt;
  return JsonObject::load(path);
}

// An id key holding an int or a list of ints (eos_token_id in generation_config.json / config.json).
std::optional<std::vector<int>> find_id_list(const JsonObject& obj, const std::string& key) {
  if (!obj.has(key)) return std::nullopt;
  const Json& value = obj.raw().at(key);
  const auto bad = [&]() {
    fail<ConfigError>("{}: key '{}' must be a token id or a list of token ids, got {}", obj.origin(), key,
                      describe_json(value));
  };
  std::vector<int> ids;
  if (value.is_number_integer()) {
    ids.push_back(value.get<int>());
  } else if (value.is_array()) {
    for (const Json& item : value) {
      if (!item.is_number_integer()) bad();
      ids.push_back(item.get<int>());
    }
  } else {
    bad();
  }
  for (int id : ids) {
    if (id < 0) bad();
  }
  return ids;
}

std::optional<int> find_id(const JsonObject& obj, const std::string& key) {
  const auto id = obj.find<int>(key);
  if (id && *id < 0) fail<ConfigError>("{}: key '{}' must be a non-negative token id, got {}", obj.origin(), key, *id);
  return id;
}

// A token of tokenizer_config.json ("<s>" or {"content": "<s>", ...}) mapped to its id through
// added_tokens_decoder and then the sentencepiece vocabulary.
std::optional<int> find_token(const JsonObject& obj, const std::string& key, const Tokenizer& tokenizer) {
  if (!obj.has(key)) return std::nullopt;
  const Json& value = obj.raw().at(key);
  std::string content;
  if (value.is_string()) {
    content = value.get<std::string>();
  } else if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    content = value.at("content").get<std::string>();
  } else {
    fail<ConfigError>("{}: key '{}' must be a token string or an object with a 'content' string, got {}",
                      obj.origin(), key, describe_json(value));
  }
  if (obj.has("added_tokens_decoder") && obj.raw().at("added_tokens_decoder").is_object()) {
    for (const auto& [id_text, entry] : obj.raw().at("added_tokens_decoder").items()) {
      if (!entry.is_object() || !entry.contains("content") || entry.at("content") != content) continue;
      try {
        size_t used = 0;
        const int id = std::stoi(id_text, &used);
        if (used == id_text.size() && id >= 0) return id;
      } catch (const std::exception&) {
      }
      fail<ConfigError>("{}: added_tokens_decoder key '{}' is not a token id", obj.origin(), id_text);
    }
  }
  const int id = tokenizer.piece_to_id(content);
  if (id < 0) {
    fail<ConfigError>("{}: key '{}' names the token '{}', which is neither in added_tokens_decoder nor in the "
                      "tokenizer's vocabulary",
                      obj.origin(), key, content);
  }
  return id;
}

// tokenizer_config.json's added_tokens_decoder: {"<id>": {"content": ..., "special": ..., "lstrip": ...}}.
std::vector<AddedToken> added_tokens_decoder(const JsonObject& obj) {
  std::vector<AddedToken> tokens;
  if (!obj.has("added_tokens_decoder")) return tokens;
  const Json& map = obj.raw().at("added_tokens_decoder");
  if (!map.is_object()) {
    fail<ConfigError>("{}: key 'added_tokens_decoder' must be an object of id -> token, got {}", obj.origin(),
                      describe_json(map));
  }
  for (auto item = map.begin(); item != map.end(); ++item) {
    const std::string& id_text = item.key();
    const Json& entry = item.value();
    AddedToken token;
    try {
      size_t used = 0;
      token.id = std::stoi(id_text, &used);
      if (used != id_text.size()) token.id = -1;
    } catch (const std::exception&) {
      token.id = -1;
    }
    if (token.id < 0) fail<ConfigError>("{}: added_tokens_decoder key '{}' is not a token id", obj.origin(), id_text);
    if (!entry.is_object() || !entry.contains("content") || !entry.at("content").is_string() ||
        entry.at("content").get<std::string>().empty()) {
      fail<ConfigError>("{}: added_tokens_decoder['{}'] must be an object with a non-empty 'content' string, got {}",
                        obj.origin(), id_text, describe_json(entry));
    }
    token.content = entry.at("content").get<std::string>();
    const auto flag = [&](const char* key, bool fallback) {
      if (!entry.contains(key) || entry.at(key).is_null()) return fallback;
      if (!entry.at(key).is_boolean()) {
        fail<ConfigError>("{}: added_tokens_decoder['{}'].{} must be a boolean, got {}", obj.origin(), id_text, key,
                          describe_json(entry.at(key)));
      }
      return entry.at(key).get<bool>();
    };
    token.special = flag("special", false);
    token.lstrip = flag("lstrip", false);
    token.rstrip = flag("rstrip", false);
    token.normalized = flag("normalized", !token.special);
    token.single_word = flag("single_word", false);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

std::shared_ptr<TextTokenizer> load_tokenizer(const fs::path& model_dir) {
  if (!fs::is_directory(model_dir)) fail<IoError>("model folder '{}' does not exist", model_dir.string());
  const fs::path json_file = model_dir / "tokenizer.json";
  const fs::path model_file = model_dir / "tokenizer.model";
  const fs::path vocab_file = model_dir / "vocab.json";
  const fs::path merges_file = model_dir / "merges.txt";

  const auto generation = load_if_present(model_dir / "generation_config.json");
  const auto tok_config = load_if_present(model_dir / "tokenizer_config.json");
  const auto config = load_if_present(model_dir / "config.json");
  const std::vector<AddedToken> config_tokens = tok_config ? added_tokens_decoder(*tok_config) : std::vector<AddedToken>{};

  // tokenizer.json first, unless it is a sentencepiece-style one and tokenizer.model is there to use instead.
  std::shared_ptr<const BpeTokenizer> bpe;
  std::shared_ptr<const SentencePieceTokenizer> sp;
  if (fs::exists(json_file)) {
    const Json root = load_json_file(json_file);
    if (BpeTokenizer::is_byte_level(root) || !fs::exists(model_file)) bpe = BpeTokenizer::from_json(root, json_file.string());
  }
  if (!bpe && fs::exists(model_file)) {
    sp = SentencePieceTokenizer::load(model_file);
  } else if (!bpe && fs::exists(vocab_file) && fs::exists(merges_file)) {
    bpe = BpeTokenizer::load_vocab_merges(vocab_file, merges_file, config_tokens);
  } else if (!bpe) {
    fail<IoError>("model folder '{}' has no tokenizer: expected tokenizer.json (byte-level BPE), tokenizer.model "
                  "(sentencepiece) or vocab.json + merges.txt (GPT-2 style BPE)",
                  model_dir.string());
  }
  const Tokenizer& backend = bpe ? static_cast<const Tokenizer&>(*bpe) : *sp;

  // Precedence: generation_config.json > tokenizer_config.json > config.json > the tokenizer's own.
  SpecialTokens specials;
  if (generation) specials.bos = find_id(*generation, "bos_token_id");
  if (!specials.bos && tok_config) specials.bos = find_token(*tok_config, "bos_token", backend);
  if (!specials.bos && config) specials.bos = find_id(*config, "bos_token_id");
  if (!specials.bos && backend.bos_id() >= 0) specials.bos = backend.bos_id();

  std::optional<std::vector<int>> eos;
  if (generation) eos = find_id_list(*generation, "eos_token_id");
  if (!eos && tok_config) {
    if (const auto id = find_token(*tok_config, "eos_token", backend)) eos = std::vector<int>{*id};
  }
  if (!eos && config) eos = find_id_list(*config, "eos_token_id");
  specials.eos = eos ? *eos : backend.eos_ids();

  if (generation) specials.pad = find_id(*generation, "pad_token_id");
  if (!specials.pad && tok_config) specials.pad = find_token(*tok_config, "pad_token", backend);
  if (!specials.pad && config) specials.pad = find_id(*config, "pad_token_id");
  if (!specials.pad && sp && sp->pad_id() >= 0) specials.pad = sp->pad_id();

  // add_bos_token / add_eos_token win. Otherwise sentencepiece adds a BOS when one exists (LlamaTokenizer; a
  // default cannot ask for a BOS that does not exist, an explicit true can and TextTokenizer then throws
  // ConfigError), and byte-level BPE adds what its post-processor adds.
  const std::optional<bool> add_bos = tok_config ? tok_config->find<bool>("add_bos_token") : std::nullopt;
  const std::optional<bool> add_eos = tok_config ? tok_config->find<bool>("add_eos_token") : std::nullopt;
  if (sp) {
    specials.add_bos = add_bos.value_or(specials.bos.has_value());
    specials.add_eos = add_eos.value_or(false);
  } else {
    specials.add_bos = add_bos.value_or(bpe->template_bos().has_value() && specials.bos.has_value());
    specials.add_eos = add_eos.value_or(bpe->template_eos().has_value() && !specials.eos.empty());
  }

  // For sentencepiece, TextTokenizer parses the special-token strings itself: the pieces of the special ids
  // the model has, then tokenizer_config.json's added_tokens_decoder (whose flags win for the same string).
  std::vector<AddedToken> token_strings;
  if (sp) {
    std::vector<int> ids = specials.eos;
    if (specials.bos) ids.push_back(*specials.bos);
    if (specials.pad) ids.push_back(*specials.pad);
    if (sp->unk_id() >= 0) ids.push_back(sp->unk_id());
    token_strings = config_tokens;
    for (int id : ids) {
      if (id >= sp->vocab_size()) continue;
      AddedToken token;
      token.id = id;
      token.content = sp->id_to_piece(id);
      token.special = true;
      const bool known = std::any_of(token_strings.begin(), token_strings.end(),
                                     [&](const AddedToken& t) { return t.content == token.content; });
      if (!known) token_strings.push_back(std::move(token));
    }
  }
  try {
    return std::make_shared<TextTokenizer>(bpe ? std::static_pointer_cast<const Tokenizer>(bpe) : sp,
                                           std::move(specials), std::move(token_strings));
  } catch (const ConfigError& e) {
    fail<ConfigError>("{}: {}", model_dir.string(), e.what());
  }
}

}  // namespace swiftcpp
