// The continuous-batching engine: per-row KV cache, sequences joining and leaving a running batch, cancellation,
// penalties, and the OpenAI request decoding the server uses.
#include <gtest/gtest.h>

#include "core/base64.h"
#include <ATen/ATen.h>

#include "infer/engine.h"
#include "infer/generate.h"
#include "peft/adapter_bank.h"
#include "peft/lora.h"
#include "serve/media.h"
#include "serve/openai.h"
#include "tests/tensor_util.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

using test::stories_dir;

struct Stories {
  CausalLM model = load_causal_lm(stories_dir(), {test::test_device(), at::kFloat});
  std::shared_ptr<const TextTokenizer> tokenizer = load_tokenizer(stories_dir());
};

Stories& stories() {
  static Stories s;
  return s;
}

SequenceRequest greedy_request(const std::vector<int64_t>& prompt, int64_t n) {
  SequenceRequest r;
  r.prompt = prompt;
  r.config.max_new_tokens = n;
  r.config.sampling.temperature = 0;
  return r;
}

// Runs the engine until it is idle, collecting each sequence's ids and text.
struct Collected {
  std::map<uint64_t, std::vector<int64_t>> ids;
  std::map<uint64_t, std::string> text, finish;
};
void drain(Engine& engine, Collected& out, int64_t max_steps = 100000) {
  for (int64_t i = 0; i < max_steps && engine.has_work(); ++i) {
    for (auto& u : engine.step()) {
      out.ids[u.id].insert(out.ids[u.id].end(), u.new_ids.begin(), u.new_ids.end());
      out.text[u.id] += u.text;
      if (!u.finish_reason.empty()) out.finish[u.id] = u.finish_reason;
    }
  }
}

// Rows written out of order and at different lengths attend to their own keys only: the per-row forward's logits
// equal each sequence's own shared-length forward.
TEST(Engine, PerRowCacheEqualsEachSequenceAlone) {
  CausalLM model = stories().model;
  c10::InferenceMode guard;
  const std::vector<std::vector<int64_t>> seqs = {{1, 403, 407, 261, 378, 291}, {1, 100, 511}, {1, 259, 450, 300, 13}};
  nn::KVCache cache = model->make_cache(4, 16);
  // Prefill each sequence into rows 3, 0, 2 (out of order), one at a time.
  const std::vector<int64_t> rows = {3, 0, 2};
  for (size_t i = 0; i < seqs.size(); ++i) {
    cache.rows = {rows[i]};
    cache.lengths = {0};
    ForwardOptions o;
    o.cache = &cache;
    model->forward(at::tensor(seqs[i], at::kLong).view({1, -1}).to(test::test_device()), o);
  }
  // One batched decode step of token 42 for all three.
  cache.rows = rows;
  cache.lengths = {6, 3, 5};
  ForwardOptions o;
  o.cache = &cache;
  const at::Tensor batched = model->forward(at::full({3, 1}, 42, at::kLong).to(test::test_device()), o);  // [3, 1, V]
  EXPECT_EQ(cache.lengths, (std::vector<int64_t>{7, 4, 6}));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int64_t> ids = seqs[i];
    ids.push_back(42);
    const at::Tensor full = model->forward(at::tensor(ids, at::kLong).view({1, -1}).to(test::test_device()));
    // float32: the batched step multiplies other shapes than the full forward and sums in another order.
    EXPECT_LE((batched[i][0] - full[0][-1]).abs().max().item<double>(), 5e-5) << i;
  }
}

// A sequence that joins a running batch, and one that leaves it early, do not change the others' greedy text.
TEST(Engine, SequencesJoiningAndLeavingKeepTheirText) {
  Generator gen(stories().model, stories().tokenizer);
  const std::vector<int64_t> a = gen.encode_prompt("Once upon a time"), b = gen.encode_prompt("The cat"),
                             c = gen.encode_prompt("Lily and Tom went to the big park");
  GenerationConfig g;
  g.sampling.temperature = 0;
  g.max_new_tokens = 50;
  const auto alone_a = gen.generate({a}, g)[0], alone_b = gen.generate({b}, g)[0];
  g.max_new_tokens = 7;
  const auto alone_c = gen.generate({c}, g)[0];

  EngineOptions options;
  options.max_sequences = 2;  // c waits for a row
  options.max_model_len = 128;
  options.prefill_chunk = 4;  // prompts take several steps
  Engine engine(stories().model, stories().tokenizer, options);
  Collected out;
  const uint64_t ia = engine.add(greedy_request(a, 50));
  for (int i = 0; i < 5; ++i) {
    for (auto& u : engine.step()) {
      out.ids[u.id].insert(out.ids[u.id].end(), u.new_ids.begin(), u.new_ids.end());
      out.text[u.id] += u.text;
    }
  }
  const uint64_t ic = engine.add(greedy_request(c, 7));  // leaves early, freeing its row for b
  const uint64_t ib = engine.add(greedy_request(b, 50));
  EXPECT_EQ(engine.waiting(), 2);
  drain(engine, out);
  EXPECT_EQ(out.ids[ia], alone_a.new_ids);
  EXPECT_EQ(out.text[ia], alone_a.text);
  EXPECT_EQ(out.ids[ib], alone_b.new_ids);
  EXPECT_EQ(out.text[ib], alone_b.text);
  EXPECT_EQ(out.ids[ic], alone_c.new_ids);
  EXPECT_EQ(out.finish[ic], "length");
  EXPECT_EQ(engine.running(), 0);
}

TEST(Engine, CancelFreesTheRowForAWaitingSequence) {
  EngineOptions options;
  options.max_sequences = 1;
  options.max_model_len = 256;
  Engine engine(stories().model, stories().tokenizer, options);
  const uint64_t first = engine.add(greedy_request({1, 403}, 200));
  const uint64_t second = engine.add(greedy_request({1, 100}, 3));
  engine.step();
  engine.step();
  EXPECT_EQ(engine.running(), 1);
  EXPECT_EQ(engine.waiting(), 1);
  engine.cancel(first);
  Collected out;
  drain(engine, out);
  EXPECT_EQ(out.finish[first], "cancelled");
  EXPECT_LE(out.ids[first].size(), 3u);
  EXPECT_EQ(out.finish[second], "length");
  EXPECT_EQ(out.ids[second].size(), 3u);
}

TEST(Engine, RefusesBadSequences) {
  EngineOptions options;
  options.max_model_len = 16;
  Engine engine(stories().model, stories().tokenizer, options);
  EXPECT_THROW(engine.add(greedy_request({}, 4)), ConfigError);
  EXPECT_THROW(engine.add(greedy_request(std::vector<int64_t>(17, 5), 4)), ConfigError);
  EXPECT_THROW(engine.add(greedy_request({1, 999999}, 4)), ConfigError);
  // -1 is no image token for a text model: it was let through and failed inside the embedding lookup.
  EXPECT_THROW(engine.add(greedy_request({1, -1}, 4)), ConfigError);
  SequenceRequest r = greedy_request({1, 5}, 4);
  r.top_logprobs = 21;
  EXPECT_THROW(engine.add(r), ConfigError);
  r = greedy_request({1, 5}, 4);
  r.config.sampling.presence_penalty = 2.5;
  EXPECT_THROW(engine.add(r), ConfigError);
  r = greedy_request({1, 5}, 4);
  r.config.stop_strings = {""};
  EXPECT_THROW(engine.add(r), ConfigError);
  EXPECT_FALSE(engine.has_work());
  // A prompt that fills max_model_len ends at once with nothing generated.
  Collected out;
  const uint64_t full = engine.add(greedy_request(std::vector<int64_t>(16, 5), 4));
  drain(engine, out);
  EXPECT_EQ(out.finish[full], "length");
  EXPECT_TRUE(out.ids[full].empty());
}

// OpenAI's penalties: logit - frequency * count - presence * (count > 0), over generated tokens.
TEST(Sampling, PresenceAndFrequencyPenalties) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  Sampler sampler(p);
  const at::Tensor logits = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 4});
  const at::Tensor counts = at::tensor({0.0f, 1.0f, 3.0f, 0.0f}).view({1, 4});
  const at::Tensor out = sampler.process(logits.clone(), {}, counts);
  const at::Tensor expected = at::tensor({1.0f, 2.0f - 0.25f - 0.5f, 3.0f - 0.75f - 0.5f, 4.0f}).view({1, 4});
  EXPECT_TRUE(at::allclose(out, expected));
  EXPECT_FALSE(p.plain_greedy());
}

// Logprobs are of the model's own distribution: the chosen greedy token's equals the row maximum of log_softmax.
TEST(Engine, LogprobsAreTheModelsLogSoftmax) {
  Engine engine(stories().model, stories().tokenizer, {});
  SequenceRequest r = greedy_request({1, 403, 407, 261, 378}, 3);
  r.top_logprobs = 5;
  engine.add(r);
  std::vector<TokenLogprob> got;
  while (engine.has_work()) {
    for (auto& u : engine.step()) got.insert(got.end(), u.logprobs.begin(), u.logprobs.end());
  }
  ASSERT_EQ(got.size(), 3u);
  c10::InferenceMode guard;
  const at::Tensor full = stories().model->forward(at::tensor(std::vector<int64_t>{1, 403, 407, 261, 378}, at::kLong)
                                                        .view({1, -1}).to(test::test_device()));
  const at::Tensor lp = full[0][-1].to(at::kCPU, at::kFloat).log_softmax(-1);
  EXPECT_NEAR(got[0].logprob, lp.max().item<float>(), 1e-5);
  ASSERT_EQ(got[0].top.size(), 5u);
  EXPECT_EQ(got[0].top[0].first, got[0].id);
  for (size_t i = 1; i < 5; ++i) EXPECT_LE(got[0].top[i].second, got[0].top[i - 1].second);
}

// Writes a PEFT adapter for stories260K with random A and B (so it changes the model) targeting `targets`.
fs::path random_adapter(const std::string& name, const std::vector<std::string>& targets, uint64_t seed) {
  CausalLM model = load_causal_lm(stories_dir(), {at::kCPU, at::kFloat});
  LoraConfig config;
  config.r = 4;
  config.lora_alpha = 8;
  config.target_modules = targets;
  inject_lora(model, config, seed);
  at::manual_seed(seed);
  for (const auto& m : model->modules(false)) {
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(m.get()); linear && linear->lora) {
      at::NoGradGuard no_grad;
      linear->lora->lora_B.normal_(0, 0.5);
    }
  }
  const fs::path dir = test::temp_dir(name);
  save_adapter(dir, model, config);
  return dir;
}

// Sequences of two adapters and of the base model decode in one batch, each as it does alone with its adapter
// attached.
TEST(Engine, AdaptersChosenPerSequenceShareABatch) {
  const fs::path one = random_adapter("engine_adapter_one", {"q_proj", "v_proj"}, 3);
  const fs::path two = random_adapter("engine_adapter_two", {"all-linear"}, 4);
  const std::vector<int64_t> prompt = {1, 403, 407, 261, 378};
  GenerationConfig g;
  g.sampling.temperature = 0;
  g.max_new_tokens = 30;
  std::vector<GenerationResult> alone;
  for (const fs::path& dir : {fs::path(), one, two}) {
    CausalLM model = load_causal_lm(stories_dir(), {test::test_device(), at::kFloat});
    if (!dir.empty()) load_adapter(model, dir);
    model->eval();
    alone.push_back(Generator(model, stories().tokenizer).generate({prompt}, g)[0]);
  }
  EXPECT_NE(alone[1].new_ids, alone[0].new_ids);
  EXPECT_NE(alone[2].new_ids, alone[0].new_ids);

  CausalLM model = load_causal_lm(stories_dir(), {test::test_device(), at::kFloat});
  auto bank = std::make_shared<AdapterBank>();
  EXPECT_EQ(bank->add(model, one), 1);
  EXPECT_EQ(bank->add(model, two), 2);
  model->eval();
  EngineOptions options;
  options.adapters = bank;
  options.max_model_len = 64;
  Engine engine(model, stories().tokenizer, options);
  std::vector<uint64_t> ids;
  for (int64_t a : {2, 0, 1, 2}) {
    SequenceRequest r = greedy_request(prompt, 30);
    r.adapter = a;
    ids.push_back(engine.add(r));
  }
  SequenceRequest bad = greedy_request(prompt, 3);
  bad.adapter = 3;
  EXPECT_THROW(engine.add(bad), ConfigError);
  Collected out;
  drain(engine, out);
  EXPECT_EQ(out.ids[ids[0]], alone[2].new_ids);
  EXPECT_EQ(out.ids[ids[1]], alone[0].new_ids);
  EXPECT_EQ(out.ids[ids[2]], alone[1].new_ids);
  EXPECT_EQ(out.ids[ids[3]], alone[2].new_ids);
  EXPECT_EQ(out.text[ids[2]], alone[1].text);
}

int expect_refused(const std::string& body, bool chat, const std::string& param) {
  try {
    serve::parse_completion_request(body, chat, SamplingParams{});
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.what();
    return e.status;
  }
  ADD_FAILURE() << "accepted: " << body;
  return 0;
}

TEST(OpenAiRequest, DecodesFieldsAndRefusesBadOnesNamingThem) {
  const auto r = serve::parse_completion_request(
      R"({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
          "max_completion_tokens": 7, "temperature": 0.5, "top_k": -1, "stop": "x", "n": 2, "seed": 3,
          "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 4,
          "frequency_penalty": 1, "unknown_field": {"a": 1}})",
      true, SamplingParams{});
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.5);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.seeded);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(r.sampling.frequency_penalty, 1.0);

  expect_refused(R"({"messages": [{"role": "user", "content": "a"}], "temperature": "hot"})", true, "temperature");
  expect_refused(R"({"messages": [{"role": "user", "content": "a"}], "n": 0})", true, "n");
  expect_refused(R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 0})", true, "max_tokens");
  expect_refused(R"({"messages": [{"role": "robot", "content": "a"}]})", true, "messages[0].role");
  expect_refused(R"({"messages": []})", true, "messages");
  expect_refused(R"({})", true, "messages");
  expect_refused(R"({"prompt": []})", false, "prompt");
  expect_refused(R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", true, "top_logprobs");
  expect_refused(R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]})", true, "tools");
  expect_refused("{\"prompt\": \"\xC3\x28\"}", false, "");
  expect_refused(R"({"prompt": "a")", false, "");
  EXPECT_TRUE(serve::valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(serve::valid_utf8("\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(serve::valid_utf8("\xC0\xAF"));      // overlong
}

// Image parts: each becomes the placeholder at its place and an entry naming its field; other part types, parts
// without a url and images outside user messages are 400s naming the part.
TEST(OpenAiRequest, ImagePartsBecomePlaceholdersNamingTheirFields) {
  const auto r = serve::parse_completion_request(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "A: "},
                                                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                                    {"type": "text", "text": " B: "},
                                                    {"type": "image_url", "image_url": "file:///x.png"}]}]})",
      true, SamplingParams{});
  EXPECT_EQ(r.messages[1].content, "A: <image> B: <image>");
  ASSERT_EQ(r.images.size(), 2u);
  EXPECT_EQ(r.images[0].url, "data:image/png;base64,AAAA");
  EXPECT_EQ(r.images[0].param, "messages[1].content[1]");
  EXPECT_EQ(r.images[1].param, "messages[1].content[3]");
  const auto refused = [](const std::string& body, const std::string& param, const std::string& words) {
    try {
      serve::parse_completion_request(body, true, SamplingParams{});
      ADD_FAILURE() << "accepted: " << body;
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, param) << body;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
          "messages[0].content[0]", "url");
  refused(R"({"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
          "messages[0].content[0]", "user messages");
  refused(R"({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})",
          "messages[0].content", "input_audio");
}

// The sources of an image part: data URLs (base64 checked, size limited), files only under the allowed folder,
// remote URLs only when allowed; the image's header is read and checked, its origin is the part's field.
TEST(ServeMedia, DataUrlsAndAllowedFilesOpenOthersAreRefusedNamingThePart) {
  EXPECT_EQ(decode_base64("aGVsbG8="), std::optional<std::string>("hello"));
  EXPECT_EQ(decode_base64("aGVsbG8"), std::optional<std::string>("hello"));
  EXPECT_EQ(decode_base64(""), std::optional<std::string>(""));
  EXPECT_FALSE(decode_base64("aGVs bG8=").has_value());
  EXPECT_FALSE(decode_base64("a").has_value());
  const fs::path images = test::assets() / "images";
  SWIFTCPP_REQUIRE_SHARED(images / "coffee.jpg");
  const std::string bytes = read_text_file(images / "coffee.jpg");
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string b64;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    b64 += kAlphabet[(v >> 18) & 63];
    b64 += kAlphabet[(v >> 12) & 63];
    b64 += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    b64 += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  serve::MediaOptions options;
  const vision::EncodedImage data = serve::fetch_image({"data:image/jpeg;base64," + b64, "messages[0].content[0]"}, options);
  EXPECT_EQ(data.bytes, bytes);
  EXPECT_EQ(data.width, 600);
  EXPECT_EQ(data.height, 400);
  EXPECT_EQ(data.origin, "messages[0].content[0]");
  const auto refused = [&](const std::string& url, const std::string& words) {
    try {
      serve::fetch_images({{url, "messages[2].content[1]"}}, options);
      ADD_FAILURE() << "accepted: " << url.substr(0, 80);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "messages[2].content[1]");
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused("data:image/jpeg;base64,@@@@", "base64");
  refused("data:image/jpeg," + b64, "base64 data URLs");
  refused("data:text/plain;base64," + b64, "not an image");
  refused("data:image/gif;base64,R0lGODlhAQABAAAAACw=", "GIF");
  const std::string url = "file://" + (images / "camera.png").string();
  refused(url, "--allowed-local-media-path");
  refused("http://127.0.0.1:9/x.png", "--allow-remote-media");
  refused("ftp://example.com/x.png", "not a data:");
  options.max_image_bytes = 1000;
  refused("data:image/jpeg;base64," + b64, "more than the 1000");
  options.max_image_bytes = int64_t{20} << 20;
  options.max_pixels = 600 * 400 - 1;
  refused("data:image/jpeg;base64," + b64, "limit");
  options.max_pixels = vision::kMaxImagePixels;
  options.allowed_local_path = images;
  EXPECT_EQ(serve::fetch_image({url, "p"}, options).width, 512);
  refused("file:///etc/passwd", "outside the allowed media folder");
  refused("file://" + (images / ".." / "images" / ".." / "README.md").string(), "outside");
  refused("file://" + (images / "absent.png").string(), "cannot be read");
  options.max_images = 1;
  try {
    serve::fetch_images({{url, "messages[0].content[0]"}, {url, "messages[0].content[1]"}}, options);
    ADD_FAILURE() << "two images accepted with max_images 1";
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.param, "messages[0].content[1]");
    EXPECT_NE(std::string(e.what()).find("2 images, more than the 1 allowed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace swiftcpp
