// Dataset rows in the ms-swift forms, bad rows, encoding with labels, and the preprocessing pipeline.
#include <gtest/gtest.h>

#include "data/dataset.h"
#include "data/encode.h"
#include "data/pipeline.h"
#include "data/preference_data.h"
#include "data/prepare.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::stories_dir;
using test::temp_dir;

Json first_row(const fs::path& file) {
  Json row;
  for_each_row({file, 1}, [&](Json&& r, const std::string&) { row = std::move(r); }, [](auto&, auto&, auto&) {});
  return row;
}

std::string reason_of(const Json& row) {
  try {
    normalise_row(row, "f.jsonl:7");
  } catch (const BadRowError& e) {
    EXPECT_NE(std::string(e.what()).find("f.jsonl:7"), std::string::npos) << e.what();
    return e.reason();
  }
  return "";
}

TEST(Dataset, EachFormNormalisesToMessages) {
  Conversation c = normalise_row(Json::parse(R"({"instruction": "Add", "input": "1 and 2", "output": "3"})"), "w");
  EXPECT_EQ(c.format, RowFormat::kAlpaca);
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[0].content, "Add\n1 and 2");
  EXPECT_EQ(c.messages[1].content, "3");

  c = normalise_row(Json::parse(R"({"query": "q2", "response": "a2", "history": [["q1", "a1"]], "system": "s"})"), "w");
  EXPECT_EQ(c.format, RowFormat::kQueryResponse);
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[1].content, "q1");
  EXPECT_EQ(c.messages[4].content, "a2");

  c = normalise_row(Json::parse(R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})"),
                    "w", std::string("override"));
  EXPECT_EQ(c.format, RowFormat::kShareGpt);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "override");

  c = normalise_row(Json::parse(R"({"text": "plain"})"), "w");
  EXPECT_EQ(c.format, RowFormat::kText);
  EXPECT_EQ(c.text, "plain");
}

TEST(Dataset, RealFilesOfEveryForm) {
  const fs::path sft = assets() / "data/sft";
  SWIFTCPP_REQUIRE_SHARED(sft);
  Conversation c = normalise_row(first_row(sft / "alpaca_en_demo.json"), "w");
  EXPECT_EQ(c.format, RowFormat::kAlpaca);
  c = normalise_row(first_row(sft / "sharegpt_dummy_conversation.json"), "w");
  EXPECT_EQ(c.format, RowFormat::kShareGpt);
  EXPECT_EQ(c.messages[0].content, "Who are you?");
  // messages with content parts [{"type": "text", "value": ...}] and loss_weight
  c = normalise_row(first_row(sft / "v1_sft_demo.jsonl"), "w");
  EXPECT_EQ(c.messages[0].content, "hi");
  EXPECT_EQ(c.messages[0].loss, std::nullopt);  // loss flags only matter on assistant turns
  EXPECT_EQ(c.messages[1].loss, std::optional<bool>(true));
  // Tool-call data is rejected with a clear reason, not mangled.
  EXPECT_EQ(reason_of(first_row(sft / "glaive_toolcall_en_demo.json")), "tool-call rows are not supported yet");
}

TEST(Dataset, BadRowsNameTheProblem) {
  EXPECT_EQ(reason_of(Json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})")), "no assistant turn");
  EXPECT_EQ(reason_of(Json::parse(R"({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]})")),
            "wrong role order");
  EXPECT_EQ(reason_of(Json::parse(R"({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]})")),
            "non-string content");
  EXPECT_EQ(reason_of(Json::parse(R"({"prompt": "x", "completion": "y"})")), "unknown format");
  EXPECT_EQ(reason_of(Json::parse(R"({"instruction": "x"})")), "no assistant turn");
  EXPECT_EQ(reason_of(Json::parse(R"([1, 2])")), "unknown format");
}

// ms-swift columns not trained from yet (videos, audios, grounding objects) are refused by name in every row form
// and in preference rows, not trained as text; null or empty columns pass.
TEST(Dataset, VideoAudioAndGroundingColumnsAreRefusedByName) {
  const std::string chat = R"("messages": [{"role": "user", "content": "<video>what happens?"}, {"role": "assistant", "content": "a"}])";
  for (const char* column : {R"("videos": ["clip.mp4"])", R"("audios": "a.wav")", R"("objects": {"ref": ["cat"], "bbox": [[1, 2, 3, 4]]})"}) {
    for (const std::string& form : {chat, std::string(R"("query": "q", "response": "r")"), std::string(R"("text": "t")")}) {
      const Json row = Json::parse("{" + form + ", " + column + "}");
      try {
        normalise_row(row, "f.jsonl:7");
        ADD_FAILURE() << row.dump();
      } catch (const BadRowError& e) {
        EXPECT_EQ(e.reason(), "unsupported column") << e.what();
        const std::string key = std::string(column).substr(1, 6);  // videos / audios / object(s)
        EXPECT_NE(std::string(e.what()).find("f.jsonl:7"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      }
    }
  }
  for (const char* empty : {R"("videos": [])", R"("audios": null)", R"("objects": {})", R"("videos": "")"}) {
    EXPECT_EQ(reason_of(Json::parse("{" + chat + ", " + empty + "}")), "") << empty;
  }
  const Json pair = Json::parse(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                                    "rejected_response": "b", "videos": ["clip.mp4"]})");
  try {
    normalise_preference_row(pair, "p.jsonl:3", PreferenceTask::kPairs);
    ADD_FAILURE() << "a preference row with videos was accepted";
  } catch (const BadRowError& e) {
    EXPECT_EQ(e.reason(), "unsupported column") << e.what();
  }
}

TEST(Dataset, StreamsJsonArraysAndJsonlWithLimitsAndLineNumbers) {
  const fs::path dir = temp_dir("ds_stream");
  write_file_atomic(dir / "a.json", R"([{"text": "a"}, {"text": "b"}, {"text": "c"}])");
  std::vector<std::string> where;
  for_each_row(parse_dataset_source((dir / "a.json").string() + "#2"),
               [&](Json&&, const std::string& w) { where.push_back(w); }, [](auto&, auto&, auto&) {});
  EXPECT_EQ(where, (std::vector<std::string>{(dir / "a.json").string() + "[#0]", (dir / "a.json").string() + "[#1]"}));
  write_file_atomic(dir / "b.jsonl", "{\"text\": \"a\"}\n\n{broken\n{\"text\": \"c\"}\n");
  std::vector<std::string> bad;
  int rows = 0;
  for_each_row(parse_dataset_source((dir / "b.jsonl").string()), [&](Json&&, const std::string&) { ++rows; },
               [&](const std::string& w, const std::string& reason, const std::string&) { bad.push_back(w + " " + reason); });
  EXPECT_EQ(rows, 2);
  EXPECT_EQ(bad, std::vector<std::string>{(dir / "b.jsonl").string() + ":3 invalid JSON"});
  EXPECT_THROW(parse_dataset_source("x.json#0"), ConfigError);
}

std::shared_ptr<TextTokenizer> stories_tokenizer() { return load_tokenizer(stories_dir()); }

std::vector<int> trained_targets(const Sample& s) {
  std::vector<int> out;
  for (int32_t l : s.labels) {
    if (l != kIgnoreIndex) out.push_back(l);
  }
  return out;
}

// Raw text for a base model: BOS + prompt + "\n" + answer + EOS, loss on the answer and EOS only.
TEST(Encode, RawConversationTrainsTheAnswerAndEos) {
  auto tok = stories_tokenizer();
  SampleEncoder enc(tok, nullptr, {});
  const Conversation c = normalise_row(Json::parse(R"({"query": "Once upon a time", "response": "there was a cat."})"), "w");
  const auto s = enc.encode(c);
  ASSERT_TRUE(s.has_value());
  std::vector<int> expected = tok->encode_with_specials("Once upon a time\nthere was a cat.");
  expected.push_back(2);
  EXPECT_EQ(std::vector<int>(s->input_ids.begin(), s->input_ids.end()), expected);
  const auto targets = trained_targets(*s);
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets.back(), 2);
  EXPECT_EQ(tok->decode(std::vector<int>(targets.begin(), targets.end() - 1)), "there was a cat.");
  EXPECT_EQ(s->labels.back(), kIgnoreIndex);
}

// A checkpoint with ChatML tokens: the ids equal tokenising the full render; labels cover each assistant turn
// and its <|im_end|>.
TEST(Encode, ChatTemplateLabelsCoverAssistantTurnsAndEndMarkers) {
  const fs::path dir = temp_dir("chatml_tok");
  fs::copy_file(stories_dir() / "tokenizer.model", dir / "tokenizer.model");
  write_file_atomic(dir / "tokenizer_config.json", R"({"add_bos_token": false, "bos_token": "<s>", "eos_token": "<|im_end|>",
    "added_tokens_decoder": {"3": {"content": "<|im_start|>", "special": true}, "4": {"content": "<|im_end|>", "special": true}}})");
  auto tok = load_tokenizer(dir);
  auto tmpl = make_chat_template("chatml");
  SampleEncoder enc(tok, tmpl, {});
  const Conversation c = normalise_row(Json::parse(R"({"messages": [
      {"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
      {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you."}]})"), "w");
  const auto s = enc.encode(c);
  ASSERT_TRUE(s.has_value());
  const std::vector<int> full = tok->encode_with_special_tokens(tmpl->render_text(c.messages, false));
  EXPECT_EQ(std::vector<int>(s->input_ids.begin(), s->input_ids.end()), full);
  const auto targets = trained_targets(*s);
  EXPECT_EQ(tok->decode_with_special_tokens(targets), "Hello there.<|im_end|>See you.<|im_end|>");

  EncodeOptions last;
  last.loss_scale = LossScale::kLastRound;
  EXPECT_EQ(tok->decode_with_special_tokens(trained_targets(*SampleEncoder(tok, tmpl, last).encode(c))), "See you.<|im_end|>");
  Conversation muted = c;
  muted.messages[4].loss = false;
  EXPECT_EQ(tok->decode_with_special_tokens(trained_targets(*enc.encode(muted))), "Hello there.<|im_end|>");
}

TEST(Encode, TruncationStrategies) {
  auto tok = stories_tokenizer();
  const Conversation c = normalise_row(Json::parse(R"({"text": "Once upon a time there was a little girl named Lily."})"), "w");
  const size_t n = SampleEncoder(tok, nullptr, {}).encode(c)->input_ids.size();
  EncodeOptions o;
  o.max_length = 6;
  EXPECT_FALSE(SampleEncoder(tok, nullptr, o).encode(c).has_value());
  o.truncation = TruncationStrategy::kRight;
  auto s = SampleEncoder(tok, nullptr, o).encode(c);
  EXPECT_EQ(s->input_ids.size(), 6u);
  EXPECT_EQ(s->input_ids.front(), 1);
  EXPECT_EQ(s->labels.back(), kIgnoreIndex);
  o.truncation = TruncationStrategy::kLeft;
  s = SampleEncoder(tok, nullptr, o).encode(c);
  EXPECT_EQ(s->input_ids.size(), 6u);
  EXPECT_EQ(s->input_ids.back(), 2);  // EOS kept
  EXPECT_GT(n, 6u);
}

// A huge turn after the kept window stops the rendering early (one tokenisation, not one per later segment): the
// right-cut sample equals the whole row rendered and cut, labels included; "delete" still drops it.
TEST(Encode, AHugeRowIsCutAsIfRenderedWhole) {
  auto tok = stories_tokenizer();
  std::string huge;
  const char* words[] = {"the", "little", "girl", "ran", "to", "park", "and", "saw", "a", "big", "dog", "."};
  for (int i = 0; i < 40000; ++i) huge += std::string(words[(i * 7) % 12]) + (i % 13 == 0 ? "\n" : " ");
  Json row = {{"messages", {{{"role", "system"}, {"content", "Be kind."}},
                            {{"role", "user"}, {"content", "Hi"}},
                            {{"role", "assistant"}, {"content", "Hello there, friend."}},
                            {{"role", "user"}, {"content", huge}},
                            {{"role", "assistant"}, {"content", "See you."}}}}};
  const Conversation c = normalise_row(row, "w");
  for (const char* name : {"chatml", "raw"}) {
    const auto tmpl = std::string(name) == "raw" ? nullptr : make_chat_template(name);
    EncodeOptions whole;
    whole.max_length = 1 << 24;
    const auto ref = SampleEncoder(tok, tmpl, whole).encode(c);
    ASSERT_TRUE(ref.has_value());
    int kept = 0;
    for (int64_t L : {24, 40, 64, 96, 200}) {
      EncodeOptions o;
      o.max_length = L;
      o.truncation = TruncationStrategy::kRight;
      const auto s = SampleEncoder(tok, tmpl, o).encode(c);
      std::vector<int64_t> ids(ref->input_ids.begin(), ref->input_ids.begin() + L);
      std::vector<int64_t> labels(ref->labels.begin(), ref->labels.begin() + L);
      labels.back() = kIgnoreIndex;  // its target was cut
      if (std::all_of(labels.begin(), labels.end(), [](int64_t l) { return l == kIgnoreIndex; })) {
        EXPECT_FALSE(s.has_value()) << name << " " << L;  // nothing trained in the window: dropped, as whole
        continue;
      }
      ASSERT_TRUE(s.has_value()) << name << " " << L;
      ++kept;
      EXPECT_EQ(std::vector<int64_t>(s->input_ids.begin(), s->input_ids.end()), ids) << name << " " << L;
      EXPECT_EQ(std::vector<int64_t>(s->labels.begin(), s->labels.end()), labels) << name << " " << L;
      o.truncation = TruncationStrategy::kDelete;
      EXPECT_FALSE(SampleEncoder(tok, tmpl, o).encode(c).has_value()) << name << " " << L;
    }
    EXPECT_GE(kept, 2) << name;  // the wider windows hold the first answer
  }
}

TEST(Pipeline, StrictStopsAtTheFirstBadRowOtherwiseCountsByReason) {
  const fs::path dir = temp_dir("pipe_bad");
  write_file_atomic(dir / "d.jsonl",
                    "{\"query\": \"a\", \"response\": \"b\"}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"
                    "{broken\n"
                    "{\"query\": \"c\", \"response\": \"d\"}\n");
  SampleEncoder enc(stories_tokenizer(), nullptr, {});
  DataOptions o;
  o.dataset = {(dir / "d.jsonl").string()};
  try {
    prepare_data(o, enc, "fp");
    FAIL() << "strict mode accepted a bad row";
  } catch (const BadRowError& e) {
    EXPECT_NE(std::string(e.what()).find("d.jsonl:2: no assistant turn"), std::string::npos) << e.what();
  }
  o.strict = false;
  const TokenizedData data = prepare_data(o, enc, "fp");
  EXPECT_EQ(data.stats.rows, 4);
  EXPECT_EQ(data.train.size(), 2u);
  EXPECT_EQ(data.stats.skipped.total(), 2);
  EXPECT_EQ(data.stats.skipped.summary(), "2 rows skipped: 1 invalid JSON, 1 no assistant turn");
  // The skip counts survive the cache (they were once lost to a dangling temporary).
  o.cache_dir = temp_dir("pipe_bad_cache");
  prepare_data(o, enc, "fp");
  const TokenizedData cached = prepare_data(o, enc, "fp");
  EXPECT_TRUE(cached.stats.from_cache);
  EXPECT_EQ(cached.stats.skipped.summary(), "2 rows skipped: 1 invalid JSON, 1 no assistant turn");
  EXPECT_EQ(cached.stats.rows, 4);
}

TEST(Pipeline, ThreadsKeepOrderCacheReloadsAndSplitHoldsOut) {
  const fs::path alpaca = assets() / "data/sft/alpaca_en_demo.json";
  SWIFTCPP_REQUIRE_SHARED(alpaca);
  SampleEncoder enc(stories_tokenizer(), nullptr, {});
  DataOptions o;
  o.dataset = {alpaca.string() + "#600"};
  o.dataset_shuffle = false;
  o.num_threads = 1;
  const TokenizedData one = prepare_data(o, enc, "fp");
  o.num_threads = 2;
  const TokenizedData two = prepare_data(o, enc, "fp");
  ASSERT_EQ(one.train.size(), 600u);
  ASSERT_EQ(two.train.size(), 600u);
  for (size_t i = 0; i < 600; ++i) EXPECT_EQ(one.train[i].input_ids, two.train[i].input_ids) << i;

  const fs::path cache = temp_dir("pipe_cache");
  o.cache_dir = cache;
  o.split_dataset_ratio = 0.1;
  o.dataset_shuffle = true;
  const TokenizedData built = prepare_data(o, enc, "fp");
  EXPECT_FALSE(built.stats.from_cache);
  EXPECT_EQ(built.validation.size(), 60u);
  EXPECT_EQ(built.train.size(), 540u);
  const TokenizedData cached = prepare_data(o, enc, "fp");
  EXPECT_TRUE(cached.stats.from_cache);
  EXPECT_LT(cached.stats.seconds, 1.0);
  ASSERT_EQ(cached.train.size(), built.train.size());
  for (size_t i = 0; i < built.train.size(); ++i) {
    EXPECT_EQ(cached.train[i].input_ids, built.train[i].input_ids);
    EXPECT_EQ(cached.train[i].labels, built.train[i].labels);
  }
  EXPECT_FALSE(prepare_data(o, enc, "other tokenizer").stats.from_cache);  // the key covers the fingerprint
}

// split_dataset_ratio holds out ceil(ratio * rows) for every method, as Hugging Face datasets' train_test_split
// counts its test rows (GRPO rounded up and the others to nearest before: 0.12 of 10 rows gave 2 and 1).
TEST(Dataset, EveryMethodHoldsOutTheSameValidationRows) {
  EXPECT_EQ(data_detail::validation_rows(0.12, 10), 2u);
  EXPECT_EQ(data_detail::validation_rows(0.1, 600), 60u);
  EXPECT_EQ(data_detail::validation_rows(0.99, 3), 2u);  // never every row
  EXPECT_EQ(data_detail::validation_rows(0.5, 1), 0u);
  EXPECT_EQ(data_detail::validation_rows(0, 100), 0u);
  EXPECT_EQ(data_detail::validation_rows(0.3, 0), 0u);
}

}  // namespace
}  // namespace swiftcpp
