// Preference data: every row form and its bad rows, encoding with a prompt shared by both answers and labels only
// on the answers, TRL's truncation, the 2B-row pair batch and the KTO/KL batches against TRL's reference layout,
// and the threaded, cached pipeline.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "data/preference_data.h"
#include "tests/tensor_util.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::stories_dir;
using test::temp_dir;

constexpr const char* kWhere = "p.jsonl:3";

PreferenceRow norm(const std::string& json, PreferenceTask task = PreferenceTask::kPairs) {
  return normalise_preference_row(Json::parse(json), kWhere, task);
}

// The reason a row is refused for, checking that the message names the row first.
std::string reason_of(const std::string& json, PreferenceTask task = PreferenceTask::kPairs) {
  try {
    norm(json, task);
  } catch (const BadRowError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(std::string(kWhere) + ": " + e.reason(), 0), 0u) << e.what();
    return e.reason();
  }
  return "";
}

std::vector<std::string> roles(const std::vector<ChatMessage>& messages) {
  std::vector<std::string> out;
  for (const auto& m : messages) out.push_back(m.role + ":" + m.content);
  return out;
}

std::shared_ptr<TextTokenizer> stories_tokenizer() { return load_tokenizer(stories_dir()); }

// stories260K's sentencepiece model with ChatML's two markers as special tokens.
std::shared_ptr<TextTokenizer> chatml_tokenizer() {
  const fs::path dir = temp_dir("pref_chatml_tok");
  fs::copy_file(stories_dir() / "tokenizer.model", dir / "tokenizer.model");
  write_file_atomic(dir / "tokenizer_config.json", R"({"add_bos_token": false, "bos_token": "<s>", "eos_token": "<|im_end|>",
    "added_tokens_decoder": {"3": {"content": "<|im_start|>", "special": true}, "4": {"content": "<|im_end|>", "special": true}}})");
  return load_tokenizer(dir);
}

std::vector<int32_t> ids32(const std::vector<int>& ids) { return {ids.begin(), ids.end()}; }

std::vector<int32_t> json_ids(const Json& j) { return j.get<std::vector<int32_t>>(); }

// The targets of a sample (its labels that are not kIgnoreIndex), and the first position that has one.
std::vector<int> targets(const Sample& s) {
  std::vector<int> out;
  for (int32_t l : s.labels) {
    if (l != kIgnoreIndex) out.push_back(l);
  }
  return out;
}
int64_t first_label(const Sample& s) {
  for (size_t t = 0; t < s.labels.size(); ++t) {
    if (s.labels[t] != kIgnoreIndex) return static_cast<int64_t>(t);
  }
  return -1;
}

std::vector<int32_t> prefix(const Sample& s, int64_t n) { return {s.input_ids.begin(), s.input_ids.begin() + n}; }

// Checks the invariants of an encoded pair: both sequences start with the same prompt ids, nothing inside the
// prompt is trained, the last prompt position predicts the answer's first token, and labels are shifted ids.
void expect_pair_layout(const PreferenceSample& p, const std::string& what) {
  ASSERT_GE(p.prompt_length, 1) << what;
  EXPECT_EQ(prefix(p.chosen, p.prompt_length), prefix(p.rejected, p.prompt_length)) << what;
  for (const Sample* s : {&p.chosen, &p.rejected}) {
    EXPECT_EQ(first_label(*s), p.prompt_length - 1) << what;
    EXPECT_EQ(s->labels.back(), kIgnoreIndex) << what;
    for (size_t t = 0; t + 1 < s->labels.size(); ++t) {
      if (s->labels[t] != kIgnoreIndex) {
        EXPECT_EQ(s->labels[t], s->input_ids[t + 1]) << what << " position " << t;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Rows

TEST(PrefDataRows, EveryFormNormalisesToAPromptAndItsAnswers) {
  // ms-swift: messages ending with the chosen turn, rejected_response, margin (reward modelling).
  PreferenceRow r = norm(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
      {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "good"}],
      "rejected_response": "bad", "margin": 1.5})");
  EXPECT_EQ(roles(r.prompt), (std::vector<std::string>{"system:S", "user:q1", "assistant:a1", "user:q2"}));
  EXPECT_EQ(r.chosen, "good");
  EXPECT_EQ(r.rejected, std::optional<std::string>("bad"));
  EXPECT_EQ(r.margin, std::optional<double>(1.5));
  EXPECT_EQ(r.desirable, std::nullopt);
  EXPECT_EQ(r.where, kWhere);

  // ms-swift: rejected_messages repeating the prompt.
  r = norm(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}],
      "rejected_messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]})");
  EXPECT_EQ(roles(r.prompt), std::vector<std::string>{"user:q"});
  EXPECT_EQ(r.chosen, "c");
  EXPECT_EQ(*r.rejected, "r");
  EXPECT_EQ(r.margin, std::nullopt);

  // KTO: messages + label.
  r = norm(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}], "label": false})",
           PreferenceTask::kKto);
  EXPECT_EQ(r.chosen, "c");
  EXPECT_EQ(r.desirable, std::optional<bool>(false));
  EXPECT_EQ(r.rejected, std::nullopt);
  // A pair row in a KTO run stays a pair (encode_kto splits it); a label in a pair run is ignored.
  r = norm(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}], "rejected_response": "r"})",
           PreferenceTask::kKto);
  EXPECT_EQ(r.desirable, std::nullopt);
  EXPECT_EQ(*r.rejected, "r");
  r = norm(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}], "rejected_response": "r",
      "label": true})");
  EXPECT_EQ(r.desirable, std::nullopt);

  // LLaMA-Factory: conversations ending with the human turn, chosen/rejected as messages or as strings.
  r = norm(R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "q"}],
      "chosen": {"from": "gpt", "value": "c"}, "rejected": {"from": "gpt", "value": "r"}})");
  EXPECT_EQ(roles(r.prompt), (std::vector<std::string>{"system:S", "user:q"}));
  EXPECT_EQ(r.chosen, "c");
  EXPECT_EQ(*r.rejected, "r");
  r = norm(R"({"conversations": [{"from": "human", "value": "q"}], "chosen": "c", "rejected": "r", "system": "S"})");
  EXPECT_EQ(roles(r.prompt), (std::vector<std::string>{"system:S", "user:q"}));
  EXPECT_EQ(*r.rejected, "r");

  // Prompt forms.
  r = norm(R"({"prompt": "q", "chosen": "c", "rejected": "r"})");
  EXPECT_EQ(roles(r.prompt), std::vector<std::string>{"user:q"});
  r = norm(R"({"query": "q", "response": "c", "rejected_response": "r", "history": [["h", "ha"]]})");
  EXPECT_EQ(roles(r.prompt), (std::vector<std::string>{"user:h", "assistant:ha", "user:q"}));
  EXPECT_EQ(r.chosen, "c");
  r = norm(R"({"instruction": "Add", "input": "1 and 2", "chosen": "3", "rejected": "4"})");
  EXPECT_EQ(roles(r.prompt), std::vector<std::string>{"user:Add\n1 and 2"});
  EXPECT_EQ(*r.rejected, "4");
  r = norm(R"({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "c"}],
      "rejected": [{"role": "assistant", "content": "r"}]})");
  EXPECT_EQ(roles(r.prompt), std::vector<std::string>{"user:q"});
  EXPECT_EQ(r.chosen, "c");
  EXPECT_EQ(*r.rejected, "r");
  r = norm(R"({"prompt": "q", "completion": "c", "label": true})", PreferenceTask::kKto);
  EXPECT_EQ(r.desirable, std::optional<bool>(true));

  // The system override replaces the row's system prompt, in both conversations of rejected_messages.
  r = normalise_preference_row(Json::parse(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
      {"role": "assistant", "content": "c"}], "rejected_messages": [{"role": "system", "content": "S"},
      {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]})"),
                               kWhere, PreferenceTask::kPairs, std::string("O"));
  EXPECT_EQ(roles(r.prompt), (std::vector<std::string>{"system:O", "user:q"}));
  EXPECT_EQ(preference_task_for("dpo"), PreferenceTask::kPairs);
  EXPECT_EQ(preference_task_for("rm"), PreferenceTask::kPairs);
  EXPECT_EQ(preference_task_for("kto"), PreferenceTask::kKto);
  EXPECT_THROW(preference_task_for("grpo"), ConfigError);
}

TEST(PrefDataRows, BadRowsNameTheRowAndAStableReason) {
  const std::string ua = R"("messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}])";
  EXPECT_EQ(reason_of("{" + ua + "}"), "no rejected answer");
  EXPECT_EQ(reason_of("{" + ua + R"(, "label": true})"), "no rejected answer");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": ""})"), "empty rejected answer");
  EXPECT_EQ(reason_of(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}],
      "rejected_response": "r"})"), "empty chosen answer");
  EXPECT_EQ(reason_of(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}],
      "label": true})", PreferenceTask::kKto), "empty completion");
  EXPECT_EQ(reason_of("{" + ua + "}", PreferenceTask::kKto), "KTO row without a boolean label");
  EXPECT_EQ(reason_of("{" + ua + R"(, "label": "yes"})", PreferenceTask::kKto), "KTO row without a boolean label");
  EXPECT_EQ(reason_of("{" + ua + R"(, "label": 1})", PreferenceTask::kKto), "KTO row without a boolean label");
  EXPECT_EQ(reason_of("{" + ua + R"(, "label": true, "rejected_response": "r"})", PreferenceTask::kKto),
            "label and rejected answer both given");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_messages": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "r"}]})"),
            "rejected_messages prompt differs");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
      {"role": "assistant", "content": "r"}]})"), "rejected_messages prompt differs");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_messages": [{"role": "user", "content": "q"}]})"), "no assistant turn");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": 5})"), "non-string content");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": {"role": "user", "content": "r"}})"), "wrong role order");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": "r", "margin": "big"})"), "bad margin");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": "r", "margin": 1e308})"), "bad margin");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": "r", "margin": -2e4})"), "bad margin");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": "r", "rejected": "s"})"), "unknown format");
  EXPECT_EQ(reason_of(R"({"conversations": [{"from": "human", "value": "q"}], "rejected": "r"})"), "no chosen answer");
  EXPECT_EQ(reason_of(R"({"prompt": "q", "rejected": "r"})"), "no chosen answer");
  EXPECT_EQ(reason_of(R"({"prompt": 7, "chosen": "c", "rejected": "r"})"), "non-string content");
  EXPECT_EQ(reason_of(R"({"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "human", "value": "c"},
      "rejected": "r"})"), "wrong role order");
  EXPECT_EQ(reason_of(R"({"messages": [{"role": "assistant", "content": "c"}, {"role": "user", "content": "q"},
      {"role": "assistant", "content": "c"}], "rejected_response": "r"})"), "wrong role order");
  EXPECT_EQ(reason_of(R"({"chosen": "c", "rejected": "r"})"), "unknown format");
  EXPECT_EQ(reason_of("[1, 2]"), "unknown format");
  // Images are read as SFT reads them (test_mm_data.cpp encodes them): a column without placeholders is a count
  // mismatch, content parts are images; an empty column is no image.
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": "r", "images": ["a.jpg"]})"), "image count mismatch");
  EXPECT_EQ(reason_of(R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "?"}]},
      {"role": "assistant", "content": "c"}], "rejected_response": "r"})"), "");
  EXPECT_EQ(reason_of("{" + ua + R"(, "rejected_response": "r", "images": []})"), "");
}

TEST(PrefDataRows, EveryRowOfLlamaFactoryDpoDemoParses) {
  const fs::path file = assets() / "data/preference/dpo_en_demo.json";
  SWIFTCPP_REQUIRE_SHARED(file);
  int64_t rows = 0, with_system = 0, multi_turn = 0;
  for_each_row(
      parse_dataset_source(file.string()),
      [&](Json&& row, const std::string& where) {
        const PreferenceRow r = normalise_preference_row(row, where, PreferenceTask::kPairs);
        EXPECT_EQ(where, fmt::format("{}[#{}]", file.string(), rows));
        ASSERT_FALSE(r.prompt.empty()) << where;
        EXPECT_EQ(r.prompt.back().role, "user") << where;
        EXPECT_EQ(r.chosen, row.at("chosen").at("value").get<std::string>()) << where;
        EXPECT_EQ(*r.rejected, row.at("rejected").at("value").get<std::string>()) << where;
        EXPECT_EQ(r.prompt.size(), row.at("conversations").size()) << where;
        with_system += r.prompt.front().role == "system";
        multi_turn += std::count_if(r.prompt.begin(), r.prompt.end(), [](const auto& m) { return m.role == "user"; }) > 1;
        ++rows;
      },
      [](auto&, auto&, auto&) { FAIL(); });
  EXPECT_EQ(rows, 300);
  EXPECT_EQ(with_system, 80);  // the file's 80 system turns are all first turns
  EXPECT_GT(multi_turn, 0);
  // In KTO runs every pair row is two examples.
  const PreferenceRow first = normalise_preference_row(Json::parse(read_text_file(file))[0], "w", PreferenceTask::kKto);
  EXPECT_TRUE(first.rejected.has_value());
  EXPECT_EQ(first.prompt.front().content.rfind("Hi! I'd like to create a new language game", 0), 0u);
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding

// Raw text (stories260K has no chat template): the prompt is the user text with BOS, each answer its own
// tokenisation followed by EOS, trained on the answer and EOS only.
TEST(PrefDataEncode, RawPromptIsTheUserTextAndAnswersEndInEos) {
  auto tok = stories_tokenizer();
  const PreferenceEncoder enc(tok, nullptr, {});
  const PreferenceRow row = norm(R"({"prompt": "Once upon a time", "chosen": "there was a cat.", "rejected": "it rained."})");
  const auto pair = enc.encode_pair(row);
  ASSERT_TRUE(pair.has_value());
  const std::vector<int32_t> prompt = ids32(tok->encode_with_specials("Once upon a time"));
  ASSERT_EQ(prompt.front(), 1);
  EXPECT_EQ(pair->prompt_length, static_cast<int64_t>(prompt.size()));
  std::vector<int32_t> chosen = prompt;
  for (int id : tok->encode("there was a cat.")) chosen.push_back(id);
  chosen.push_back(2);
  EXPECT_EQ(pair->chosen.input_ids, chosen);
  const std::vector<int> rejected_targets = targets(pair->rejected);
  EXPECT_EQ(tok->decode(std::vector<int>(rejected_targets.begin(), rejected_targets.end() - 1)), "it rained.");
  EXPECT_EQ(rejected_targets.back(), 2);
  EXPECT_EQ(pair->margin, 0.0);
  expect_pair_layout(*pair, "raw");

  // KTO: a KTO row gives one example, a pair row two (chosen desirable, then rejected undesirable).
  const auto one = enc.encode_kto(norm(R"({"prompt": "Once upon a time", "completion": "a dog.", "label": false})",
                                       PreferenceTask::kKto));
  ASSERT_EQ(one.size(), 1u);
  ASSERT_TRUE(one[0].has_value());
  EXPECT_FALSE(one[0]->desirable);
  EXPECT_EQ(one[0]->prompt_length, static_cast<int64_t>(prompt.size()));
  const auto two = enc.encode_kto(row);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_TRUE(two[0]->desirable);
  EXPECT_FALSE(two[1]->desirable);
  EXPECT_EQ(two[0]->completion.input_ids, pair->chosen.input_ids);
  EXPECT_EQ(two[1]->completion.labels, pair->rejected.labels);
}

// With a chat template each sequence is exactly the SFT encoding (loss_scale last_round) of prompt + answer,
// both share the prompt's ids (what inference feeds), and only the final answer and its end-of-turn marker are
// trained. The first 60 rows of the real file: 19 multi-turn rows, 20 with a system prompt.
TEST(PrefDataEncode, TemplatePairsShareThePromptAndEqualTheSftEncoding) {
  const fs::path file = assets() / "data/preference/dpo_en_demo.json";
  SWIFTCPP_REQUIRE_SHARED(file);
  auto tok = chatml_tokenizer();
  auto tmpl = chat_template_for(*tok, "chatml");
  PreferenceEncodeOptions options;
  options.max_length = 1 << 20;
  const PreferenceEncoder enc(tok, tmpl, options);
  EncodeOptions sft_options;
  sft_options.max_length = 1 << 20;
  sft_options.loss_scale = LossScale::kLastRound;
  const SampleEncoder sft(tok, tmpl, sft_options);
  int64_t rows = 0;
  for_each_row(
      parse_dataset_source(file.string() + "#60"),
      [&](Json&& json, const std::string& where) {
        const PreferenceRow row = normalise_preference_row(json, where, PreferenceTask::kPairs);
        const auto pair = enc.encode_pair(row);
        ASSERT_TRUE(pair.has_value()) << where;
        expect_pair_layout(*pair, where);
        EXPECT_EQ(prefix(pair->chosen, pair->prompt_length), ids32(sft.encode_prompt(row.prompt))) << where;
        for (const auto& [answer, sample] : {std::pair{&row.chosen, &pair->chosen}, std::pair{&*row.rejected, &pair->rejected}}) {
          Conversation c;
          c.messages = row.prompt;
          c.messages.push_back({"assistant", *answer, std::nullopt});
          const auto expected = sft.encode(c);
          ASSERT_TRUE(expected.has_value()) << where;
          EXPECT_EQ(sample->input_ids, expected->input_ids) << where;
          EXPECT_EQ(sample->labels, expected->labels) << where;
          // Trained: the answer's ids through the one <|im_end|> (id 4) that closes it.
          const std::vector<int> t = targets(*sample);
          EXPECT_EQ(std::count(t.begin(), t.end(), 4), 1) << where;
          EXPECT_EQ(t.back(), 4) << where;
          EXPECT_TRUE(std::equal(t.begin(), t.end(), sample->input_ids.begin() + pair->prompt_length)) << where;
        }
        ++rows;
      },
      [](auto&, auto&, auto&) {});
  EXPECT_EQ(rows, 60);
}

// swiftcpp's "default" template on stories260K's own tokenizer: "### Assistant:\n" then the answer and the EOS
// text "</s>", which the tokenizer parses as EOS.
TEST(PrefDataEncode, DefaultTemplateOnStoriesTrainsTheAnswerAndEos) {
  auto tok = stories_tokenizer();
  const PreferenceEncoder enc(tok, chat_template_for(*tok, "default"), {});
  const PreferenceRow row = norm(R"({"conversations": [{"from": "system", "value": "Tell stories."},
      {"from": "human", "value": "Once upon a time"}], "chosen": "there was a cat.", "rejected": "no."})");
  const auto pair = enc.encode_pair(row);
  ASSERT_TRUE(pair.has_value());
  expect_pair_layout(*pair, "default");
  const std::vector<int> chosen_targets = targets(pair->chosen);
  EXPECT_EQ(chosen_targets.back(), 2);
  EXPECT_EQ(tok->decode(std::vector<int>(chosen_targets.begin(), chosen_targets.end() - 1)), "there was a cat.");
  const std::string prompt = tok->decode(prefix(pair->rejected, pair->prompt_length));
  const std::string header = "### Assistant:\n";
  ASSERT_GE(prompt.size(), header.size());
  EXPECT_EQ(prompt.substr(prompt.size() - header.size()), header);
  EXPECT_NE(prompt.find("Tell stories."), std::string::npos);
}

// A byte-level BPE merges the newline that ends ChatML's "assistant\n" with an answer that starts with
// newlines, so the joint encoding no longer begins with the prompt's ids. The answer is then tokenised on its
// own (TRL's rule), and the pair still shares the prompt.
TEST(PrefDataEncode, AMergeAcrossTheAnswerStartFallsBackToSeparateTokenisation) {
  const fs::path dir = assets() / "tokenizers/gpt2";
  SWIFTCPP_REQUIRE_SHARED(dir);
  auto tok = load_tokenizer(dir);
  auto tmpl = chat_template_for(*tok, "chatml");
  const PreferenceEncoder enc(tok, tmpl, {});
  const PreferenceRow row = norm(R"({"prompt": "Hi", "chosen": "\n\nHello there", "rejected": "Bye"})");
  const std::vector<int32_t> prompt = enc.encode_prompt(row.prompt, kWhere);
  EncodeOptions sft_options;
  sft_options.loss_scale = LossScale::kLastRound;
  const SampleEncoder sft(tok, tmpl, sft_options);
  Conversation c;
  c.messages = row.prompt;
  c.messages.push_back({"assistant", row.chosen, std::nullopt});
  const Sample joint = *sft.encode(c);
  ASSERT_NE(prefix(joint, static_cast<int64_t>(prompt.size())), prompt) << "the tokenizer no longer merges here";
  const auto pair = enc.encode_pair(row);
  ASSERT_TRUE(pair.has_value());
  expect_pair_layout(*pair, "merged");
  EXPECT_EQ(prefix(pair->chosen, pair->prompt_length), prompt);
  std::vector<int32_t> expected = prompt;
  for (int id : tok->encode_with_special_tokens("\n\nHello there<|im_end|>")) expected.push_back(id);
  const size_t answer_end = expected.size();
  for (int id : tok->encode_with_special_tokens("\n")) expected.push_back(id);  // ChatML's newline, untrained
  EXPECT_EQ(pair->chosen.input_ids, expected);
  EXPECT_EQ(first_label(pair->chosen), pair->prompt_length - 1);
  EXPECT_EQ(static_cast<size_t>(targets(pair->chosen).size()), answer_end - prompt.size());
  // The other answer took the joint path: its sequence is the SFT encoding.
  c.messages.back().content = "Bye";
  EXPECT_EQ(pair->rejected.input_ids, sft.encode(c)->input_ids);
}

// The split the encoder relies on: in every template, the text before the final answer's trained run is the
// render of the prompt with the generation prompt, i.e. what inference feeds.
TEST(PrefDataEncode, TheTextBeforeTheAnswerIsTheGenerationPromptInEveryTemplate) {
  for (const std::string& name : chat_template_names()) {
    if (name == "raw") continue;
    const auto tmpl = make_chat_template(name);
    std::vector<ChatMessage> prompt = {
        {"user", "Hi", std::nullopt}, {"assistant", "Hello.", std::nullopt}, {"user", "How are you?", std::nullopt}};
    if (name != "gemma" && name != "mistral") prompt.insert(prompt.begin(), {"system", "Be brief.", std::nullopt});
    std::vector<ChatMessage> full = prompt;
    full.push_back({"assistant", "Fine.", std::nullopt});
    const std::vector<TemplateSegment> segments = tmpl->render(full, false);
    size_t last = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].trainable) last = i;
    }
    std::string before;
    for (size_t i = 0; i < last; ++i) before += segments[i].text;
    EXPECT_EQ(before, tmpl->render_text(prompt, true)) << name;
    EXPECT_NE(segments[last].text.find("Fine."), std::string::npos) << name;
  }
}

// TRL 0.9.6's rule on the lengths of the reference pairs (dpo_family.json: max_length 96, max_prompt_length 32,
// keep_start): untruncated prompt / chosen / rejected 39/58/125, 204/36/33, 27/1303/445 become 32/58/64, 32/36/33,
// 27/64/64.
TEST(PrefDataEncode, TruncationFollowsTrl) {
  PreferenceEncodeOptions o;
  o.max_length = 96;
  o.max_prompt_length = 32;
  o.truncation = TruncationStrategy::kRight;
  const auto expect_cut = [&](int64_t p, std::vector<int64_t> answers, int64_t begin, int64_t end,
                              std::vector<int64_t> kept) {
    const PreferenceCut cut = cut_preference_lengths(p, answers, o);
    EXPECT_TRUE(cut.keep);
    EXPECT_EQ(cut.prompt_begin, begin) << p;
    EXPECT_EQ(cut.prompt_end, end) << p;
    EXPECT_EQ(cut.answers, kept) << p;
  };
  expect_cut(39, {58, 125}, 0, 32, {58, 64});
  expect_cut(204, {36, 33}, 0, 32, {36, 33});
  expect_cut(27, {1303, 445}, 0, 27, {64, 64});  // the prompt fits; the answers still go to 96 - 32
  expect_cut(20, {70, 10}, 0, 20, {70, 10});     // fits: untouched
  expect_cut(39, {125}, 0, 32, {64});            // a KTO example
  o.truncation = TruncationStrategy::kLeft;      // keep_end
  expect_cut(39, {58, 125}, 7, 39, {58, 64});
  o.truncation = TruncationStrategy::kDelete;
  EXPECT_FALSE(cut_preference_lengths(39, {58, 125}, o).keep);
  EXPECT_TRUE(cut_preference_lengths(38, {58, 10}, o).keep);

  // Options the rule cannot work with.
  auto tok = stories_tokenizer();
  o.truncation = TruncationStrategy::kLeft;
  o.max_prompt_length = 0;
  EXPECT_THROW(PreferenceEncoder(tok, nullptr, o), ConfigError);
  o.max_prompt_length = 96;
  EXPECT_THROW(PreferenceEncoder(tok, nullptr, o), ConfigError);
  o.max_length = 1;
  o.truncation = TruncationStrategy::kDelete;
  EXPECT_THROW(PreferenceEncoder(tok, nullptr, o), ConfigError);
}

// Truncation keeps a pair consistent: both sequences keep the same prompt ids (the end of the prompt with "left",
// its start with "right"), answers keep their starts, and every sequence fits max_length.
TEST(PrefDataEncode, TruncationKeepsThePairConsistent) {
  auto tok = stories_tokenizer();
  const PreferenceRow row = norm(R"({"prompt": "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends.",
      "chosen": "One day she found a big red ball under a tree and she was very happy.",
      "rejected": "The end."})");
  const auto full = PreferenceEncoder(tok, nullptr, {}).encode_pair(row);
  ASSERT_TRUE(full.has_value());
  const int64_t p = full->prompt_length;
  const int64_t chosen = static_cast<int64_t>(full->chosen.input_ids.size()) - p;
  ASSERT_GT(p, 12);
  ASSERT_GT(chosen, 12);
  PreferenceEncodeOptions o;
  o.max_length = 20;
  o.max_prompt_length = 8;
  EXPECT_FALSE(PreferenceEncoder(tok, nullptr, o).encode_pair(row).has_value());  // delete
  for (const auto mode : {TruncationStrategy::kLeft, TruncationStrategy::kRight}) {
    o.truncation = mode;
    const auto cut = PreferenceEncoder(tok, nullptr, o).encode_pair(row);
    ASSERT_TRUE(cut.has_value());
    expect_pair_layout(*cut, "truncated");
    EXPECT_EQ(cut->prompt_length, 8);
    const std::vector<int32_t> whole = prefix(full->chosen, p);
    const std::vector<int32_t> kept = mode == TruncationStrategy::kLeft
                                          ? std::vector<int32_t>(whole.end() - 8, whole.end())
                                          : std::vector<int32_t>(whole.begin(), whole.begin() + 8);
    EXPECT_EQ(prefix(cut->chosen, 8), kept);
    EXPECT_EQ(cut->chosen.input_ids.size(), 20u);  // 8 + (20 - 8)
    EXPECT_TRUE(std::equal(cut->chosen.input_ids.begin() + 8, cut->chosen.input_ids.end(), full->chosen.input_ids.begin() + p));
    EXPECT_EQ(cut->rejected.input_ids.size(), full->rejected.input_ids.size() - static_cast<size_t>(p - 8));
    EXPECT_EQ(cut->rejected.labels.back(), kIgnoreIndex);
  }
}

// The raw encoding of the reference rows reproduces the ids TRL's tokenize_row layout gives (dpo_family.json):
// [BOS] + prompt cut to 32, answers with EOS. The reference keeps an EOS on truncated answers (encode[:63] + EOS);
// TRL's truncation (and ours) keeps the first 64 answer ids instead, so there the first 63 ids are compared.
TEST(PrefDataEncode, RawEncodingReproducesTheTrlReferenceIds) {
  const fs::path ref_file = assets() / "reference/rlhf/dpo_family.json";
  const fs::path data = assets() / "data/preference/dpo_en_demo.json";
  SWIFTCPP_REQUIRE_SHARED(ref_file);
  SWIFTCPP_REQUIRE_SHARED(data);
  const Json ref = load_json_file(ref_file);
  const Json rows = load_json_file(data);
  PreferenceEncodeOptions o;
  o.max_length = 96;
  o.max_prompt_length = 32;
  o.truncation = TruncationStrategy::kRight;
  const PreferenceEncoder enc(stories_tokenizer(), nullptr, o);
  for (const Json& pair : ref.at("batch").at("pairs")) {
    const int64_t index = pair.at("row").get<int64_t>();
    const auto sample = enc.encode_pair(normalise_preference_row(rows.at(index), "w", PreferenceTask::kPairs));
    ASSERT_TRUE(sample.has_value()) << index;
    EXPECT_EQ(prefix(sample->chosen, sample->prompt_length), json_ids(pair.at("prompt_ids"))) << index;
    for (const char* side : {"chosen", "rejected"}) {
      const Sample& s = std::string(side) == "chosen" ? sample->chosen : sample->rejected;
      const std::vector<int32_t> answer(s.input_ids.begin() + sample->prompt_length, s.input_ids.end());
      const std::vector<int32_t> expected = json_ids(pair.at(std::string(side) + "_ids"));
      if (pair.at("truncated").at(side).get<bool>()) {
        ASSERT_EQ(answer.size(), expected.size()) << index << side;
        EXPECT_EQ(std::vector<int32_t>(answer.begin(), answer.end() - 1),
                  std::vector<int32_t>(expected.begin(), expected.end() - 1)) << index << side;
      } else {
        EXPECT_EQ(answer, expected) << index << side;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Batches

// The reference pairs' ids as PreferenceSamples (every answer id trained).
std::vector<PreferenceSample> reference_pairs(const Json& ref) {
  std::vector<PreferenceSample> pairs;
  for (const Json& pair : ref.at("batch").at("pairs")) {
    const std::vector<int32_t> prompt = json_ids(pair.at("prompt_ids"));
    PreferenceSample p;
    for (const char* side : {"chosen", "rejected"}) {
      AnswerTokens answer;
      answer.ids = json_ids(pair.at(std::string(side) + "_ids"));
      answer.trained.assign(answer.ids.size(), 1);
      (std::string(side) == "chosen" ? p.chosen : p.rejected) = join_prompt_answer(prompt, answer);
    }
    p.prompt_length = static_cast<int64_t>(prompt.size());
    pairs.push_back(std::move(p));
  }
  return pairs;
}

// Compares a collated batch with TRL's padded tensors: the same ids and attention mask; TRL's labels are
// unshifted (labels[t] is input_ids[t] or -100), ours shifted (labels[t] is what position t predicts).
void expect_trl_batch(const Batch& batch, const Json& input_ids, const Json& attention_mask, const Json& labels,
                      const std::string& what) {
  const at::Tensor ids = test::json_to_tensor(input_ids).to(at::kLong);  // [N, T]
  ASSERT_EQ(batch.input_ids.sizes(), ids.sizes()) << what;
  EXPECT_TRUE(at::equal(batch.input_ids, ids)) << what;
  ASSERT_TRUE(batch.key_valid.defined()) << what;
  EXPECT_TRUE(at::equal(batch.key_valid, test::json_to_tensor(attention_mask).to(at::kBool))) << what;
  const at::Tensor trl = test::json_to_tensor(labels).to(at::kLong);
  const int64_t T = ids.size(1);
  EXPECT_TRUE(at::equal(batch.labels.narrow(1, 0, T - 1), trl.narrow(1, 1, T - 1))) << what;
  EXPECT_TRUE((batch.labels.select(1, T - 1) == kIgnoreIndex).all().item<bool>()) << what;
}

// One batch of 2B rows, as TRL's concatenated_inputs builds it: rows 0..B-1 prompt + chosen, B..2B-1 prompt +
// rejected, right-padded to the longest of all.
TEST(PrefDataBatch, PairsCollateIntoTrlsConcatenatedLayout) {
  const fs::path ref_file = assets() / "reference/rlhf/dpo_family.json";
  SWIFTCPP_REQUIRE_SHARED(ref_file);
  const Json ref = load_json_file(ref_file);
  std::vector<PreferenceSample> pairs = reference_pairs(ref);
  pairs[1].margin = 0.5;
  std::vector<const PreferenceSample*> in;
  for (const auto& p : pairs) in.push_back(&p);
  const Json& concatenated = ref.at("batch").at("concatenated");
  const PreferenceBatch batch = collate_preference(in, concatenated.at("pad_id").get<int32_t>());
  expect_trl_batch(batch.batch, concatenated.at("input_ids"), concatenated.at("attention_mask"),
                   concatenated.at("labels"), "pairs");
  EXPECT_TRUE(at::equal(batch.margin, at::tensor({0.0f, 0.5f, 0.0f})));
  int64_t label_tokens = 0;
  for (const auto& p : pairs) label_tokens += p.chosen.label_tokens() + p.rejected.label_tokens();
  EXPECT_EQ(batch.batch.label_tokens, label_tokens);
  EXPECT_THROW(collate_preference({}, 0), ConfigError);
}

// KTO: the reference's 4 examples (pairs 0 and 1 unpaired: chosen desirable, rejected undesirable) and the KL rows
// TRL's _get_kl_dataset builds from them: prompt i with the completion of example 3 - i.
TEST(PrefDataBatch, KtoKlRowsReverseTheCompletionsAsTrlDoes) {
  const fs::path ref_file = assets() / "reference/rlhf/dpo_family.json";
  SWIFTCPP_REQUIRE_SHARED(ref_file);
  const Json ref = load_json_file(ref_file);
  const Json& kto = ref.at("methods").at("kto");
  std::vector<KtoSample> examples;
  for (const Json& e : kto.at("examples")) {
    AnswerTokens completion;
    completion.ids = json_ids(e.at("completion_ids"));
    completion.trained.assign(completion.ids.size(), 1);
    KtoSample k;
    k.completion = join_prompt_answer(json_ids(e.at("prompt_ids")), completion);
    k.prompt_length = static_cast<int64_t>(e.at("prompt_ids").size());
    k.desirable = e.at("label").get<bool>();
    examples.push_back(std::move(k));
  }
  ASSERT_EQ(examples.size(), 4u);
  std::vector<const KtoSample*> block;
  for (const auto& e : examples) block.push_back(&e);
  PreferenceEncodeOptions o;
  o.max_length = 96;
  o.max_prompt_length = 32;
  o.truncation = TruncationStrategy::kRight;
  const std::vector<Sample> kl = kto_kl_samples(block, o);
  ASSERT_EQ(kl.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const Json& row = kto.at("kl_batch").at(i);
    EXPECT_EQ(row.at("prompt_of_example").get<size_t>(), i);
    EXPECT_EQ(row.at("completion_of_example").get<size_t>(), 3 - i);
    std::vector<int32_t> expected = json_ids(row.at("prompt_ids"));
    const std::vector<int32_t> completion = json_ids(row.at("completion_ids"));
    expected.insert(expected.end(), completion.begin(), completion.end());
    EXPECT_EQ(kl[i].input_ids, expected) << i;
    EXPECT_EQ(kl[i].label_tokens(), static_cast<int64_t>(completion.size())) << i;
  }
  std::vector<const Sample*> kl_rows;
  for (const auto& s : kl) kl_rows.push_back(&s);
  const KtoBatch batch = collate_kto(block, kl_rows, 0);
  const Json& padded = kto.at("padded");
  expect_trl_batch(batch.completions, padded.at("completion_input_ids"), padded.at("completion_attention_mask"),
                   padded.at("completion_labels"), "completions");
  expect_trl_batch(batch.kl, padded.at("KL_completion_input_ids"), padded.at("KL_completion_attention_mask"),
                   padded.at("KL_completion_labels"), "KL");
  EXPECT_TRUE(at::equal(batch.desirable, at::tensor(std::vector<int64_t>{1, 0, 1, 0}).to(at::kBool)));

  EXPECT_FALSE(collate_kto(block, {}, 0).kl.input_ids.defined());
  EXPECT_THROW(collate_kto(block, {kl_rows[0]}, 0), ConfigError);
  EXPECT_THROW(kto_kl_samples({block[0]}, o), ConfigError);  // TRL refuses a KL term for batch size 1
}

// A KL row longer than max_length: with "delete" the prompt stays whole and the completion keeps its start.
TEST(PrefDataBatch, KtoKlRowsFitMaxLength) {
  const auto example = [](int32_t prompt_len, int32_t completion_len) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len), 7);
    AnswerTokens completion;
    for (int32_t i = 0; i < completion_len; ++i) completion.ids.push_back(100 + i);
    completion.trained.assign(completion.ids.size(), 1);
    KtoSample k;
    k.completion = join_prompt_answer(prompt, completion);
    k.prompt_length = prompt_len;
    return k;
  };
  const KtoSample a = example(8, 2), b = example(2, 8);  // each fits 10
  PreferenceEncodeOptions o;
  o.max_length = 10;
  const std::vector<Sample> kl = kto_kl_samples({&a, &b}, o);
  EXPECT_EQ(kl[0].input_ids, (std::vector<int32_t>{7, 7, 7, 7, 7, 7, 7, 7, 100, 101}));  // prompt 8 + 2 of 8
  EXPECT_EQ(kl[1].input_ids, (std::vector<int32_t>{7, 7, 100, 101}));
  EXPECT_EQ(kl[0].label_tokens(), 2);
  o.truncation = TruncationStrategy::kLeft;
  o.max_prompt_length = 4;
  const std::vector<Sample> cut = kto_kl_samples({&a, &b}, o);
  EXPECT_EQ(cut[0].input_ids, (std::vector<int32_t>{7, 7, 7, 7, 100, 101, 102, 103, 104, 105}));  // 4 + (10 - 4)
}

// ---------------------------------------------------------------------------------------------------------------
// Pipeline

bool same_pairs(const std::vector<PreferenceSample>& a, const std::vector<PreferenceSample>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].chosen.input_ids != b[i].chosen.input_ids || a[i].chosen.labels != b[i].chosen.labels ||
        a[i].rejected.input_ids != b[i].rejected.input_ids || a[i].rejected.labels != b[i].rejected.labels ||
        a[i].prompt_length != b[i].prompt_length || a[i].margin != b[i].margin) {
      return false;
    }
  }
  return true;
}

TEST(PrefDataPipeline, ThreadsKeepOrderSplitHoldsOutAndTheCacheReloads) {
  const fs::path data = assets() / "data/preference/dpo_en_demo.json";
  SWIFTCPP_REQUIRE_SHARED(data);
  PreferenceEncodeOptions eo;
  eo.max_length = 256;
  eo.max_prompt_length = 128;
  eo.truncation = TruncationStrategy::kLeft;
  const PreferenceEncoder enc(stories_tokenizer(), nullptr, eo);
  DataOptions o;
  o.dataset = {data.string() + "#60"};
  o.dataset_shuffle = false;
  o.num_threads = 1;
  const PreferenceData one = prepare_preference_data(o, enc, "fp");
  o.num_threads = 2;
  const PreferenceData two = prepare_preference_data(o, enc, "fp");
  EXPECT_EQ(one.stats.rows, 60);
  ASSERT_EQ(one.train.size(), 60u);
  EXPECT_TRUE(same_pairs(one.train, two.train));
  for (const auto& p : one.train) {
    EXPECT_LE(p.chosen.input_ids.size(), 256u);
    EXPECT_LE(p.rejected.input_ids.size(), 256u);
  }
  EXPECT_EQ(one.stats.samples, 60);
  int64_t tokens = 0;
  for (const auto& p : one.train) tokens += static_cast<int64_t>(p.chosen.input_ids.size() + p.rejected.input_ids.size());
  EXPECT_EQ(one.stats.tokens, tokens);

  o.cache_dir = temp_dir("pref_cache");
  o.dataset_shuffle = true;
  o.split_dataset_ratio = 0.1;
  const PreferenceData built = prepare_preference_data(o, enc, "fp");
  EXPECT_FALSE(built.stats.from_cache);
  EXPECT_EQ(built.validation.size(), 6u);
  EXPECT_EQ(built.train.size(), 54u);
  const PreferenceData cached = prepare_preference_data(o, enc, "fp");
  EXPECT_TRUE(cached.stats.from_cache);
  EXPECT_TRUE(same_pairs(cached.train, built.train));
  EXPECT_TRUE(same_pairs(cached.validation, built.validation));
  EXPECT_EQ(cached.stats.tokens, built.stats.tokens);
  EXPECT_EQ(cached.stats.rows, 60);
  // Another length setting is another key.
  PreferenceEncodeOptions other = eo;
  other.max_prompt_length = 64;
  EXPECT_FALSE(prepare_preference_data(o, PreferenceEncoder(stories_tokenizer(), nullptr, other), "fp").stats.from_cache);

  // KTO: every pair row is two examples, chosen (desirable) then rejected; a cache of its own kind.
  o.split_dataset_ratio = 0;
  o.dataset = {data.string() + "#40"};
  o.dataset_shuffle = false;
  const KtoData kto = prepare_kto_data(o, enc, "fp");
  ASSERT_EQ(kto.train.size(), 80u);
  for (size_t i = 0; i < 80; ++i) EXPECT_EQ(kto.train[i].desirable, i % 2 == 0) << i;
  EXPECT_EQ(kto.train[2].completion.input_ids, one.train[1].chosen.input_ids);
  EXPECT_EQ(kto.train[3].completion.labels, one.train[1].rejected.labels);
  const KtoData kto_cached = prepare_kto_data(o, enc, "fp");
  EXPECT_TRUE(kto_cached.stats.from_cache);
  ASSERT_EQ(kto_cached.train.size(), 80u);
  for (size_t i = 0; i < 80; ++i) {
    EXPECT_EQ(kto_cached.train[i].completion.input_ids, kto.train[i].completion.input_ids);
    EXPECT_EQ(kto_cached.train[i].completion.labels, kto.train[i].completion.labels);
    EXPECT_EQ(kto_cached.train[i].prompt_length, kto.train[i].prompt_length);
    EXPECT_EQ(kto_cached.train[i].desirable, kto.train[i].desirable);
  }
  // The same rows as pairs are a different file.
  EXPECT_FALSE(prepare_preference_data(o, enc, "fp").stats.from_cache);
}

// A cache file that is short, long, of another kind or version, or holds counts beyond its size is rebuilt, never
// trusted or allocated for.
TEST(PrefDataPipeline, DamagedCacheFilesAreRebuilt) {
  const fs::path dir = temp_dir("pref_cache_damaged");
  std::string rows;
  for (int i = 0; i < 6; ++i) {
    rows += fmt::format(R"({{"prompt": "Once upon a time {}", "chosen": "a cat.", "rejected": "a dog.", "margin": {}}})", i, i) + "\n";
  }
  write_file_atomic(dir / "d.jsonl", rows);
  const PreferenceEncoder enc(stories_tokenizer(), nullptr, {});
  DataOptions o;
  o.dataset = {(dir / "d.jsonl").string()};
  o.cache_dir = dir / "cache";
  const PreferenceData built = prepare_preference_data(o, enc, "fp");
  ASSERT_EQ(built.train.size(), 6u);
  EXPECT_TRUE(prepare_preference_data(o, enc, "fp").stats.from_cache);
  fs::path file;
  for (const auto& entry : fs::directory_iterator(o.cache_dir)) file = entry.path();
  const std::string bytes = read_text_file(file);
  const auto check_rebuilt = [&](const std::string& damaged, const std::string& what) {
    write_file_atomic(file, damaged);
    const PreferenceData again = prepare_preference_data(o, enc, "fp");
    EXPECT_FALSE(again.stats.from_cache) << what;
    EXPECT_TRUE(same_pairs(again.train, built.train)) << what;
  };
  check_rebuilt(bytes.substr(0, bytes.size() - 5), "truncated");
  check_rebuilt(bytes + "x", "trailing byte");
  check_rebuilt("SWDCACH2" + bytes.substr(8), "an SFT cache's magic");
  // The pair count (after the magic, the stats JSON and the empty image manifest) and the first prompt length.
  uint64_t json_len = 0;
  std::memcpy(&json_len, bytes.data() + 8, 8);
  const size_t count_at = 16 + json_len + 8;
  uint64_t count = 0;
  std::memcpy(&count, bytes.data() + count_at, 8);
  ASSERT_EQ(count, 6u);
  for (const uint64_t huge : {uint64_t{1} << 40, ~uint64_t{0}}) {
    std::string damaged = bytes;
    std::memcpy(damaged.data() + count_at, &huge, 8);
    check_rebuilt(damaged, "huge count");
    damaged = bytes;
    std::memcpy(damaged.data() + count_at + 8, &huge, 8);
    check_rebuilt(damaged, "huge prompt length");
  }
}

TEST(PrefDataPipeline, StrictStopsAtTheFirstBadRowOtherwiseCountsByReason) {
  const fs::path dir = temp_dir("pref_bad");
  write_file_atomic(dir / "d.jsonl",
                    R"({"prompt": "a", "chosen": "b", "rejected": "c"})" "\n"
                    R"({"prompt": "a", "chosen": "b"})" "\n"
                    "{broken\n"
                    R"({"prompt": "a", "chosen": "b", "rejected": ""})" "\n"
                    R"({"prompt": "Once upon a time there was a girl", "chosen": "b", "rejected": "c"})" "\n"
                    R"({"prompt": "d", "chosen": "e", "rejected": "f"})" "\n");
  PreferenceEncodeOptions eo;
  eo.max_length = 6;
  const PreferenceEncoder enc(stories_tokenizer(), nullptr, eo);
  DataOptions o;
  o.dataset = {(dir / "d.jsonl").string()};
  try {
    prepare_preference_data(o, enc, "fp");
    FAIL() << "strict mode accepted a bad row";
  } catch (const BadRowError& e) {
    EXPECT_NE(std::string(e.what()).find("d.jsonl:2: no rejected answer"), std::string::npos) << e.what();
  }
  o.strict = false;
  const PreferenceData data = prepare_preference_data(o, enc, "fp");
  EXPECT_EQ(data.stats.rows, 6);
  EXPECT_EQ(data.train.size(), 2u);
  EXPECT_EQ(data.stats.skipped.summary(),
            "4 rows skipped: 1 empty rejected answer, 1 invalid JSON, 1 longer than max_length or nothing to train, "
            "1 no rejected answer");
  const KtoData kto = prepare_kto_data(o, enc, "fp");  // the pair rows split; the row without either is refused
  EXPECT_EQ(kto.train.size(), 4u);
  EXPECT_EQ(kto.stats.skipped.by_reason.at("KTO row without a boolean label"), 1);
}

}  // namespace
}  // namespace swiftcpp
