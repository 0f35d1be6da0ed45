#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/sentencepiece.h"

namespace swiftcpp {

TextTokenizer::TextTokenizer(std::shared_ptr<const Tokenizer> base, SpecialTokens specials)
    : base_(std::move(base)), specials_(std::move(specials)) {
  if (!base_) fail<ConfigError>("TextTokenizer needs a tokenizer");
  if (specials_.bos && *specials_.bos < 0) fail<ConfigError>("BOS id {} is negative", *specials_.bos);
  if (specials_.pad && *specials_.pad < 0) fail<ConfigError>("pad id {} is negative", *specials_.pad);
  for (int id : specials_.eos) {
    if (id < 0) fail<ConfigError>("EOS id {} is negative", id);
  }
  if (specials_.add_bos && !specials_.bos) fail<ConfigError>("add_bos is set but no BOS token is defined");
  if (specials_.add_eos && specials_.eos.empty()) fail<ConfigError>("add_eos is set but no EOS token is defined");
}

std::vector<int> TextTokenizer::encode_with_specials(const std::string& text) const {
  std::vector<int> body = base_->encode(text);
  std::vector<int> ids;
  ids.reserve(body.size() + 2);
  if (specials_.add_bos) ids.push_back(*specials_.bos);
  ids.insert(ids.end(), body.begin(), body.end());
  if (specials_.add_eos) ids.push_back(specials_.eos.front());
  return ids;
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
                      value.dump());
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
                      obj.origin(), key, value.dump());
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
                      "vocabulary of tokenizer.model",
                      obj.origin(), key, content);
  }
  return id;
}

}  // namespace

std::shared_ptr<TextTokenizer> load_tokenizer(const fs::path& model_dir) {
  if (!fs::is_directory(model_dir)) fail<IoError>("model folder '{}' does not exist", model_dir.string());
  const fs::path model_file = model_dir / "tokenizer.model";
  if (!fs::exists(model_file)) {
    const bool has_json = fs::exists(model_dir / "tokenizer.json");
    fail<IoError>("model folder '{}' has no tokenizer.model (sentencepiece){}; tokenizer.json (byte-level BPE) "
                  "support comes with a later change",
                  model_dir.string(), has_json ? ", only tokenizer.json" : "");
  }
  auto sp = SentencePieceTokenizer::load(model_file);

  const auto generation = load_if_present(model_dir / "generation_config.json");
  const auto tok_config = load_if_present(model_dir / "tokenizer_config.json");
  const auto config = load_if_present(model_dir / "config.json");

  // Precedence: generation_config.json > tokenizer_config.json > config.json > the sentencepiece model.
  SpecialTokens specials;
  if (generation) specials.bos = find_id(*generation, "bos_token_id");
  if (!specials.bos && tok_config) specials.bos = find_token(*tok_config, "bos_token", *sp);
  if (!specials.bos && config) specials.bos = find_id(*config, "bos_token_id");
  if (!specials.bos && sp->bos_id() >= 0) specials.bos = sp->bos_id();

  std::optional<std::vector<int>> eos;
  if (generation) eos = find_id_list(*generation, "eos_token_id");
  if (!eos && tok_config) {
    if (const auto id = find_token(*tok_config, "eos_token", *sp)) eos = std::vector<int>{*id};
  }
  if (!eos && config) eos = find_id_list(*config, "eos_token_id");
  specials.eos = eos ? *eos : sp->eos_ids();

  if (generation) specials.pad = find_id(*generation, "pad_token_id");
  if (!specials.pad && tok_config) specials.pad = find_token(*tok_config, "pad_token", *sp);
  if (!specials.pad && config) specials.pad = find_id(*config, "pad_token_id");
  if (!specials.pad && sp->pad_id() >= 0) specials.pad = sp->pad_id();

  // add_bos_token defaults to true (LlamaTokenizer); a default cannot ask for a BOS that does not exist, an
  // explicit true can (TextTokenizer then throws ConfigError).
  const std::optional<bool> add_bos = tok_config ? tok_config->find<bool>("add_bos_token") : std::nullopt;
  specials.add_bos = add_bos.value_or(specials.bos.has_value());
  specials.add_eos = tok_config ? tok_config->get_or<bool>("add_eos_token", false) : false;
  try {
    return std::make_shared<TextTokenizer>(std::move(sp), std::move(specials));
  } catch (const ConfigError& e) {
    fail<ConfigError>("{}: {}", model_dir.string(), e.what());
  }
}

}  // namespace swiftcpp
