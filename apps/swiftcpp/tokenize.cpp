// `swiftcpp tokenize`: text -> ids and ids -> text with a checkpoint's tokenizer.
#include <iostream>
#include <sstream>

#include "apps/swiftcpp/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::app {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  bool has_text = false;
  std::string file;
  bool decode = false;
  bool no_special = false;
};

// Ids separated by spaces, tabs or commas, optionally inside [ ]. `where` names the input in errors; `error`
// throws the error kind that fits it (ConfigError for --text, FormatError for a file line).
template <typename E>
std::vector<int> parse_ids(const std::string& line, const std::string& where, int vocab_size) {
  std::string cleaned = line;
  for (char& c : cleaned) {
    if (c == ',' || c == '[' || c == ']' || c == '\t' || c == '\r') c = ' ';
  }
  std::istringstream fields(cleaned);
  std::vector<int> ids;
  std::string field;
  while (fields >> field) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != field.size()) fail<E>("{}: '{}' is not a token id", where, field);
    if (id < 0 || id >= vocab_size) fail<E>("{}: token id {} is outside [0, {})", where, id, vocab_size);
    ids.push_back(static_cast<int>(id));
  }
  return ids;
}

std::string join(const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) {
    if (!out.empty()) out += ' ';
    out += std::to_string(id);
  }
  return out;
}

int run_tokenize(const TokenizeOptions& o) {
  if (o.has_text == !o.file.empty()) fail<ConfigError>("give exactly one of --text or --file");
  const auto tokenizer = load_tokenizer(o.tokenizer);
  const auto encode = [&](const std::string& text) {
    return o.no_special ? tokenizer->encode(text) : tokenizer->encode_with_specials(text, /*parse_special=*/true);
  };
  const auto decode = [&](const std::vector<int>& ids) {
    return o.no_special ? tokenizer->decode(ids) : tokenizer->decode_with_special_tokens(ids);
  };
  if (o.has_text) {
    if (o.decode) std::cout << decode(parse_ids<ConfigError>(o.text, "--text", tokenizer->vocab_size())) << "\n";
    else std::cout << join(encode(o.text)) << "\n";
    return 0;
  }
  std::istringstream lines(read_text_file(o.file));
  std::string line;
  for (size_t number = 1; std::getline(lines, line); ++number) {
    if (o.decode) {
      std::cout << decode(parse_ids<FormatError>(line, fmt::format("{}:{}", o.file, number), tokenizer->vocab_size()))
                << "\n";
    } else {
      std::cout << join(encode(line)) << "\n";
    }
  }
  return 0;
}

}  // namespace

CommandRun add_tokenize_command(CLI::App& root, const GlobalOptions&) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = root.add_subcommand("tokenize", "Encode text into token ids, or decode ids into text");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Folder with tokenizer.json, tokenizer.model or vocab.json + merges.txt (and its configs)")
      ->required();
  cmd->add_option_function<std::string>("--text", [o](const std::string& t) { o->text = t; o->has_text = true; },
                                        "Text to encode (with --decode: ids separated by spaces or commas)");
  cmd->add_option("--file", o->file, "File whose lines are encoded (with --decode: decoded) one by one");
  cmd->add_flag("--decode", o->decode, "Read token ids and print the text");
  cmd->add_flag("--no-special", o->no_special,
                "Encode: add no BOS/EOS and keep special-token strings as text; decode: drop special tokens");
  return [o]() { return run_tokenize(*o); };
}

}  // namespace swiftcpp::app
