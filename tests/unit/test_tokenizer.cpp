// Tokenizer tests: sentencepiece through the RTLD_DEEPBIND shim, checked against llama.cpp's golden vectors and
// the Hugging Face reference ids of stories260K; special-token resolution; errors for missing or corrupt files.
// The executable links LibTorch, so these tests also prove that libsentencepiece's protobuf and LibTorch's
// coexist in one process (linking both directly crashes before main()).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "data/encode.h"
#include "template/template.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using nlohmann::json;

using test::assets;
using test::stories_dir;

// A fresh folder under the system temp folder, removed with its content at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("swiftcpp_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string show(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return "[" + s + "]";
}

const fs::path kLlamaSpmInp = assets() / "tokenizers/llamacpp-vectors/ggml-vocab-llama-spm.gguf.inp";
const fs::path kLlamaSpmOut = assets() / "tokenizers/llamacpp-vectors/ggml-vocab-llama-spm.gguf.out";
const fs::path kLlama2Model = assets() / "tokenizers/llama2/tokenizer.model";
const fs::path kHfLogits = assets() / "reference/stories260K/hf_logits.json";
const fs::path kAlpaca = assets() / "data/sft/alpaca_en_demo.json";

// The texts are passed to sentencepiece exactly as they appear in the .inp file: no space is prepended by us.
// The Llama 2 model has add_dummy_prefix=true, so sentencepiece itself prepends "▁" (e.g. "Hello" ->
// "▁Hello" = 15043, " Hello" -> "▁" + "▁Hello" = 29871 15043), which is what llama.cpp reproduces and what the
// .out ids (made with the Hugging Face slow tokenizer, add_special_tokens=False) contain.
TEST(TokenizerSentencePiece, LlamaCppVectorsMatchExactly) {
  SWIFTCPP_REQUIRE_SHARED(kLlamaSpmInp);
  SWIFTCPP_REQUIRE_SHARED(kLlamaSpmOut);
  SWIFTCPP_REQUIRE_SHARED(kLlama2Model);
  const test::GoldenVectors vectors = test::read_llamacpp_vectors(kLlamaSpmInp, kLlamaSpmOut);
  ASSERT_EQ(vectors.texts.size(), 46u) << "the vector file changed";
  ASSERT_EQ(vectors.texts.size(), vectors.ids.size());
  EXPECT_EQ(vectors.texts[2], "") << "the third vector is the empty string";
  const auto tokenizer = SentencePieceTokenizer::load(kLlama2Model);
  EXPECT_EQ(tokenizer->vocab_size(), 32000);
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    EXPECT_EQ(tokenizer->encode(vectors.texts[i]), vectors.ids[i])
        << "vector " << i << " '" << vectors.texts[i] << "': got " << show(tokenizer->encode(vectors.texts[i]))
        << ", expected " << show(vectors.ids[i]);
  }
}

// Every vector round-trips: the Llama 2 model normalises with the identity rule and keeps extra whitespace
// (remove_extra_whitespaces=false), byte fallback covers every character outside the vocabulary, and decode
// drops exactly the one "▁" that add_dummy_prefix put in front, so leading spaces, tabs and newlines survive.
TEST(TokenizerSentencePiece, LlamaCppVectorsRoundTrip) {
  SWIFTCPP_REQUIRE_SHARED(kLlamaSpmInp);
  SWIFTCPP_REQUIRE_SHARED(kLlamaSpmOut);
  SWIFTCPP_REQUIRE_SHARED(kLlama2Model);
  const test::GoldenVectors vectors = test::read_llamacpp_vectors(kLlamaSpmInp, kLlamaSpmOut);
  const auto tokenizer = SentencePieceTokenizer::load(kLlama2Model);
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    EXPECT_EQ(tokenizer->decode(vectors.ids[i]), vectors.texts[i]) << "vector " << i;
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(vectors.texts[i])), vectors.texts[i]) << "vector " << i;
  }
}

TEST(TokenizerSentencePiece, Llama2SpecialIdsAndPieces) {
  SWIFTCPP_REQUIRE_SHARED(kLlama2Model);
  const auto tokenizer = SentencePieceTokenizer::load(kLlama2Model);
  EXPECT_EQ(tokenizer->unk_id(), 0);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_EQ(tokenizer->pad_id(), -1);
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int>{2});
  EXPECT_EQ(tokenizer->id_to_piece(15043), "▁Hello");
  EXPECT_EQ(tokenizer->piece_to_id("▁Hello"), 15043);
  EXPECT_EQ(tokenizer->piece_to_id("<unk>"), 0);
  EXPECT_EQ(tokenizer->piece_to_id("no such piece"), -1);
  EXPECT_TRUE(tokenizer->is_unknown(0));
  EXPECT_TRUE(tokenizer->is_control(1));
  EXPECT_TRUE(tokenizer->is_byte(13));  // <0x0A>
  EXPECT_FALSE(tokenizer->is_byte(15043));
  EXPECT_FALSE(tokenizer->is_control(-5));
}

TEST(TokenizerSentencePiece, Stories260KPiecesMatchHuggingFace) {
  SWIFTCPP_REQUIRE_SHARED(kHfLogits);
  const json reference = json::parse(read_text_file(kHfLogits));
  const auto tokenizer = SentencePieceTokenizer::load(stories_dir() / "tokenizer.model");
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  for (const char* name : {"once_upon_a_time", "arbitrary12"}) {
    const json& sequence = reference.at("sequences").at(name);
    const auto ids = sequence.at("ids").get<std::vector<int>>();
    const auto pieces = sequence.at("pieces").get<std::vector<std::string>>();
    ASSERT_EQ(ids.size(), pieces.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(tokenizer->id_to_piece(ids[i]), pieces[i]) << name << " position " << i;
      EXPECT_EQ(tokenizer->piece_to_id(pieces[i]), ids[i]) << name << " position " << i;
    }
  }
}

// A sentencepiece checkpoint whose BOS and EOS are added tokens past the model's vocabulary (Qwen's own
// generation_config.json: bos <|endoftext|>, eos [<|im_end|>, <|endoftext|>]): their pieces come from the added
// tokens, so the chat template gets them and the strings encode to their ids. It failed with "token id 512 is outside
// the vocabulary [0, 512)" when the chat template asked for the BOS piece.
TEST(TokenizerText, AddedTokensPastTheVocabularyServeAsBosAndEos) {
  TempDir dir;
  fs::copy_file(stories_dir() / "tokenizer.model", dir.path() / "tokenizer.model");
  json config = {{"add_bos_token", false},
                 {"added_tokens_decoder", {{"512", {{"content", "<|endoftext|>"}, {"special", true}}},
                                          {"513", {{"content", "<|im_start|>"}, {"special", true}}},
                                          {"514", {{"content", "<|im_end|>"}, {"special", true}}}}}};
  std::ofstream(dir.path() / "tokenizer_config.json") << config.dump();
  std::ofstream(dir.path() / "generation_config.json") << R"({"bos_token_id": 512, "eos_token_id": [514, 512]})";
  const auto tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->id_to_piece(512), "<|endoftext|>");
  EXPECT_EQ(tokenizer->id_to_piece(514), "<|im_end|>");
  EXPECT_EQ(tokenizer->id_to_piece(1), tokenizer->base().id_to_piece(1));
  EXPECT_THROW(tokenizer->id_to_piece(600), Error);
  const auto chat = chat_template_for(*tokenizer, "chatml");
  ASSERT_NE(chat, nullptr);
  const std::string text = chat->render_text({{"user", "hi", std::nullopt}}, /*add_generation_prompt=*/true);
  const std::vector<int> ids = tokenizer->encode_with_special_tokens(text);
  EXPECT_EQ(ids.front(), 513) << show(ids);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 514), 1) << show(ids);
  EXPECT_TRUE(tokenizer->is_eos(514));
}

TEST(TokenizerText, Stories260KOnceUponATime) {
  const auto tokenizer = load_tokenizer(stories_dir());
  EXPECT_EQ(tokenizer->encode_with_specials("Once upon a time"), (std::vector<int>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->encode("Once upon a time"), (std::vector<int>{403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int>{2});
  EXPECT_TRUE(tokenizer->is_eos(2));
  EXPECT_FALSE(tokenizer->is_eos(1));
  EXPECT_TRUE(tokenizer->specials().add_bos);
  EXPECT_FALSE(tokenizer->specials().add_eos);
  EXPECT_FALSE(tokenizer->specials().pad.has_value());
}

// hf_logits.json: records[i].ids = [1] + sentencepiece.encode(instruction + "\n" + input + "\n" + output),
// truncated to 256 ids, for alpaca_en_demo.json rows 0..19.
TEST(TokenizerText, Stories260KAlpacaReferenceIds) {
  SWIFTCPP_REQUIRE_SHARED(kHfLogits);
  SWIFTCPP_REQUIRE_SHARED(kAlpaca);
  const json reference = json::parse(read_text_file(kHfLogits));
  const json alpaca = json::parse(read_text_file(kAlpaca));
  const json& records = reference.at("alpaca_nll").at("records");
  ASSERT_EQ(records.size(), 20u);
  const auto tokenizer = load_tokenizer(stories_dir());
  for (const json& record : records) {
    const size_t index = record.at("index").get<size_t>();
    const json& row = alpaca.at(index);
    const std::string text = row.at("instruction").get<std::string>() + "\n" + row.at("input").get<std::string>() +
                             "\n" + row.at("output").get<std::string>();
    std::vector<int> ids = tokenizer->encode_with_specials(text);
    EXPECT_EQ(ids.size(), record.at("n_tokens_untruncated").get<size_t>()) << "record " << index;
    if (ids.size() > 256) ids.resize(256);
    EXPECT_EQ(ids, record.at("ids").get<std::vector<int>>()) << "record " << index;
  }
}

TEST(TokenizerText, Stories260KGreedyTextDecodes) {
  SWIFTCPP_REQUIRE_SHARED(kHfLogits);
  const json reference = json::parse(read_text_file(kHfLogits));
  const auto tokenizer = load_tokenizer(stories_dir());
  for (const char* name : {"from_bos", "from_once_upon_a_time"}) {
    const json& run = reference.at("greedy_generate").at(name);
    if (run.contains("new_text")) {
      EXPECT_EQ(tokenizer->decode(run.at("new_ids").get<std::vector<int>>()), run.at("new_text").get<std::string>())
          << name;
    }
    if (run.contains("full_text")) {
      // full_ids start with BOS, a control piece that decodes to nothing.
      EXPECT_EQ(tokenizer->decode(run.at("full_ids").get<std::vector<int>>()), run.at("full_text").get<std::string>())
          << name;
    }
  }
}

// stories260K's model sets remove_extra_whitespaces, so unlike Llama 2 it does not round-trip runs of spaces.
TEST(TokenizerText, Stories260KCollapsesExtraWhitespace) {
  const auto tokenizer = load_tokenizer(stories_dir());
  EXPECT_EQ(tokenizer->encode("  Once   upon "), tokenizer->encode("Once upon"));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("  Once   upon ")), "Once upon");
}

TEST(TokenizerText, SpecialTokensFollowPrecedence) {
  TempDir dir;
  fs::copy_file(stories_dir() / "tokenizer.model", dir.path() / "tokenizer.model");
  // tokenizer_config names the tokens; generation_config overrides EOS with a list; config.json is lowest.
  write_file_atomic(dir.path() / "tokenizer_config.json", R"({
    "add_bos_token": false, "add_eos_token": true,
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>", "pad_token": "<unk>", "unk_token": "<unk>"})");
  write_file_atomic(dir.path() / "generation_config.json", R"({"eos_token_id": [2, 403], "do_sample": false})");
  write_file_atomic(dir.path() / "config.json", R"({"bos_token_id": 7, "eos_token_id": 9, "pad_token_id": 11})");
  auto tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->specials().bos, 1);  // tokenizer_config beats config.json
  EXPECT_EQ(tokenizer->specials().eos, (std::vector<int>{2, 403}));
  EXPECT_EQ(tokenizer->specials().pad, 0);
  EXPECT_FALSE(tokenizer->specials().add_bos);
  EXPECT_TRUE(tokenizer->specials().add_eos);
  EXPECT_TRUE(tokenizer->is_eos(403));
  // add_eos appends the first eos id.
  EXPECT_EQ(tokenizer->encode_with_specials("Once upon a time"), (std::vector<int>{403, 407, 261, 378, 2}));

  // Without tokenizer_config.json, config.json supplies the ids (and add_bos defaults to true).
  fs::remove(dir.path() / "tokenizer_config.json");
  fs::remove(dir.path() / "generation_config.json");
  tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->specials().bos, 7);
  EXPECT_EQ(tokenizer->specials().eos, std::vector<int>{9});
  EXPECT_EQ(tokenizer->specials().pad, 11);
  EXPECT_EQ(tokenizer->encode_with_specials("Once"), (std::vector<int>{7, 403}));

  // generation_config.json beats config.json for BOS too.
  write_file_atomic(dir.path() / "generation_config.json", R"({"bos_token_id": 5, "eos_token_id": 6})");
  tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->specials().bos, 5);
  EXPECT_EQ(tokenizer->specials().eos, std::vector<int>{6});

  // With only tokenizer.model, the model's own ids apply (stories260K: BOS 1, EOS 2, no pad).
  fs::remove(dir.path() / "generation_config.json");
  fs::remove(dir.path() / "config.json");
  tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->specials().bos, 1);
  EXPECT_EQ(tokenizer->specials().eos, std::vector<int>{2});
  EXPECT_FALSE(tokenizer->specials().pad.has_value());
  EXPECT_TRUE(tokenizer->specials().add_bos);
}

TEST(TokenizerText, AddedTokensDecoderResolvesTokenStrings) {
  TempDir dir;
  fs::copy_file(stories_dir() / "tokenizer.model", dir.path() / "tokenizer.model");
  write_file_atomic(dir.path() / "tokenizer_config.json", R"({
    "eos_token": "<|im_end|>",
    "added_tokens_decoder": {"512": {"content": "<|im_end|>", "special": true}}})");
  const auto tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int>{512});
}

TEST(TokenizerText, BadSpecialTokenConfigIsConfigError) {
  TempDir dir;
  fs::copy_file(stories_dir() / "tokenizer.model", dir.path() / "tokenizer.model");
  write_file_atomic(dir.path() / "tokenizer_config.json", R"({"eos_token": "<|not in vocab|>"})");
  try {
    load_tokenizer(dir.path());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eos_token"), std::string::npos) << e.what();
  }
  write_file_atomic(dir.path() / "tokenizer_config.json", R"({})");
  write_file_atomic(dir.path() / "generation_config.json", R"({"eos_token_id": "two"})");
  EXPECT_THROW(load_tokenizer(dir.path()), ConfigError);
  write_file_atomic(dir.path() / "generation_config.json", R"({"eos_token_id": [2, -1]})");
  EXPECT_THROW(load_tokenizer(dir.path()), ConfigError);
  write_file_atomic(dir.path() / "generation_config.json", R"({"eos_token_id": 2})");
  write_file_atomic(dir.path() / "tokenizer_config.json", R"({"add_bos_token": "yes"})");
  EXPECT_THROW(load_tokenizer(dir.path()), ConfigError);
  write_file_atomic(dir.path() / "tokenizer_config.json", R"({"add_bos_token": true)");
  EXPECT_THROW(load_tokenizer(dir.path()), FormatError);
}

TEST(TokenizerErrors, MissingFilesAreIoErrors) {
  TempDir dir;
  EXPECT_THROW(SentencePieceTokenizer::load(dir.path() / "tokenizer.model"), IoError);
  EXPECT_THROW(SentencePieceTokenizer::load(dir.path()), IoError);
  EXPECT_THROW(load_tokenizer(dir.path() / "no_such_folder"), IoError);
  try {
    load_tokenizer(dir.path());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(dir.path().string()), std::string::npos) << message;
    EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;
    EXPECT_NE(message.find("tokenizer.model"), std::string::npos) << message;
  }
  // A tokenizer.json that is not a tokenizer is a format error naming it.
  write_file_atomic(dir.path() / "tokenizer.json", "{}");
  try {
    load_tokenizer(dir.path());
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find((dir.path() / "tokenizer.json").string()), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, CorruptModelIsFormatErrorNamingTheFile) {
  TempDir dir;
  const std::string real = read_text_file(stories_dir() / "tokenizer.model");
  std::string random(4096, '\0');
  uint32_t state = 12345;
  for (char& c : random) {
    state = state * 1664525u + 1013904223u;
    c = static_cast<char>(state >> 24);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty.model", ""},
      {"text.model", "this is not a sentencepiece model\n"},
      {"random.model", random},
      {"truncated.model", real.substr(0, real.size() / 2)},
  };
  for (const auto& [name, content] : cases) {
    const fs::path path = dir.path() / name;
    write_file_atomic(path, content);
    try {
      SentencePieceTokenizer::load(path);
      ADD_FAILURE() << name << ": expected FormatError";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
  // load_tokenizer passes the error through.
  write_file_atomic(dir.path() / "tokenizer.model", "garbage");
  EXPECT_THROW(load_tokenizer(dir.path()), FormatError);
}

TEST(TokenizerErrors, IdsOutsideTheVocabularyThrow) {
  const auto tokenizer = SentencePieceTokenizer::load(stories_dir() / "tokenizer.model");
  EXPECT_THROW(tokenizer->decode({403, 512}), Error);
  EXPECT_THROW(tokenizer->decode({-1}), Error);
  EXPECT_THROW(tokenizer->id_to_piece(512), Error);
  EXPECT_THROW(tokenizer->id_to_piece(-1), Error);
  EXPECT_EQ(tokenizer->decode({}), "");
  EXPECT_TRUE(tokenizer->encode("").empty());
}

TEST(TokenizerText, SpecialTokensValidation) {
  const std::shared_ptr<const Tokenizer> base = SentencePieceTokenizer::load(stories_dir() / "tokenizer.model");
  SpecialTokens specials;
  specials.bos.reset();
  specials.add_bos = true;
  EXPECT_THROW(TextTokenizer(base, specials), ConfigError);
  specials.add_bos = false;
  specials.add_eos = true;
  EXPECT_THROW(TextTokenizer(base, specials), ConfigError);
  specials.eos = {2};
  TextTokenizer tokenizer(base, specials);
  EXPECT_EQ(tokenizer.encode_with_specials("Once"), (std::vector<int>{403, 2}));
  EXPECT_EQ(tokenizer.bos_id(), -1);
}

// A loaded tokenizer is shared between threads (the data loader encodes in parallel).
TEST(TokenizerSentencePiece, ConcurrentEncodeMatchesSerial) {
  const auto tokenizer = load_tokenizer(stories_dir());
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("Once upon a time, " + std::to_string(i) + " little dogs played.\n");
  std::vector<std::vector<int>> serial;
  for (const auto& text : texts) serial.push_back(tokenizer->encode_with_specials(text));
  std::vector<std::vector<std::vector<int>>> parallel(4, std::vector<std::vector<int>>(texts.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < parallel.size(); ++t) {
    threads.emplace_back([&, t]() {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) parallel[t][i] = tokenizer->encode_with_specials(texts[i]);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& results : parallel) EXPECT_EQ(results, serial);
}

// LibTorch and the sentencepiece shim in one process, used together: the point of the dlopen design.
TEST(TokenizerSentencePiece, WorksAlongsideLibTorch) {
  const auto tokenizer = load_tokenizer(stories_dir());
  const std::vector<int> ids = tokenizer->encode_with_specials("Once upon a time");
  const at::Tensor tensor = at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong);
  // tensor: [T]
  EXPECT_EQ(tensor.size(0), 5);
  EXPECT_EQ(tensor.sum().item<int64_t>(), 1 + 403 + 407 + 261 + 378);
  EXPECT_EQ(at::ones({2, 3}).sum().item<float>(), 6.0f);
}

}  // namespace
}  // namespace swiftcpp
