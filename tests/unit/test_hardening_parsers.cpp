// Parsers of outside data under hostile input: nesting depth, numbers out of range, declared sizes that the data
// cannot back (2^40 bytes), unpacking limits. Each test reproduces an input that crashed, hung, aborted or
// allocated far too much before its fix; the crashes the fuzz targets (fuzz/) found are here too.
#include <ATen/ATen.h>
#include <bzlib.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "core/json.h"
#include "data/dataset.h"
#include "eval/archive.h"
#include "eval/tasks.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "peft/lora.h"
#include "tests/test_util.h"
#include "tokenizer/bpe.h"
#include "train/config.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// `depth` nested JSON arrays around 1.
std::string nested_arrays(size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// Peak resident memory of this process since the last reset_peak_rss(), in MiB (VmHWM), or -1 where the kernel
// does not offer it.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------------------------
// JSON: depth limit, short error excerpts, numbers out of range.

TEST(HardeningJson, NestingDeeperThanTheLimitIsAFormatErrorNotAStackOverflow) {
  expect_error<FormatError>([] { (void)parse_json(nested_arrays(100000), "deep.json"); },
                            {"deep.json", "nested deeper than 512"});
  expect_error<FormatError>([] { (void)parse_json(nested_arrays(kMaxJsonDepth + 1), "x.json"); }, {"x.json"});
  EXPECT_NO_THROW((void)parse_json(nested_arrays(kMaxJsonDepth), "x.json"));
  // Objects count as well as arrays.
  std::string objects;
  for (int i = 0; i < 600; ++i) objects += "{\"a\":";
  objects += "1" + std::string(600, '}');
  expect_error<FormatError>([&] { (void)parse_json(objects, "obj.json"); }, {"obj.json", "nested deeper"});
}

TEST(HardeningJson, ConfigJsonNested100000DeepIsRefusedCleanly) {
  const fs::path dir = test::temp_dir("hardening_deep_config");
  write_bytes(dir / "config.json", "{\"model_type\": \"llama\", \"hidden_size\": " + nested_arrays(100000) + "}");
  expect_error<FormatError>([&] { (void)load_decoder_config(dir); }, {"config.json", "nested deeper"});
}

TEST(HardeningJson, AdapterConfigNested100000DeepIsRefusedCleanly) {
  const fs::path dir = test::temp_dir("hardening_deep_adapter");
  write_bytes(dir / "adapter_config.json", "{\"r\": " + nested_arrays(100000) + "}");
  expect_error<FormatError>([&] { (void)read_adapter_config(dir); }, {"adapter_config.json", "nested deeper"});
}

TEST(HardeningJson, TokenizerAndGenerationConfigNested100000DeepAreRefusedCleanly) {
  for (const char* file : {"tokenizer_config.json", "generation_config.json"}) {
    const fs::path dir = test::temp_dir(std::string("hardening_deep_") + file);
    fs::copy_file(test::stories_dir() / "tokenizer.model", dir / "tokenizer.model");
    write_bytes(dir / file, "{\"eos_token_id\": " + nested_arrays(100000) + ", \"eos_token\": " +
                                nested_arrays(100000) + "}");
    expect_error<FormatError>([&] { (void)load_tokenizer(dir); }, {file, "nested deeper"});
  }
}

TEST(HardeningJson, ErrorsShowAShortExcerptNotTheWholeValue) {
  // 20,000 levels is refused by the depth limit; 500 levels (allowed) and a 1 MB string are shown in short.
  const fs::path dir = test::temp_dir("hardening_excerpt");
  write_bytes(dir / "config.json", "{\"model_type\": \"llama\", \"hidden_size\": " + nested_arrays(20000) + "}");
  try {
    (void)load_decoder_config(dir);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_LT(std::strlen(e.what()), 400u) << std::string(e.what()).substr(0, 400);
  }
  const JsonObject deep(parse_json("{\"n\": " + nested_arrays(500) + "}", "cfg.json"), "cfg.json");
  try {
    (void)deep.get<int64_t>("n");
    ADD_FAILURE() << "no exception";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_LT(message.size(), 300u) << message.substr(0, 300);
    EXPECT_NE(message.find("cfg.json"), std::string::npos) << message;
    EXPECT_NE(message.find("'n'"), std::string::npos) << message;
    EXPECT_NE(message.find("an array of 1 elements [[[["), std::string::npos) << message;
  }
  const JsonObject long_string(Json{{"n", std::string(1 << 20, 'x')}}, "cfg.json");
  try {
    (void)long_string.get<int64_t>("n");
    ADD_FAILURE() << "no exception";
  } catch (const ConfigError& e) {
    EXPECT_LT(std::strlen(e.what()), 300u);
    EXPECT_NE(std::string(e.what()).find("the string \"xxxx"), std::string::npos) << e.what();
  }
}

TEST(HardeningJson, IntegersOutOfRangeOfTheFieldAreConfigErrors) {
  const JsonObject j(parse_json(R"({"big": 1e300, "wide": 1099511627776, "huge": 18446744073709551615, "neg": -1,
                                   "ok": 3.0})",
                                "cfg.json"),
                     "cfg.json");
  expect_error<ConfigError>([&] { (void)j.get<int64_t>("big"); }, {"cfg.json", "'big'", "out of range"});
  expect_error<ConfigError>([&] { (void)j.get<int>("wide"); }, {"'wide'", "out of range"});
  expect_error<ConfigError>([&] { (void)j.get<int64_t>("huge"); }, {"'huge'", "out of range"});
  expect_error<ConfigError>([&] { (void)j.get<uint32_t>("neg"); }, {"'neg'", "out of range"});
  EXPECT_EQ(j.get<int64_t>("wide"), int64_t{1} << 40);
  EXPECT_EQ(j.get<int>("ok"), 3);
}

TEST(HardeningJson, ANumberBeyondDoubleIsAFormatErrorNotOutOfRange) {
  expect_error<FormatError>([] { (void)parse_json(R"({"output": 1e999})", "row.json"); }, {"row.json", "1e999"});
  Json out;
  std::string error;
  EXPECT_FALSE(try_parse_json(R"({"output": -1e999})", out, error));
  EXPECT_NE(error.find("number overflow"), std::string::npos) << error;
}

// ---------------------------------------------------------------------------------------------------------------
// Datasets.

TEST(HardeningDataset, RowWithANumberBeyondDoubleIsABadRowNamingFileAndLine) {
  const fs::path dir = test::temp_dir("hardening_1e999");
  const fs::path file = dir / "rows.jsonl";
  write_bytes(file, "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"hi\", \"input\": \"\", \"output\": 1e999}\n");
  std::vector<std::string> rows;
  // Strict mode: the bad-row callback throws, as the data pipeline does.
  expect_error<BadRowError>(
      [&] {
        for_each_row(
            {file, std::nullopt}, [&](Json&&, const std::string& where) { rows.push_back(where); },
            [](const std::string& where, const std::string& reason, const std::string& detail) {
              throw BadRowError(where, reason, detail);
            });
      },
      {"rows.jsonl:2", "invalid JSON", "1e999"});
  EXPECT_EQ(rows, std::vector<std::string>{file.string() + ":1"});

  const fs::path array = dir / "rows.json";
  write_bytes(array, "[{\"instruction\": \"a\", \"output\": \"b\"}, {\"instruction\": \"hi\", \"output\": 1e999}]");
  expect_error<FormatError>(
      [&] { for_each_row({array, std::nullopt}, [](Json&&, const std::string&) {}, [](auto&&...) {}); },
      {"rows.json", "row #1", "1e999"});
}

TEST(HardeningDataset, ContentPartWhoseTypeIsNotAStringIsABadRow) {
  const Json row = parse_json(R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "hi"}]},
                                               {"role": "assistant", "content": "yo"}]})",
                              "row");
  expect_error<BadRowError>([&] { (void)normalise_row(row, "rows.jsonl:3"); },
                            {"rows.jsonl:3", "non-text content", "an object of 2 keys"});
}

TEST(HardeningDataset, ArrayFileNestedTooDeeplyIsAFormatError) {
  const fs::path file = test::temp_dir("hardening_deep_rows") / "rows.json";
  write_bytes(file, "[{\"text\": " + nested_arrays(100000) + "}]");
  expect_error<FormatError>(
      [&] { for_each_row({file, std::nullopt}, [](Json&&, const std::string&) {}, [](auto&&...) {}); },
      {"rows.json", "nested deeper"});
}

TEST(HardeningDataset, RowCountBeyond64BitsIsAConfigErrorNamingTheSpec) {
  const std::string spec = "data.jsonl#99999999999999999999999999";
  expect_error<ConfigError>([&] { (void)parse_dataset_source(spec); }, {spec, "positive row count"});
  EXPECT_EQ(*parse_dataset_source("data.jsonl#9223372036854775807").limit, INT64_MAX);
  expect_error<ConfigError>([] { (void)parse_dataset_source("d.jsonl#9223372036854775808"); }, {"d.jsonl#"});
}

// ---------------------------------------------------------------------------------------------------------------
// Recipes.

// Found by fuzz_recipe: a string value that is not UTF-8 was accepted, and writing args.json (dump()) then threw
// nlohmann's type_error out of the trainer.
TEST(HardeningRecipe, StringValuesThatAreNotUtf8AreConfigErrors) {
  const fs::path recipe = test::temp_dir("hardening_recipe") / "recipe.yaml";
  write_bytes(recipe, "model: models/stories260K\nsystem: \"caf\xC3\"\n");
  expect_error<ConfigError>([&] { (void)load_train_config(recipe.string(), {}); },
                            {"recipe.yaml", "'system'", "UTF-8"});
  write_bytes(recipe, "target_modules: [q_proj, \"v\x8F\"]\n");
  expect_error<ConfigError>([&] { (void)load_train_config(recipe.string(), {}); }, {"'target_modules'", "UTF-8"});
  expect_error<ConfigError>([] { (void)load_train_config("", {"output_dir=out\xFF"}); }, {"'output_dir'", "UTF-8"});
  const TrainConfig ok = load_train_config("", {"dataset=d.jsonl", "system=caf\xC3\xA9"});
  EXPECT_NE(train_config_schema().dump(ok).dump().find("caf\xC3\xA9"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------------
// sentencepiece on very long text (a 30 MB row took > 20 s and GBs in one sentencepiece call).

std::string random_words(size_t bytes, uint32_t seed) {
  static const char* const kWords[] = {"the", "Cat", "42", "na\xC3\xAFve", "\xE6\x97\xA5\xE6\x9C\xAC", "x", "  ",
                                       "\n", "a", "b", ",", ".", "don't", "\t", "\xF0\x9F\x99\x82", "Z9", " ", "<s>"};
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    text += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
    if (rng() % 5 != 0) text += ' ';
  }
  return text;
}

TEST(HardeningSentencePiece, LongTextIsEncodedInPiecesToTheSameIds) {
  for (const fs::path& model : {test::stories_dir() / "tokenizer.model", test::assets() / "tokenizers/llama2/tokenizer.model"}) {
    if (!fs::exists(model)) continue;
    const auto tok = SentencePieceTokenizer::load(model);
    EXPECT_TRUE(tok->cuts_long_texts()) << model;
    const std::string text = random_words(300000, 7);
    const std::vector<int> ids = tok->encode(text);
    EXPECT_EQ(ids, tok->encode_whole(text)) << model;
    EXPECT_EQ(tok->decode(ids), tok->decode(tok->encode_whole(text))) << model;
  }
}

TEST(HardeningSentencePiece, EightMegabytesOfTextUseLittleMemory) {
  const auto tok = SentencePieceTokenizer::load(test::stories_dir() / "tokenizer.model");
  std::string text;
  while (text.size() < 8'000'000) text += "Once upon a time there was a cat named 42. ";
  reset_peak_rss();
  const double before = peak_rss_mib();
  const std::vector<int> ids = tok->encode(text);
  EXPECT_GT(ids.size(), 1'000'000u);
  // One sentencepiece call on the whole text peaks at about 660 MiB more; cut into pieces, about 20 MiB.
  if (before > 0) {
    EXPECT_LT(peak_rss_mib() - before, 256.0);
  }
}

// Found by fuzz_tokenizer_json: a vocabulary id of 477 million in a 2 KB tokenizer.json sized the id tables to
// 15 GB before anything else was checked.
TEST(HardeningBpe, TokenIdsFarBeyondTheVocabularyAreRefused) {
  Json root = parse_json(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
                             "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
                             "decoder": {"type": "ByteLevel"}})",
                         "tokenizer.json");
  EXPECT_EQ(BpeTokenizer::from_json(root, "tokenizer.json")->encode("ab"), std::vector<int>{2});
  Json far = root;
  far["model"]["vocab"]["b"] = 477000000;
  reset_peak_rss();
  const double before = peak_rss_mib();
  expect_error<FormatError>([&] { (void)BpeTokenizer::from_json(far, "tokenizer.json"); },
                            {"tokenizer.json", "token id 477000000", "far beyond"});
  Json added = root;
  added["added_tokens"] = Json::array({{{"id", 2147483647}, {"content", "<x>"}, {"special", true}}});
  expect_error<FormatError>([&] { (void)BpeTokenizer::from_json(added, "tokenizer.json"); },
                            {"token id 2147483647", "far beyond"});
  if (before > 0) {
    EXPECT_LT(peak_rss_mib() - before, 64.0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// GGUF: counts, lengths and dimensions declaring 2^40 are refused before anything is reserved.

struct GgufBytes {
  std::string s;
  template <typename T>
  GgufBytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  GgufBytes& str(const std::string& v) {
    put<uint64_t>(v.size());
    s += v;
    return *this;
  }
};

constexpr uint64_t kTwo40 = uint64_t{1} << 40;

GgufBytes gguf_header(uint64_t tensors, uint64_t kvs) {
  GgufBytes b;
  b.s = "GGUF";
  b.put<uint32_t>(3).put<uint64_t>(tensors).put<uint64_t>(kvs);
  return b;
}

std::string pad(std::string s, size_t n) { return s + std::string(n, '\0'); }

TEST(HardeningGguf, CountsDeclaring2To40AreRefusedUpFront) {
  const fs::path dir = test::temp_dir("hardening_gguf_counts");
  write_bytes(dir / "t.gguf", pad(gguf_header(kTwo40, 0).s, 256));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "t.gguf"); }, {"t.gguf", "declares 1099511627776 tensors"});
  write_bytes(dir / "k.gguf", pad(gguf_header(0, kTwo40).s, 256));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "k.gguf"); },
                            {"k.gguf", "declares 1099511627776 metadata entries"});
}

TEST(HardeningGguf, StringAndArrayLengthsDeclaring2To40AreRefused) {
  const fs::path dir = test::temp_dir("hardening_gguf_lengths");
  GgufBytes key = gguf_header(0, 1);
  key.put<uint64_t>(kTwo40);  // key length
  write_bytes(dir / "key.gguf", pad(key.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "key.gguf"); }, {"key.gguf", "1099511627776"});

  GgufBytes value = gguf_header(0, 1);
  value.str("k").put<uint32_t>(8).put<uint64_t>(kTwo40);  // a string value
  write_bytes(dir / "value.gguf", pad(value.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "value.gguf"); }, {"value.gguf", "1099511627776"});

  // An array of 2^40 strings, and an array of uint64 whose count fits in bytes but not in 8-byte elements.
  GgufBytes strings = gguf_header(0, 1);
  strings.str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(kTwo40);
  write_bytes(dir / "strings.gguf", pad(strings.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "strings.gguf"); },
                            {"strings.gguf", "array of 1099511627776 elements"});
  GgufBytes wide = gguf_header(0, 1);
  wide.str("k").put<uint32_t>(9).put<uint32_t>(10).put<uint64_t>(1000);
  write_bytes(dir / "wide.gguf", pad(wide.s, 1000));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "wide.gguf"); },
                            {"wide.gguf", "array of 1000 elements of at least 8 bytes"});
  GgufBytes unknown = gguf_header(0, 1);
  unknown.str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0);
  write_bytes(dir / "unknown.gguf", pad(unknown.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "unknown.gguf"); }, {"unknown array element type 77"});
}

TEST(HardeningGguf, DimensionsWhoseProductOverflowsAreRefused) {
  const fs::path dir = test::temp_dir("hardening_gguf_dims");
  GgufBytes b = gguf_header(1, 0);
  b.str("w").put<uint32_t>(4);
  for (int i = 0; i < 4; ++i) b.put<uint64_t>(kTwo40);  // 2^160 elements: 0 after wrapping around 2^64
  b.put<uint32_t>(0).put<uint64_t>(0);
  write_bytes(dir / "dims.gguf", pad(b.s, 256));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "dims.gguf"); }, {"dims.gguf", "tensor w", "2^60"});
}

TEST(HardeningGguf, TensorOffsetNear2To64IsRefusedNotWrapped) {
  const fs::path dir = test::temp_dir("hardening_gguf_offset");
  GgufBytes b = gguf_header(1, 0);
  b.str("w").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).put<uint64_t>(UINT64_MAX - 31);  // 32-aligned
  write_bytes(dir / "offset.gguf", pad(b.s, 256));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "offset.gguf"); }, {"offset.gguf", "runs past the end"});
}

// Found by fuzz_gguf: a metadata string cut inside a UTF-8 character was accepted into the metadata JSON, whose
// dump() then threw nlohmann's type_error (an uncaught exception, not a swiftcpp error).
TEST(HardeningGguf, StringsThatAreNotUtf8AreRefused) {
  const fs::path dir = test::temp_dir("hardening_gguf_utf8");
  GgufBytes value = gguf_header(0, 1);
  value.str("general.name").put<uint32_t>(8).str("caf\xC3");
  write_bytes(dir / "value.gguf", pad(value.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "value.gguf"); }, {"value.gguf", "not valid UTF-8"});
  GgufBytes array = gguf_header(0, 1);
  array.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("\xCC");
  write_bytes(dir / "array.gguf", pad(array.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "array.gguf"); }, {"array.gguf", "not valid UTF-8"});
  GgufBytes key = gguf_header(0, 1);
  key.str("k\xFF").put<uint32_t>(4).put<uint32_t>(1);
  write_bytes(dir / "key.gguf", pad(key.s, 64));
  expect_error<FormatError>([&] { (void)GgufFile::open(dir / "key.gguf"); }, {"key.gguf", "not valid UTF-8"});
  GgufBytes good = gguf_header(0, 1);
  good.str("general.name").put<uint32_t>(8).str("caf\xC3\xA9 \xF0\x9F\x99\x82");
  write_bytes(dir / "good.gguf", pad(good.s, 64));
  const auto file = GgufFile::open(dir / "good.gguf");
  EXPECT_EQ(file->at("general.name").value.dump(), "\"caf\xC3\xA9 \xF0\x9F\x99\x82\"");
}

TEST(HardeningGguf, AFifoIsRefusedInsteadOfWaitedOn) {
  const fs::path fifo = test::temp_dir("hardening_gguf_fifo") / "model.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error<IoError>([&] { (void)GgufFile::open(fifo); }, {"model.gguf", "not a regular file"});
}

// ---------------------------------------------------------------------------------------------------------------
// safetensors: a header or shape declaring 2^40 bytes.

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

TEST(HardeningSafetensors, HeaderLengthAndShapesDeclaring2To40AreRefused) {
  const fs::path dir = test::temp_dir("hardening_st");
  std::string big(8, '\0');
  std::memcpy(big.data(), &kTwo40, 8);
  write_bytes(dir / "header.safetensors", big + "{}");
  reset_peak_rss();
  const double before = peak_rss_mib();
  expect_error<FormatError>([&] { (void)SafetensorsFile::open(dir / "header.safetensors"); },
                            {"header.safetensors", "header length 1099511627776"});
  write_bytes(dir / "shape.safetensors",
              safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [1099511627776], "data_offsets": [0, 4]}})", "abcd"));
  expect_error<FormatError>([&] { (void)SafetensorsFile::open(dir / "shape.safetensors"); },
                            {"shape.safetensors", "'w'", "needs 4398046511104 bytes"});
  if (before > 0) {
    EXPECT_LT(peak_rss_mib() - before, 64.0);
  }
}

TEST(HardeningSafetensors, ShapeWithAZeroDimensionAndAnOverflowingProductIsRefused) {
  const fs::path file = test::temp_dir("hardening_st_zero") / "z.safetensors";
  write_bytes(file, safetensors_bytes(
                        R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904, 0], "data_offsets": [0, 0]}})",
                        ""));
  expect_error<FormatError>([&] { (void)SafetensorsFile::open(file); }, {"z.safetensors", "'w'", "overflows"});
}

TEST(HardeningSafetensors, AFifoIsRefusedInsteadOfWaitedOn) {
  const fs::path fifo = test::temp_dir("hardening_st_fifo") / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error<IoError>([&] { (void)SafetensorsFile::open(fifo); }, {"model.safetensors", "not a regular file"});
}

TEST(HardeningSafetensors, ShardedIndexDeclaringAHugeTotalSizeReservesNothing) {
  const fs::path dir = test::temp_dir("hardening_index");
  save_safetensors(dir / "s1.safetensors", {{"a", at::ones({2})}});
  write_bytes(dir / "model.safetensors.index.json",
              R"({"metadata": {"total_size": 1099511627776}, "weight_map": {"a": "s1.safetensors"}})");
  reset_peak_rss();
  const double before = peak_rss_mib();
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.names(), std::vector<std::string>{"a"});
  if (before > 0) {
    EXPECT_LT(peak_rss_mib() - before, 64.0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Compressed eval data: declared sizes and unpacking limits.

// A zip archive of one member with the given method, declared sizes and data (CRC of `crc_of`).
std::string zip_with_member(const std::string& name, uint16_t method, const std::string& data, uint32_t declared_size,
                            uint32_t crc) {
  GgufBytes b;  // little-endian field writer
  b.put<uint32_t>(0x04034b50).put<uint16_t>(20).put<uint16_t>(0).put<uint16_t>(method).put<uint32_t>(0);
  b.put<uint32_t>(crc).put<uint32_t>(static_cast<uint32_t>(data.size())).put<uint32_t>(declared_size);
  b.put<uint16_t>(static_cast<uint16_t>(name.size())).put<uint16_t>(0);
  b.s += name + data;
  const uint32_t cd_offset = static_cast<uint32_t>(b.s.size());
  b.put<uint32_t>(0x02014b50).put<uint16_t>(20).put<uint16_t>(20).put<uint16_t>(0).put<uint16_t>(method);
  b.put<uint32_t>(0).put<uint32_t>(crc).put<uint32_t>(static_cast<uint32_t>(data.size())).put<uint32_t>(declared_size);
  b.put<uint16_t>(static_cast<uint16_t>(name.size())).put<uint16_t>(0).put<uint16_t>(0).put<uint16_t>(0);
  b.put<uint16_t>(0).put<uint32_t>(0).put<uint32_t>(0);
  b.s += name;
  const uint32_t cd_size = static_cast<uint32_t>(b.s.size()) - cd_offset;
  b.put<uint32_t>(0x06054b50).put<uint16_t>(0).put<uint16_t>(0).put<uint16_t>(1).put<uint16_t>(1);
  b.put<uint32_t>(cd_size).put<uint32_t>(cd_offset).put<uint16_t>(0);
  return b.s;
}

std::string raw_deflate(const std::string& text) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&s, text.size()), '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  s.avail_in = static_cast<uInt>(text.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

uint32_t crc_of(const std::string& text) {
  return static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
}

TEST(HardeningArchive, ZipMemberDeclaringFourGigabytesIsRefusedBeforeAllocating) {
  const fs::path file = test::temp_dir("hardening_zip_declared") / "data.zip";
  const std::string text = "question,a,b,c,d,A\n";
  write_bytes(file, zip_with_member("test.csv", 8, raw_deflate(text), 0xFFFFFF00u, crc_of(text)));
  const ZipArchive zip = ZipArchive::open(file);
  reset_peak_rss();
  const double before = peak_rss_mib();
  expect_error<FormatError>([&] { (void)zip.read("test.csv"); },
                            {"data.zip", "test.csv", "declares 4294967040 uncompressed bytes", "more than deflate"});
  if (before > 0) {
    EXPECT_LT(peak_rss_mib() - before, 64.0);
  }
}

TEST(HardeningArchive, ZipMemberIsUnpackedUnderASizeLimit) {
  const fs::path file = test::temp_dir("hardening_zip_limit") / "data.zip";
  const std::string text(5000, 'x');
  write_bytes(file, zip_with_member("big.txt", 8, raw_deflate(text), 5000, crc_of(text)));
  const ZipArchive zip = ZipArchive::open(file);
  expect_error<FormatError>([&] { (void)zip.read("big.txt", 1000); },
                            {"data.zip", "big.txt", "more than the limit of 1000 bytes"});
  EXPECT_EQ(zip.read("big.txt"), text);
  EXPECT_GE(kMaxUnpackedBytes, uint64_t{4} << 30);
}

TEST(HardeningArchive, Bzip2StreamIsUnpackedUnderASizeLimit) {
  const fs::path file = test::temp_dir("hardening_bz2_limit") / "data.txt.bz2";
  std::string text(2 << 20, '\0');  // 2 MiB of zeros: a few hundred bytes compressed
  std::string packed(text.size() / 50 + 1024, '\0');
  unsigned packed_size = static_cast<unsigned>(packed.size());
  ASSERT_EQ(BZ2_bzBuffToBuffCompress(packed.data(), &packed_size, text.data(), static_cast<unsigned>(text.size()), 9,
                                     0, 0),
            BZ_OK);
  packed.resize(packed_size);
  write_bytes(file, packed);
  expect_error<FormatError>([&] { (void)read_bzip2_file(file, 1 << 20); },
                            {"data.txt.bz2", "more than the limit of 1048576 bytes"});
  expect_error<FormatError>([&] { (void)read_maybe_compressed(file, 1 << 20); }, {"limit of 1048576 bytes"});
  EXPECT_EQ(read_bzip2_file(file).size(), text.size());
}

}  // namespace
}  // namespace swiftcpp
