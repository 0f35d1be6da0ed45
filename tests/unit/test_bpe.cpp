// Byte-level BPE tests: GPT-2 against llama.cpp's golden vectors (tokenizer.json and vocab.json + merges.txt),
// round trips, each pre-tokenizer behaviour, added tokens, normalizers, post-processor BOS, errors for malformed
// files, special-token parsing for sentencepiece, and the `swiftcpp tokenize` command end to end.
//
// The component tests build small tokenizer.json files whose vocabulary holds the 256 byte tokens (id = byte
// value) plus whole pre-tokens, with ignore_merges set: a pre-token in the vocabulary then encodes to one id, so
// the ids show exactly where the pre-tokenizer cut the text.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using nlohmann::json;
using test::assets;
using test::stories_dir;

const fs::path kGpt2Dir = assets() / "tokenizers/gpt2";
const fs::path kGpt2Inp = assets() / "tokenizers/llamacpp-vectors/ggml-vocab-gpt-2.gguf.inp";
const fs::path kGpt2Out = assets() / "tokenizers/llamacpp-vectors/ggml-vocab-gpt-2.gguf.out";

std::string show(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return "[" + s + "]";
}

// GPT-2's byte-to-unicode table, written out independently of the library: printable bytes stand for
// themselves, the others in order for U+0100 onwards.
std::string byte_level(const std::string& raw) {
  std::string out;
  for (unsigned char b : raw) {
    int cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      int rank = 0;
      for (int c = 0; c < b; ++c) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++rank;
      }
      cp = 256 + rank;
    }
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// A byte-level tokenizer.json: ids 0..255 are the bytes, then `words` (raw text) from 256 on; ignore_merges.
json tiny_tokenizer(const std::vector<std::string>& words, const json& pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  for (const std::string& word : words) vocab[byte_level(word)] = next++;
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}}},
              {"model",
               {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"ignore_merges", true}}}};
}

json byte_level_step(bool use_regex = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json split_then_bytes(const json& split) {
  return {{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level_step()})}};
}

// The ids of pieces: a piece in the vocabulary is one id, any other piece its bytes.
std::vector<int> piece_ids(const BpeTokenizer& tokenizer, const std::vector<std::string>& pieces) {
  std::vector<int> ids;
  for (const std::string& piece : pieces) {
    const int id = tokenizer.piece_to_id(byte_level(piece));
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (unsigned char b : piece) ids.push_back(b);
    }
  }
  return ids;
}

std::shared_ptr<BpeTokenizer> from(const json& root) { return BpeTokenizer::from_json(root, "test tokenizer.json"); }

// ---------------------------------------------------------------------------------------------------------
// GPT-2 against llama.cpp

void expect_vectors(const Tokenizer& tokenizer, const test::GoldenVectors& vectors) {
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    const std::vector<int> ids = tokenizer.encode(vectors.texts[i]);
    EXPECT_EQ(ids, vectors.ids[i]) << "vector " << i << " '" << vectors.texts[i] << "': got " << show(ids)
                                   << ", expected " << show(vectors.ids[i]);
  }
}

TEST(BpeGpt2, LlamaCppVectorsWithTokenizerJson) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Inp);
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const test::GoldenVectors vectors = test::read_llamacpp_vectors(kGpt2Inp, kGpt2Out);
  ASSERT_EQ(vectors.texts.size(), 46u) << "the vector file changed";
  ASSERT_EQ(vectors.texts.size(), vectors.ids.size());
  const auto tokenizer = BpeTokenizer::load(kGpt2Dir / "tokenizer.json");
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  expect_vectors(*tokenizer, vectors);
}

TEST(BpeGpt2, LlamaCppVectorsWithVocabAndMerges) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Inp);
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "vocab.json");
  const test::GoldenVectors vectors = test::read_llamacpp_vectors(kGpt2Inp, kGpt2Out);
  ASSERT_EQ(vectors.texts.size(), 46u);
  const auto tokenizer = BpeTokenizer::load_vocab_merges(kGpt2Dir / "vocab.json", kGpt2Dir / "merges.txt");
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  expect_vectors(*tokenizer, vectors);
}

TEST(BpeGpt2, VectorsRoundTrip) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Inp);
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const test::GoldenVectors vectors = test::read_llamacpp_vectors(kGpt2Inp, kGpt2Out);
  const auto json_tokenizer = BpeTokenizer::load(kGpt2Dir / "tokenizer.json");
  const auto pair_tokenizer = BpeTokenizer::load_vocab_merges(kGpt2Dir / "vocab.json", kGpt2Dir / "merges.txt");
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    EXPECT_EQ(json_tokenizer->decode(vectors.ids[i]), vectors.texts[i]) << "vector " << i;
    for (const auto* tokenizer : {json_tokenizer.get(), pair_tokenizer.get()}) {
      EXPECT_EQ(tokenizer->decode(tokenizer->encode(vectors.texts[i])), vectors.texts[i]) << "vector " << i;
    }
  }
  // Text with every byte-level oddity: control characters, NBSP, soft hyphen, CRLF, long runs.
  const std::string odd = "\x01\x7f\xc2\xa0\xc2\xad\r\n" + std::string(300, ' ') + std::string(200, '!') + "end";
  EXPECT_EQ(json_tokenizer->decode(json_tokenizer->encode(odd)), odd);
}

TEST(BpeGpt2, PiecesAndDecodeOfACutCharacter) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const auto tokenizer = BpeTokenizer::load(kGpt2Dir / "tokenizer.json");
  EXPECT_EQ(tokenizer->encode("Hello world"), (std::vector<int>{15496, 995}));
  EXPECT_EQ(tokenizer->id_to_piece(995), "Ġworld");
  EXPECT_EQ(tokenizer->piece_to_id("Ġworld"), 995);
  EXPECT_EQ(tokenizer->piece_to_id("<|endoftext|>"), 50256);
  EXPECT_EQ(tokenizer->piece_to_id("no such piece"), -1);
  EXPECT_THROW(tokenizer->id_to_piece(50257), Error);
  EXPECT_THROW(tokenizer->decode({-1}), Error);
  // "🦙" is several byte tokens; the first alone is an unfinished character, which decodes to U+FFFD.
  const std::vector<int> llama = tokenizer->encode("🦙");
  ASSERT_GT(llama.size(), 1u);
  EXPECT_EQ(tokenizer->decode({llama[0]}), "\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer->decode(llama), "🦙");
  EXPECT_TRUE(tokenizer->encode("").empty());
  EXPECT_THROW(tokenizer->encode("bad \xff byte"), FormatError);
  // GPT-2 has no post-processor BOS/EOS.
  EXPECT_EQ(tokenizer->bos_id(), -1);
  EXPECT_TRUE(tokenizer->eos_ids().empty());
}

TEST(BpeGpt2, EndOfTextIsParsedOnlyWhenAsked) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const auto tokenizer = BpeTokenizer::load(kGpt2Dir / "tokenizer.json");
  const std::vector<int> hello = tokenizer->encode("Hello");
  const std::vector<int> world = tokenizer->encode(" world");
  std::vector<int> expected = hello;
  expected.push_back(50256);
  expected.insert(expected.end(), world.begin(), world.end());
  EXPECT_EQ(tokenizer->encode_with_special_tokens("Hello<|endoftext|> world"), expected);
  const std::vector<int> plain = tokenizer->encode("Hello<|endoftext|> world");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0) << show(plain);
  EXPECT_EQ(tokenizer->decode(plain), "Hello<|endoftext|> world");
  // decode() drops the special token, decode_with_special_tokens() shows it.
  EXPECT_EQ(tokenizer->decode(expected), "Hello world");
  EXPECT_EQ(tokenizer->decode_with_special_tokens(expected), "Hello<|endoftext|> world");
}

TEST(BpeGpt2, LoadTokenizerFolder) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const auto tokenizer = load_tokenizer(kGpt2Dir);
  EXPECT_NE(dynamic_cast<const BpeTokenizer*>(&tokenizer->base()), nullptr);
  // tokenizer_config.json names <|endoftext|> as BOS and EOS; GPT-2's post-processor adds neither.
  EXPECT_EQ(tokenizer->specials().bos, 50256);
  EXPECT_EQ(tokenizer->specials().eos, std::vector<int>{50256});
  EXPECT_FALSE(tokenizer->specials().add_bos);
  EXPECT_FALSE(tokenizer->specials().add_eos);
  EXPECT_EQ(tokenizer->encode_with_specials("Hello world"), (std::vector<int>{15496, 995}));
  EXPECT_EQ(tokenizer->encode_with_specials("Hello<|endoftext|>", true), (std::vector<int>{15496, 50256}));
  EXPECT_EQ(tokenizer->encode_with_special_tokens("<|endoftext|>"), std::vector<int>{50256});

  // Only vocab.json + merges.txt (and the configs): the same ids, added tokens from added_tokens_decoder.
  const fs::path dir = test::temp_dir("bpe_pair");
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"}) fs::copy(kGpt2Dir / name, dir / name);
  const auto pair = load_tokenizer(dir);
  EXPECT_EQ(pair->encode("Hello world"), (std::vector<int>{15496, 995}));
  EXPECT_EQ(pair->encode_with_special_tokens("Hello<|endoftext|>"), (std::vector<int>{15496, 50256}));
  EXPECT_EQ(pair->specials().bos, 50256);
  // With tokenizer.json as well, tokenizer.json wins (here: the same tokenizer).
  fs::copy(kGpt2Dir / "tokenizer.json", dir / "tokenizer.json");
  EXPECT_EQ(load_tokenizer(dir)->encode(" this is 🦙.cpp"), tokenizer->encode(" this is 🦙.cpp"));
}

// A sentencepiece-style tokenizer.json (no ByteLevel step) next to tokenizer.model: sentencepiece is used; alone,
// it is a FormatError naming the file.
TEST(BpeLoad, SentencePieceStyleTokenizerJsonDefersToTokenizerModel) {
  const fs::path dir = test::temp_dir("bpe_spm_json");
  fs::copy(stories_dir() / "tokenizer.model", dir / "tokenizer.model");
  json root = tiny_tokenizer({}, {{"type", "Metaspace"}, {"replacement", "▁"}});
  write_file_atomic(dir / "tokenizer.json", root.dump());
  const auto tokenizer = load_tokenizer(dir);
  EXPECT_EQ(tokenizer->encode("Once upon a time"), (std::vector<int>{403, 407, 261, 378}));
  fs::remove(dir / "tokenizer.model");
  try {
    load_tokenizer(dir);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "tokenizer.json").string()), std::string::npos) << e.what();
  }
}

TEST(BpeLoad, ConcurrentEncodeMatchesSerial) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const auto tokenizer = BpeTokenizer::load(kGpt2Dir / "tokenizer.json");
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("Text number " + std::to_string(i * 7919) + " with wörds, 🦙 and  spaces.");
  std::vector<std::vector<int>> serial;
  {
    const auto fresh = BpeTokenizer::load(kGpt2Dir / "tokenizer.json");
    for (const auto& text : texts) serial.push_back(fresh->encode(text));
  }
  std::vector<std::vector<std::vector<int>>> parallel(4, std::vector<std::vector<int>>(texts.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < parallel.size(); ++t) {
    threads.emplace_back([&, t]() {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) parallel[t][(i + t * 50) % texts.size()] =
            tokenizer->encode(texts[(i + t * 50) % texts.size()]);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& results : parallel) EXPECT_EQ(results, serial);
}

// ---------------------------------------------------------------------------------------------------------
// Pre-tokenizers

TEST(BpePreTokenizer, SplitBehaviours) {
  const std::vector<std::string> words = {"a-", "b-", "-b", "-c", "--", "ab", "12", "cd"};
  const auto with = [&](const char* behavior, bool invert) {
    json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return from(tiny_tokenizer(words, split_then_bytes(split)));
  };
  const std::string text = "a-b--c";
  auto t = with("Isolated", false);
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"a", "-", "b", "-", "-", "c"}));
  t = with("Removed", false);
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"a", "b", "c"}));
  t = with("MergedWithPrevious", false);
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"a-", "b-", "-", "c"}));
  t = with("MergedWithNext", false);
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"a", "-b", "-", "-c"}));
  t = with("Contiguous", false);
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"a", "-", "b", "--", "c"}));
  // invert: the text between the dashes is the match.
  t = with("Removed", true);
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"-", "-", "-"}));
  t = with("MergedWithPrevious", true);  // each letter joins the dash before it
  EXPECT_EQ(t->encode(text), piece_ids(*t, {"a", "-b", "-", "-c"}));

  // A regex pattern, written as in tokenizer.json.
  const json regex_split = json::parse(R"({"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "Isolated",
                                           "invert": false})");
  t = from(tiny_tokenizer(words, split_then_bytes(regex_split)));
  EXPECT_EQ(t->encode("ab12cd3"), piece_ids(*t, {"ab", "12", "cd", "3"}));
  for (const std::string s : {"a-b--c", "ab12cd3", "", "---"}) EXPECT_EQ(t->decode(t->encode(s)), s);
}

TEST(BpePreTokenizer, Digits) {
  const std::vector<std::string> words = {"123", "ab"};
  auto individual = from(tiny_tokenizer(words, split_then_bytes({{"type", "Digits"}, {"individual_digits", true}})));
  EXPECT_EQ(individual->encode("ab123ab"), piece_ids(*individual, {"ab", "1", "2", "3", "ab"}));
  auto grouped = from(tiny_tokenizer(words, split_then_bytes({{"type", "Digits"}, {"individual_digits", false}})));
  EXPECT_EQ(grouped->encode("ab123ab"), piece_ids(*grouped, {"ab", "123", "ab"}));
}

// Llama 3's pattern, verbatim from its tokenizer.json (JSON-escaped): case-insensitive contractions, \p{L} and
// \p{N} on non-ASCII text, digits in groups of at most three. Expected pieces worked out by hand from the
// pattern's alternatives (and checked against Python's `regex` module).
TEST(BpePreTokenizer, Llama3PatternOnUnicodeText) {
  const json split = json::parse(R"({"type": "Split", "pattern": {"Regex":
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
      "behavior": "Isolated", "invert": false})");
  const std::vector<std::string> pieces = {"Héllo", " WORLD", "'S", " ", "123", "45", " Привет", ",",
                                           " мир", "!\n\n", "日本語", " ", " x"};
  const auto t = from(tiny_tokenizer(pieces, split_then_bytes(split)));
  const std::string text = "Héllo WORLD'S 12345 Привет, мир!\n\n日本語  x";
  std::vector<int> expected;
  for (const std::string& piece : pieces) expected.push_back(t->piece_to_id(byte_level(piece)));
  EXPECT_EQ(t->encode(text), expected);
  EXPECT_EQ(t->decode(t->encode(text)), text);
}

TEST(BpePreTokenizer, ByteLevelPrefixSpaceAndGpt2Regex) {
  json pre = byte_level_step(true);
  pre["add_prefix_space"] = true;
  const auto t = from(tiny_tokenizer({" hello", " world", "!"}, pre));
  EXPECT_EQ(t->encode("hello world!"), piece_ids(*t, {" hello", " world", "!"}));
  EXPECT_EQ(t->encode(" hello"), piece_ids(*t, {" hello"}));  // already starts with a space
}

// ---------------------------------------------------------------------------------------------------------
// Added tokens, normalizers, post-processor

json with_added(json root, const std::vector<json>& tokens) {
  for (const json& token : tokens) root["added_tokens"].push_back(token);
  return root;
}

json added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false) {
  return {{"id", id},         {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false}, {"special", special}};
}

TEST(BpeAddedTokens, LstripRstripLongestMatchAndSingleWord) {
  const std::vector<std::string> words = {"xx", " yy", "xx ", "yy"};  // ids 256..259
  const json base = tiny_tokenizer(words, byte_level_step());
  // <l> absorbs the spaces on its left, <r> those on its right, <b> both.
  const auto t = from(with_added(base, {added(300, "<l>", false, true, false), added(301, "<r>", false, false, true),
                                        added(302, "<b>", false, true, true), added(303, "<s>", true),
                                        added(304, "<s>x", true), added(305, "ab", false, false, false, true)}));
  EXPECT_EQ(t->encode("xx  <l> yy"), (std::vector<int>{256, 300, 257}));
  EXPECT_EQ(t->encode("xx <r>  yy"), (std::vector<int>{258, 301, 259}));
  EXPECT_EQ(t->encode("xx \t<b>\n yy"), (std::vector<int>{256, 302, 259}));
  // Longest match first: "<s>x" beats "<s>"; special tokens only match when asked.
  EXPECT_EQ(t->encode_with_special_tokens("<s>xy"), (std::vector<int>{304, 'y'}));
  EXPECT_EQ(t->encode_with_special_tokens("<s>y"), (std::vector<int>{303, 'y'}));
  EXPECT_EQ(t->encode("<s>y"), (std::vector<int>{'<', 's', '>', 'y'}));
  // single_word: "ab" only when no letter, digit or '_' touches it.
  EXPECT_EQ(t->encode("ab x"), (std::vector<int>{305, ' ', 'x'}));
  EXPECT_EQ(t->encode("cab x"), (std::vector<int>{'c', 'a', 'b', ' ', 'x'}));
  EXPECT_EQ(t->encode("ab_"), (std::vector<int>{'a', 'b', '_'}));
  // Decoding: non-special added tokens are text; special ones only with decode_with_special_tokens().
  EXPECT_EQ(t->decode({256, 300, 303, 259}), "xx<l>yy");
  EXPECT_EQ(t->decode_with_special_tokens({256, 300, 303, 259}), "xx<l><s>yy");
  EXPECT_EQ(t->added_tokens().size(), 6u);
  EXPECT_EQ(t->vocab_size(), 306);
}

TEST(BpeNormalizer, NfcComposesBeforePreTokenization) {
  const std::string decomposed = "e\xCC\x81";  // e + COMBINING ACUTE ACCENT
  const std::string composed = "\xC3\xA9";     // é
  json root = tiny_tokenizer({composed, "caf" + composed}, byte_level_step());
  auto plain = from(root);
  EXPECT_EQ(plain->encode(decomposed), (std::vector<int>{'e', 0xCC, 0x81}));
  root["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  auto nfc = from(root);
  EXPECT_EQ(nfc->encode(decomposed), std::vector<int>{256});
  EXPECT_EQ(nfc->encode("caf" + decomposed), std::vector<int>{257});
  EXPECT_EQ(nfc->decode(nfc->encode("caf" + decomposed)), "caf" + composed);
  root["normalizer"] = {{"type", "Lowercase"}};
  try {
    from(root);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("Lowercase"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(BpePostProcessor, TemplateProcessingBosThroughLoadTokenizer) {
  json root = with_added(tiny_tokenizer({"hi"}, byte_level_step()), {added(400, "<|begin_of_text|>", true)});
  root["post_processor"] = json::parse(R"({
    "type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [400], "tokens": ["<|begin_of_text|>"]}}}]})");
  const fs::path dir = test::temp_dir("bpe_template");
  write_file_atomic(dir / "tokenizer.json", root.dump());
  auto tokenizer = load_tokenizer(dir);
  EXPECT_EQ(tokenizer->specials().bos, 400);
  EXPECT_TRUE(tokenizer->specials().add_bos);
  EXPECT_FALSE(tokenizer->specials().add_eos);
  EXPECT_EQ(tokenizer->encode_with_specials("hi"), (std::vector<int>{400, 256}));
  EXPECT_EQ(tokenizer->encode_with_specials("<|begin_of_text|>hi", true), (std::vector<int>{400, 400, 256}));
  // tokenizer_config.json's add_bos_token wins over the template.
  write_file_atomic(dir / "tokenizer_config.json", R"({"add_bos_token": false})");
  tokenizer = load_tokenizer(dir);
  EXPECT_EQ(tokenizer->encode_with_specials("hi"), std::vector<int>{256});
}

// ---------------------------------------------------------------------------------------------------------
// Malformed files

void expect_format_error(const fs::path& path, const std::string& content, const std::string& needle) {
  write_file_atomic(path, content);
  try {
    BpeTokenizer::load(path);
    ADD_FAILURE() << "expected FormatError for " << needle;
  } catch (const FormatError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

TEST(BpeErrors, MalformedTokenizerJsonIsFormatErrorNamingTheFile) {
  const fs::path dir = test::temp_dir("bpe_bad");
  const fs::path path = dir / "tokenizer.json";
  const json good = tiny_tokenizer({"ab"}, byte_level_step(true));
  expect_format_error(path, good.dump().substr(0, 100), "invalid JSON");
  json bad = good;
  bad["model"]["type"] = "WordPiece";
  expect_format_error(path, bad.dump(), "WordPiece");
  bad = good;
  bad["pre_tokenizer"] = split_then_bytes({{"type", "Whitespace"}});
  expect_format_error(path, bad.dump(), "Whitespace");
  bad = good;
  bad["model"]["merges"] = json::array({"a b", "a zzz"});
  expect_format_error(path, bad.dump(), "zzz");
  bad = good;
  bad["model"]["merges"] = json::array({json::array({"a", "q"})});  // "aq" is not in the vocabulary
  expect_format_error(path, bad.dump(), "aq");
  bad = good;
  bad["pre_tokenizer"] = split_then_bytes(json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"},
                                                         "behavior": "Isolated", "invert": false})"));
  expect_format_error(path, bad.dump(), "(unclosed");
  bad = good;
  bad["decoder"] = {{"type", "WordPiece"}};
  expect_format_error(path, bad.dump(), "WordPiece");
  bad = good;
  bad.erase("model");
  expect_format_error(path, bad.dump(), "model");
  EXPECT_THROW(BpeTokenizer::load(dir / "missing.json"), IoError);

  write_file_atomic(dir / "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write_file_atomic(dir / "merges.txt", "#version: 0.2\na b\nab\n");
  try {
    BpeTokenizer::load_vocab_merges(dir / "vocab.json", dir / "merges.txt");
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "merges.txt").string() + ":3"), std::string::npos) << e.what();
  }
}

// A folder without any tokenizer file is an IoError that names the three choices; a malformed tokenizer.json
// is a FormatError naming it.
TEST(BpeErrors, LoadTokenizerMessages) {
  const fs::path dir = test::temp_dir("bpe_empty");
  try {
    load_tokenizer(dir);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(dir.string()), std::string::npos) << message;
    for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.json"}) {
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
  }
  write_file_atomic(dir / "tokenizer.json", "{\"model\": ");
  EXPECT_THROW(load_tokenizer(dir), FormatError);
}

// ---------------------------------------------------------------------------------------------------------
// Special-token strings with sentencepiece

TEST(SpecialTokenStrings, SentencePieceSplitsOnControlPieces) {
  const auto tokenizer = load_tokenizer(stories_dir());
  const std::vector<int> hello = tokenizer->encode("hello");
  std::vector<int> expected = {1};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(2);
  EXPECT_EQ(tokenizer->encode_with_special_tokens("<s>hello</s>"), expected);
  // Plain encode() keeps the strings as text.
  const std::vector<int> plain = tokenizer->encode("<s>hello</s>");
  EXPECT_NE(plain.front(), 1);
  EXPECT_NE(plain.back(), 2);
  // With BOS added as well.
  std::vector<int> with_bos = {1};
  with_bos.insert(with_bos.end(), expected.begin(), expected.end());
  EXPECT_EQ(tokenizer->encode_with_specials("<s>hello</s>", true), with_bos);
  EXPECT_EQ(tokenizer->decode_with_special_tokens(expected), "<s>hello</s>");
  EXPECT_EQ(tokenizer->decode(expected), "hello");
  EXPECT_EQ(tokenizer->encode_with_special_tokens("<unk>"), std::vector<int>{0});
}

TEST(SpecialTokenStrings, SentencePieceUsesAddedTokensDecoder) {
  const fs::path dir = test::temp_dir("spm_added");
  fs::copy_file(stories_dir() / "tokenizer.model", dir / "tokenizer.model");
  write_file_atomic(dir / "tokenizer_config.json", R"({
    "eos_token": "<|im_end|>",
    "added_tokens_decoder": {"512": {"content": "<|im_end|>", "special": true, "rstrip": true},
                             "513": {"content": "<|im_start|>", "special": true}}})");
  const auto tokenizer = load_tokenizer(dir);
  const std::vector<int> once = tokenizer->encode("Once");
  std::vector<int> expected = {513};
  expected.insert(expected.end(), once.begin(), once.end());
  expected.push_back(512);
  expected.insert(expected.end(), once.begin(), once.end());
  // rstrip: the newline after <|im_end|> is absorbed.
  EXPECT_EQ(tokenizer->encode_with_special_tokens("<|im_start|>Once<|im_end|>\nOnce"), expected);
}

// ---------------------------------------------------------------------------------------------------------
// swiftcpp tokenize

TEST(TokenizeCli, EncodeDecodeTextAndFiles) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const std::string tok = "tokenize --tokenizer " + kGpt2Dir.string();
  test::CliRun r = test::run_cli(tok + " --text 'Hello world'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "15496 995\n");
  r = test::run_cli(tok + " --decode --text '15496, 995'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "Hello world\n");
  r = test::run_cli(tok + " --text 'Hi<|endoftext|>'");
  EXPECT_EQ(r.out, "17250 50256\n");
  r = test::run_cli(tok + " --no-special --text '<|endoftext|>'");
  EXPECT_EQ(r.out.find("50256"), std::string::npos) << r.out;
  r = test::run_cli(tok + " --decode --text '17250 50256'");
  EXPECT_EQ(r.out, "Hi<|endoftext|>\n");
  r = test::run_cli(tok + " --decode --no-special --text '17250 50256'");
  EXPECT_EQ(r.out, "Hi\n");

  const fs::path dir = test::temp_dir("cli_tokenize");
  write_file_atomic(dir / "in.txt", "Hello world\n\n Hello World!\n");
  r = test::run_cli(tok + " --file " + (dir / "in.txt").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "15496 995\n\n18435 2159 0\n");
  write_file_atomic(dir / "ids.txt", "15496 995\n18435 2159 0\n");
  r = test::run_cli(tok + " --decode --file " + (dir / "ids.txt").string());
  EXPECT_EQ(r.out, "Hello world\n Hello World!\n");

  // sentencepiece: BOS is added by default.
  r = test::run_cli("tokenize --tokenizer " + stories_dir().string() + " --text 'Once upon a time'");
  EXPECT_EQ(r.out, "1 403 407 261 378\n");
}

TEST(TokenizeCli, BadInputsGiveClearErrorsAndExitCodes) {
  SWIFTCPP_REQUIRE_SHARED(kGpt2Dir / "tokenizer.json");
  const std::string tok = "tokenize --tokenizer " + kGpt2Dir.string();
  test::CliRun r = test::run_cli(tok);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--text"), std::string::npos) << r.out;
  r = test::run_cli(tok + " --decode --text 'abc'");
  EXPECT_EQ(r.code, 2) << r.out;
  r = test::run_cli(tok + " --decode --text '99999999'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("outside"), std::string::npos) << r.out;
  const fs::path dir = test::temp_dir("cli_tokenize_bad");
  write_file_atomic(dir / "ids.txt", "1 2\n3 x\n");
  r = test::run_cli(tok + " --decode --file " + (dir / "ids.txt").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("ids.txt:2"), std::string::npos) << r.out;
  r = test::run_cli(tok + " --file " + (dir / "missing.txt").string());
  EXPECT_EQ(r.code, 3) << r.out;
  r = test::run_cli("tokenize --tokenizer " + (dir / "nowhere").string() + " --text hi");
  EXPECT_EQ(r.code, 3) << r.out;
}

}  // namespace
}  // namespace swiftcpp
