// GGUF: block codecs (Q8_0, Q4_0) byte for byte, writer/reader round trips with every metadata type, corrupt files,
// llama.cpp's q/k permutation, and stories260K exported and read back (same logits in f32, quantised weights where
// they belong), plus `swiftcpp export --format gguf`.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <unistd.h>

#include <fstream>

#include "core/error.h"
#include "io/gguf.h"
#include "quant/gguf_model.h"
#include "tests/test_util.h"
#include "tests/tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

uint16_t f16_bits(float x) { return c10::Half(x).x; }

TEST(GgufCodec, Q4_0BlockLayoutMatchesLlamaCppReference) {
  // x[j] = (j mod 16) - 8: the largest magnitude is -8 (first at j = 0), so d = -8 / -8 = 1 and q = x + 8; byte j
  // holds element j (low nibble) and element j + 16 (high nibble).
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8);
  std::vector<uint8_t> out(18);
  quantize_q4_0(x.data(), 32, out.data());
  EXPECT_EQ(out[0] | (out[1] << 8), f16_bits(1.0f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[2 + j], j | (j << 4)) << j;
  std::vector<float> back(32);
  dequantize_row(GgmlType::Q4_0, out.data(), 32, back.data());
  EXPECT_EQ(back, x);
  // A block of zeros: d = 0, every nibble 8, decoding to zeros.
  std::vector<float> zeros(32, 0.0f);
  quantize_q4_0(zeros.data(), 32, out.data());
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[2 + j], 0x88);
  dequantize_row(GgmlType::Q4_0, out.data(), 32, back.data());
  EXPECT_EQ(back, zeros);
}

TEST(GgufCodec, Q8_0BlockMatchesTheFormulaAndRoundsHalfAwayFromZero) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);  // max |x| = 16: d = 16/127
  std::vector<uint8_t> out(34);
  quantize_q8_0(x.data(), 32, out.data());
  EXPECT_EQ(out[0] | (out[1] << 8), f16_bits(16.0f / 127.0f));
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(static_cast<int8_t>(out[2 + j]), static_cast<int>(std::round(x[j] * (127.0f / 16.0f)))) << j;
  }
  EXPECT_EQ(static_cast<int8_t>(out[2 + 24]), 64);   // 8 * 127/16 = 63.5 rounds away from zero
  EXPECT_EQ(static_cast<int8_t>(out[2 + 8]), -64);
  // Random rows: every value within half a step of the original, plus what storing the step as f16 costs (up to
  // 127 steps x 2^-11 relative for Q8_0, 8 x 2^-11 for Q4_0).
  at::manual_seed(0);
  const at::Tensor r = at::randn({4096});
  std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(GgmlType::Q8_0, 4096)));
  quantize_q8_0(r.data_ptr<float>(), 4096, q.data());
  at::Tensor d = at::empty({4096});
  dequantize_row(GgmlType::Q8_0, q.data(), 4096, d.data_ptr<float>());
  const at::Tensor step = r.view({-1, 32}).abs().amax(1, true) / 127;
  EXPECT_TRUE(((d - r).view({-1, 32}).abs() <= step * (0.5 + 127.0 / 2048) + 1e-6).all().item<bool>());
  std::vector<uint8_t> q4(static_cast<size_t>(ggml_row_bytes(GgmlType::Q4_0, 4096)));
  quantize_q4_0(r.data_ptr<float>(), 4096, q4.data());
  dequantize_row(GgmlType::Q4_0, q4.data(), 4096, d.data_ptr<float>());
  // Q4_0 maps the largest magnitude m to -8 steps; an element near -m would need +8 and is clamped to +7: one step.
  EXPECT_TRUE(((d - r).view({-1, 32}).abs() <= r.view({-1, 32}).abs().amax(1, true) / 8 * (1.0 + 8.0 / 2048) + 1e-6).all().item<bool>());
}

fs::path write_sample(const fs::path& file) {
  GgufWriter w;
  w.set_string("general.architecture", "test");
  w.set_u32("u32", 7);
  w.set_i32("i32", -3);
  w.set_f32("f32", 0.5);
  w.set_bool("yes", true);
  w.set({"u8"}, {GgufType::UINT8, GgufType::STRING, 200});
  w.set({"i64"}, {GgufType::INT64, GgufType::STRING, -5000000000LL});
  w.set({"f64"}, {GgufType::FLOAT64, GgufType::STRING, 0.1});
  w.set_array("strings", GgufType::STRING, Json::array({"a", "", "\xe2\x96\x81the"}));
  w.set_array("floats", GgufType::FLOAT32, Json::array({1.5, -2.0}));
  at::manual_seed(1);
  w.add_tensor("matrix", at::randn({3, 64}), GgmlType::F32);
  w.add_tensor("half", at::randn({2, 32}), GgmlType::F16);
  w.add_tensor("q8", at::randn({5, 64}), GgmlType::Q8_0);
  w.add_tensor("q4", at::randn({1, 32}), GgmlType::Q4_0);
  w.add_tensor("vector", at::randn({7}), GgmlType::F32);
  w.write(file);
  return file;
}

TEST(GgufFile, RoundTripsEveryMetadataTypeAndTensorType) {
  const fs::path file = write_sample(test::temp_dir("gguf") / "sample.gguf");
  const auto g = GgufFile::open(file);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->at("general.architecture").value, "test");
  EXPECT_EQ(g->at("u32").type, GgufType::UINT32);
  EXPECT_EQ(g->at("u32").value, 7);
  EXPECT_EQ(g->at("i32").value, -3);
  EXPECT_EQ(g->at("f32").value.get<double>(), 0.5);
  EXPECT_EQ(g->at("yes").value, true);
  EXPECT_EQ(g->at("u8").value, 200);
  EXPECT_EQ(g->at("i64").value, -5000000000LL);
  EXPECT_EQ(g->at("f64").value.get<double>(), 0.1);
  EXPECT_EQ(g->at("strings").element, GgufType::STRING);
  EXPECT_EQ(g->at("strings").value, Json::array({"a", "", "\xe2\x96\x81the"}));
  EXPECT_EQ(g->at("floats").value, Json::array({1.5, -2.0}));
  ASSERT_EQ(g->tensors().size(), 5u);
  for (const auto& t : g->tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
  at::manual_seed(1);
  const at::Tensor m = at::randn({3, 64}), h = at::randn({2, 32}), q8 = at::randn({5, 64}), q4 = at::randn({1, 32}),
                   v = at::randn({7});
  // Exact: F32 and F16 are stored bytes (F16 compared with the same conversion).
  EXPECT_TRUE(at::equal(g->tensor("matrix"), m));
  EXPECT_EQ(g->find_tensor("matrix")->dims, (std::vector<int64_t>{64, 3}));  // innermost first
  EXPECT_TRUE(at::equal(g->tensor("half"), h.to(at::kHalf).to(at::kFloat)));
  EXPECT_TRUE(at::allclose(g->tensor("q8"), q8, 0, q8.abs().max().item<double>() / 127));
  EXPECT_EQ(g->tensor("q4").sizes(), (std::vector<int64_t>{1, 32}));
  EXPECT_TRUE(at::equal(g->tensor("vector"), v));
  EXPECT_EQ(fs::file_size(file) % 32, 0u);
}

TEST(GgufFile, CorruptFilesAreFormatErrorsNamingTheProblem) {
  const fs::path dir = test::temp_dir("gguf_bad");
  const fs::path good = write_sample(dir / "good.gguf");
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return dir / name;
  };
  test::expect_error<FormatError>([&] { GgufFile::open(write("magic.gguf", "GGML" + bytes.substr(4))); },
                                  {"magic.gguf", "not a GGUF file"});
  std::string v9 = bytes;
  v9[4] = 9;
  test::expect_error<FormatError>([&] { GgufFile::open(write("version.gguf", v9)); }, {"version 9"});
  test::expect_error<FormatError>([&] { GgufFile::open(write("cut-header.gguf", bytes.substr(0, 100))); },
                                  {"cut-header.gguf", "declares 10 metadata entries"});
  test::expect_error<FormatError>([&] { GgufFile::open(write("cut-data.gguf", bytes.substr(0, bytes.size() - 64))); },
                                  {"cut-data.gguf", "past the end of the file"});
  test::expect_error<IoError>([&] { GgufFile::open(dir / "absent.gguf"); }, {"absent.gguf"});
  GgufWriter w;
  EXPECT_THROW(w.add_tensor("odd", at::zeros({2, 33}), GgmlType::Q8_0), ConfigError);
}

TEST(GgufModel, QkPermutationIsLlamaCppsAndInvertible) {
  // One head of 4 rows: HF's rotate-half order (0, 1 | 2, 3) becomes interleaved pairs (0, 2, 1, 3).
  const at::Tensor w = at::arange(4, at::kFloat).unsqueeze(1);
  EXPECT_TRUE(at::equal(permute_qk(w, 1).squeeze(1), at::tensor({0.f, 2.f, 1.f, 3.f})));
  const at::Tensor r = at::randn({4 * 2 * 8, 16});
  EXPECT_TRUE(at::equal(permute_qk_inverse(permute_qk(r, 4), 4), r));
}

TEST(GgufModel, Stories260KExportsAndReadsBackWithTheSameLogits) {
  const fs::path dir = test::temp_dir("gguf_model");
  CausalLM hf = load_causal_lm(test::stories_dir());
  const GgufExportReport r = export_gguf(hf, test::stories_dir(), dir / "f32.gguf", {});
  EXPECT_EQ(r.architecture, "llama");
  EXPECT_EQ(r.fallback_tensors, 0);
  const auto g = GgufFile::open(dir / "f32.gguf");
  EXPECT_EQ(g->at("llama.block_count").value, 5);
  EXPECT_EQ(g->at("llama.rope.dimension_count").value, 8);
  EXPECT_EQ(g->at("tokenizer.ggml.model").value, "llama");
  EXPECT_EQ(g->at("general.file_type").value, 0);
  // The vocabulary is the checkpoint's, piece for piece.
  const auto tokenizer = load_tokenizer(test::stories_dir());
  const Json& tokens = g->at("tokenizer.ggml.tokens").value;
  ASSERT_EQ(static_cast<int>(tokens.size()), tokenizer->vocab_size());
  for (int i = 0; i < tokenizer->vocab_size(); ++i) ASSERT_EQ(tokens[i], tokenizer->id_to_piece(i)) << i;
  EXPECT_EQ(g->at("tokenizer.ggml.bos_token_id").value, *tokenizer->specials().bos);
  // q/k are stored permuted; reading undoes it, so the logits are the checkpoint's, bit for bit.
  EXPECT_FALSE(at::equal(g->tensor("blk.0.attn_q.weight"), hf->model->layers[0]->as<DecoderLayer>()->self_attn->q_proj->weight));
  CausalLM back = load_gguf_model(dir / "f32.gguf");
  const at::Tensor ids = at::tensor({1, 403, 407, 261, 378, 506, 91, 12}, at::kLong).unsqueeze(0);
  at::NoGradGuard no_grad;
  // Exact: the same float32 weights through the same decoder in one process.
  EXPECT_TRUE(at::equal(back->forward(ids), hf->forward(ids)));

  // Q8_0: stories260K's down_proj rows (172) do not divide into blocks of 32: F16 there, Q8_0 elsewhere.
  GgufExportOptions q8;
  q8.type = GgmlType::Q8_0;
  const GgufExportReport rq = export_gguf(hf, test::stories_dir(), dir / "q8.gguf", q8);
  EXPECT_EQ(rq.fallback_tensors, 5);
  const auto gq = GgufFile::open(dir / "q8.gguf");
  EXPECT_EQ(gq->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::F16);
  EXPECT_EQ(gq->find_tensor("blk.0.ffn_up.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ(gq->find_tensor("blk.0.attn_norm.weight")->type, GgmlType::F32);
  EXPECT_EQ(gq->at("general.file_type").value, 7);
  CausalLM q = load_gguf_model(dir / "q8.gguf");
  const at::Tensor a = hf->forward(ids), b = q->forward(ids);
  EXPECT_FALSE(at::equal(a, b));
  EXPECT_LT((a - b).abs().max().item<double>(), 0.05 * a.abs().max().item<double>());
  EXPECT_GE(a.argmax(-1).eq(b.argmax(-1)).sum().item<int64_t>(), ids.size(1) - 1);
}

TEST(GgufModel, ExportCliWritesAFileAndRefusesToOverwrite) {
  const fs::path dir = test::temp_dir("gguf_cli");
  const fs::path out = dir / "m.gguf";
  const auto r = test::run_cli(fmt::format("export --model {} --format gguf --quant q4_0 --output {}",
                                           test::stories_dir().string(), out.string()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Q4_0; 5 with rows that do not divide into blocks as F16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the output projection as Q8_0"), std::string::npos) << r.out;
  {
    // Tied embeddings are the output projection: kept at Q8_0 as llama.cpp keeps the output wider.
    const auto g = GgufFile::open(out);
    EXPECT_EQ(g->find_tensor("token_embd.weight")->type, GgmlType::Q8_0);
    EXPECT_EQ(g->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q4_0);
  }
  EXPECT_EQ(GgufFile::open(out)->at("general.file_type").value, 2);
  const auto again = test::run_cli(fmt::format("export --model {} --format gguf --output {}",
                                               test::stories_dir().string(), out.string()));
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("--overwrite"), std::string::npos) << again.out;
  EXPECT_EQ(GgufFile::open(out)->at("general.file_type").value, 2);  // untouched
}

TEST(GgufModel, InferRunsAGgufFileLikeTheCheckpointItCameFrom) {
  const fs::path dir = test::temp_dir("gguf_infer");
  CausalLM hf = load_causal_lm(test::stories_dir());
  export_gguf(hf, test::stories_dir(), dir / "s.gguf", {});
  const std::string args = "--threads 1 infer --prompt \"Lily and Tom\" --temperature 0 --max-new-tokens 24";
  // stdout only: the generated text (stderr carries timings).
  const auto generate = [&](const std::string& model_args, const fs::path& out) {
    const int status = std::system(fmt::format("{} {} {} >{} 2>/dev/null", SWIFTCPP_BINARY, test::with_test_threads(args), model_args,
                                               out.string()).c_str());
    EXPECT_EQ(status, 0) << model_args;
    std::ifstream in(out);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string a = generate("--model " + test::stories_dir().string(), dir / "hf.txt");
  const std::string b = generate(fmt::format("--model {} --tokenizer {}", (dir / "s.gguf").string(),
                                             test::stories_dir().string()), dir / "gguf.txt");
  EXPECT_GT(a.size(), 20u);
  EXPECT_EQ(a, b);
  // eval scores the GGUF exactly as the checkpoint (perplexity of a text, same token log-likelihoods).
  const fs::path text = dir / "text.txt";
  std::ofstream(text) << read_text_file(test::source_dir() / "tests/data/sft/alpaca_en_demo.json").substr(0, 3000);
  const std::string eval = "--threads 1 eval --tasks perplexity=" + text.string() + " --max-length 128";
  const auto e1 = test::run_cli(fmt::format("{} --model {} --output-dir {}", eval, test::stories_dir().string(),
                                            (dir / "e-hf").string()));
  const auto e2 = test::run_cli(fmt::format("{} --model {} --tokenizer {} --output-dir {}", eval,
                                            (dir / "s.gguf").string(), test::stories_dir().string(),
                                            (dir / "e-gguf").string()));
  ASSERT_EQ(e1.code, 0) << e1.out;
  ASSERT_EQ(e2.code, 0) << e2.out;
  EXPECT_EQ(load_json_file(dir / "e-hf/results.json").at("results"), load_json_file(dir / "e-gguf/results.json").at("results"));
  const auto no_tokenizer = test::run_cli(fmt::format("{} --model {}", args, (dir / "s.gguf").string()));
  EXPECT_EQ(no_tokenizer.code, 2) << no_tokenizer.out;
  EXPECT_NE(no_tokenizer.out.find("--tokenizer DIR"), std::string::npos) << no_tokenizer.out;
}

// A byte-level BPE vocabulary is written as llama.cpp's own converter writes GPT-2's: the same tokens, types,
// merges, pre-tokenizer name and special ids as llama.cpp's ggml-vocab-gpt-2.gguf.
TEST(GgufModel, BpeVocabularyIsWrittenAsLlamaCppWritesGpt2s) {
  const fs::path gpt2 = test::assets() / "tokenizers/gpt2";
  const fs::path reference = test::assets() / "tokenizers/llamacpp-vectors/ggml-vocab-gpt-2.gguf";
  SWIFTCPP_REQUIRE_SHARED(gpt2);
  SWIFTCPP_REQUIRE_SHARED(reference);
  const fs::path dir = test::temp_dir("gguf_bpe");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    fs::copy_file(gpt2 / f, dir / f, fs::copy_options::overwrite_existing);
  }
  CausalLM model = test::tiny_llama(50257, 1, at::kFloat);
  const GgufExportReport r = export_gguf(model, dir, dir / "bpe.gguf", {});
  EXPECT_EQ(r.tokenizer_model, "gpt2");
  EXPECT_EQ(r.pre_tokenizer, "gpt-2");
  EXPECT_TRUE(r.pre_tokenizer_known);
  const auto ours = GgufFile::open(dir / "bpe.gguf");
  const auto theirs = GgufFile::open(reference);
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    EXPECT_EQ(ours->at(key).value, theirs->at(key).value) << key;
    EXPECT_EQ(ours->at(key).type, theirs->at(key).type) << key;
  }
  // Read back through our own loader with the tokenizer folder: the vocabulary check passes.
  const ModelWithTokenizer loaded = load_model_with_tokenizer((dir / "bpe.gguf").string(), dir.string(), {});
  EXPECT_EQ(loaded.tokenizer->vocab_size(), 50257);
  // A split regex llama.cpp has no name for is written as "default" and reported.
  Json changed = load_json_file(gpt2 / "tokenizer.json");
  changed["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  const fs::path odd = test::temp_dir("gguf_bpe_odd");
  write_file_atomic(odd / "tokenizer.json", changed.dump());
  const GgufExportReport r2 = export_gguf(model, odd, odd / "odd.gguf", {});
  EXPECT_FALSE(r2.pre_tokenizer_known);
  EXPECT_EQ(GgufFile::open(odd / "odd.gguf")->at("tokenizer.ggml.pre").value, "default");
  // No tokenizer at all: a ConfigError naming the folder.
  const fs::path none = test::temp_dir("gguf_bpe_none");
  test::expect_error<ConfigError>([&] { export_gguf(model, none, none / "x.gguf", {}); },
                                  {none.string(), "neither tokenizer.model"});
}

// A tokenizer.json whose ids are negative, of the wrong type or beyond the model's vocabulary, or whose merges and
// added tokens have the wrong shape, is a clean error naming the file: a negative id used to index the vocabulary
// table as a huge unsigned number, and wrong types escaped as nlohmann's exceptions.
TEST(GgufModel, MalformedBpeTokenizerJsonIsRefusedNamingTheFile) {
  CausalLM model = test::tiny_llama(8, 1, at::kFloat);
  const Json good = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", Json::array({"a b"})}}}};
  const auto refused = [&](const std::string& name, Json tokenizer, const std::vector<std::string>& needles,
                           bool config_error = false) {
    SCOPED_TRACE(name);
    const fs::path dir = test::temp_dir("gguf_bad_bpe_" + name);
    write_file_atomic(dir / "tokenizer.json", tokenizer.dump());
    std::vector<std::string> all = needles;
    all.push_back((dir / "tokenizer.json").string());
    if (config_error) {
      test::expect_error<ConfigError>([&] { export_gguf(model, dir, dir / "x.gguf", {}); }, all);
    } else {
      test::expect_error<FormatError>([&] { export_gguf(model, dir, dir / "x.gguf", {}); }, all);
    }
    EXPECT_FALSE(fs::exists(dir / "x.gguf"));
  };
  Json negative = good;
  negative["model"]["vocab"]["c"] = -1;
  refused("negative", negative, {"'c'", "non-negative integer"});
  Json text_id = good;
  text_id["model"]["vocab"]["c"] = "2";
  refused("text_id", text_id, {"'c'", "the string"});
  Json beyond = good;
  beyond["model"]["vocab"]["c"] = 8;
  refused("beyond", beyond, {"id 8", "vocab_size 8"}, true);
  Json added = good;
  added["added_tokens"] = Json::array({{{"id", -5}, {"content", "<x>"}}});
  refused("added", added, {"'<x>'", "non-negative integer"});
  Json merge = good;
  merge["model"]["merges"] = Json::array({Json::array({"a", 1})});
  refused("merge", merge, {"a merge must be"});
  Json pre = good;
  pre["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", Json::array({1})}};
  refused("pre", pre, {"pre_tokenizer"});
}

// A real llama.cpp (the pinned npm package scripts/setup_llama_interop.sh installs, which setup.sh runs) loads our
// GGUFs: in f32 its next-token log-probabilities equal ours to 1e-4 and its greedy continuation is ours; q8_0 and
// q4_0 files load and generate.
TEST(GgufInterop, LlamaCppRunsOurGgufsWithOurLogits) {
  const fs::path interop = test::source_dir() / "third_party/llama-interop";
  if (!fs::exists(interop / "node_modules/node-llama-cpp/package.json")) {
    GTEST_SKIP() << "skipped: no llama.cpp in " << interop.string() << " (scripts/setup_llama_interop.sh found no "
                 << "node/npm or could not reach the npm registry)";
  }
  const fs::path dir = test::temp_dir("gguf_interop");
  CausalLM hf = load_causal_lm(test::stories_dir());
  const std::vector<int64_t> ids = {1, 403, 407, 261, 378, 506, 91, 12};
  const int64_t new_tokens = 16;
  // Our greedy continuation and log-probabilities.
  at::NoGradGuard no_grad;
  const at::Tensor ours = at::log_softmax(hf->forward(at::tensor(ids, at::kLong).unsqueeze(0))[0], -1);  // [T, V]
  std::vector<int64_t> sequence = ids, greedy;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const int64_t next = hf->forward(at::tensor(sequence, at::kLong).unsqueeze(0))[0][-1].argmax().item<int64_t>();
    greedy.push_back(next);
    sequence.push_back(next);
  }
  const fs::path script = interop / fmt::format(".swiftcpp-eval-{}.mjs", getpid());  // ESM resolves from here
  fs::copy_file(test::source_dir() / "tests/interop/llama_cpp_eval.mjs", script, fs::copy_options::overwrite_existing);
  const auto run = [&](const fs::path& gguf) {
    const fs::path out = dir / (gguf.stem().string() + ".json");
    const int status = std::system(fmt::format("cd {} && node {} {} {} {} >{} 2>{}.err", interop.string(),
                                               script.filename().string(), gguf.string(), fmt::join(ids, ","),
                                               new_tokens, out.string(), out.string()).c_str());
    EXPECT_EQ(status, 0) << "llama.cpp failed on " << gguf << "; see " << out << ".err";
    return status == 0 ? load_json_file(out) : Json();
  };
  for (const std::string quant : {"f32", "q8_0", "q4_0"}) {
    SCOPED_TRACE(quant);
    GgufExportOptions options;
    options.type = parse_ggml_type(quant);
    const fs::path gguf = dir / (quant + ".gguf");
    export_gguf(hf, test::stories_dir(), gguf, options);
    const Json r = run(gguf);
    ASSERT_TRUE(r.is_object());
    ASSERT_EQ(r["vocab"], 512);
    ASSERT_EQ(r["probabilities"].size(), ids.size());
    ASSERT_EQ(r["generated"].size(), static_cast<size_t>(new_tokens));
    if (quant != "f32") continue;
    // node-llama-cpp reports probabilities after its default top-k / top-p filtering, renormalised over the tokens
    // it keeps, so compare logit differences to each row's top token (log p_v - log p_top = z_v - z_top).
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const Json& row = r["probabilities"][t];
      const int64_t top = ours[static_cast<int64_t>(t)].argmax().item<int64_t>();
      const double top_p = row[top].get<double>();
      ASSERT_GT(top_p, 0) << "llama.cpp's top token differs at position " << t;
      for (int64_t v = 0; v < 512; ++v) {
        const double p = row[v].get<double>();
        if (p < 1e-6) continue;  // filtered out, or too small to carry precision in log space
        const double theirs = std::log(p) - std::log(top_p);
        const double mine = ours[static_cast<int64_t>(t)][v].item<double>() - ours[static_cast<int64_t>(t)][top].item<double>();
        worst = std::max(worst, std::abs(theirs - mine));
      }
    }
    EXPECT_LE(worst, 1e-4) << "largest difference of logit gaps to the top token";
    std::cerr << "llama.cpp vs swiftcpp, f32: largest logit-gap difference " << worst << "\n";
    EXPECT_EQ(r["generated"].get<std::vector<int64_t>>(), greedy);
  }
  fs::remove(script);
}

// A GGUF run with another model's tokenizer is refused, naming the first differing id.
TEST(GgufModel, AnotherModelsTokenizerIsRefused) {
  const fs::path llama2 = test::shared_dir() / "assets/tokenizers/llama2";
  SWIFTCPP_REQUIRE_SHARED(llama2);
  const fs::path dir = test::temp_dir("gguf_vocab");
  CausalLM hf = load_causal_lm(test::stories_dir());
  export_gguf(hf, test::stories_dir(), dir / "s.gguf", {});
  const auto g = GgufFile::open(dir / "s.gguf");
  check_gguf_vocabulary(*g, *load_tokenizer(test::stories_dir()), "stories260K");
  test::expect_error<ConfigError>([&] { check_gguf_vocabulary(*g, *load_tokenizer(llama2), "llama2"); },
                                  {"llama2", "s.gguf", "not the tokenizer this GGUF was made with"});
}

// llama.cpp tokenizes with the BPE vocabulary we exported exactly as with its own GPT-2 file: its test vectors'
// expected ids.
TEST(GgufInterop, LlamaCppTokenizesWithOurBpeVocabulary) {
  const fs::path interop = test::source_dir() / "third_party/llama-interop";
  if (!fs::exists(interop / "node_modules/node-llama-cpp/package.json")) {
    GTEST_SKIP() << "skipped: no llama.cpp in " << interop.string() << " (scripts/setup_llama_interop.sh found no "
                 << "node/npm or could not reach the npm registry)";
  }
  const fs::path gpt2 = test::assets() / "tokenizers/gpt2";
  const fs::path vectors = test::assets() / "tokenizers/llamacpp-vectors";
  SWIFTCPP_REQUIRE_SHARED(gpt2);
  SWIFTCPP_REQUIRE_SHARED(vectors);
  const fs::path dir = test::temp_dir("gguf_bpe_interop");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(gpt2 / f, dir / f, fs::copy_options::overwrite_existing);
  CausalLM model = test::tiny_llama(50257, 1, at::kFloat);
  export_gguf(model, dir, dir / "bpe.gguf", {});
  const fs::path script = interop / fmt::format(".swiftcpp-tokenize-{}.mjs", getpid());
  fs::copy_file(test::source_dir() / "tests/interop/llama_cpp_tokenize.mjs", script, fs::copy_options::overwrite_existing);
  const fs::path out = dir / "ids.json";
  const int status = std::system(fmt::format("cd {} && node {} {} {} >{} 2>{}.err", interop.string(),
                                             script.filename().string(), (dir / "bpe.gguf").string(),
                                             (vectors / "ggml-vocab-gpt-2.gguf.inp").string(), out.string(),
                                             out.string()).c_str());
  fs::remove(script);
  ASSERT_EQ(status, 0) << "llama.cpp failed; see " << out << ".err";
  const Json ids = Json::parse(read_text_file(out));
  const auto expected = test::read_llamacpp_vectors(vectors / "ggml-vocab-gpt-2.gguf.inp", vectors / "ggml-vocab-gpt-2.gguf.out");
  ASSERT_EQ(ids.size(), expected.ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ids[i].get<std::vector<int>>(), expected.ids[i]) << "text " << i << ": " << expected.texts[i];
  }
}

}  // namespace
}  // namespace swiftcpp
