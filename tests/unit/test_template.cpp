// Chat templates: every family rendered byte for byte against Python jinja2's render of the Hugging Face
// template (tests/data/chat_templates/fixtures.json, made by scripts/make_template_fixtures.py), errors where the
// Jinja template raises, trainable segments, and template detection from checkpoint folders.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "template/template.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using nlohmann::json;

fs::path fixtures_dir() { return test::source_dir() / "tests" / "data" / "chat_templates"; }
fs::path shared_templates() { return test::assets() / "chat_templates"; }

std::vector<ChatMessage> to_messages(const json& list) {
  std::vector<ChatMessage> messages;
  for (const json& m : list) {
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>(), {}});
  }
  return messages;
}

ChatMessage user(std::string content) { return {"user", std::move(content), {}}; }
ChatMessage assistant(std::string content) { return {"assistant", std::move(content), {}}; }
ChatMessage system(std::string content) { return {"system", std::move(content), {}}; }

std::vector<std::string> trainable_texts(const std::vector<TemplateSegment>& segments) {
  std::vector<std::string> texts;
  for (const TemplateSegment& s : segments) {
    if (s.trainable) texts.push_back(s.text);
  }
  return texts;
}

// Segments are never empty and neighbours always differ in their flag.
void expect_well_formed(const std::vector<TemplateSegment>& segments, const std::string& context) {
  for (size_t i = 0; i < segments.size(); ++i) {
    EXPECT_FALSE(segments[i].text.empty()) << context << ": segment " << i << " is empty";
    if (i > 0) {
      EXPECT_NE(segments[i].trainable, segments[i - 1].trainable) << context << ": segment " << i;
    }
  }
}

std::string thrown_config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

json load_fixtures() { return json::parse(read_text_file(fixtures_dir() / "fixtures.json")); }

TEST(ChatTemplate, FixturesCoverEveryTemplate) {
  const json fixtures = load_fixtures();
  std::vector<std::string> families;
  for (const auto& item : fixtures.items()) families.push_back(item.key());
  EXPECT_EQ(families.size(), chat_template_names().size());
  for (const std::string& name : chat_template_names()) {
    EXPECT_TRUE(fixtures.contains(name)) << name << " has no fixtures; run scripts/make_template_fixtures.py";
  }
}

// The core check: every case of every family, byte for byte, and the errors where the Jinja template raises.
TEST(ChatTemplate, RendersEveryFixtureByteForByte) {
  const json fixtures = load_fixtures();
  int rendered = 0;
  int raised = 0;
  for (const auto& [family, cases] : fixtures.items()) {
    const auto chat_template = make_chat_template(family);
    EXPECT_EQ(chat_template->name(), family);
    for (const json& c : cases) {
      const std::string context = family + "/" + c.at("name").get<std::string>() +
                                  (c.at("add_generation_prompt").get<bool>() ? " +gen" : "");
      const auto messages = to_messages(c.at("messages"));
      const bool gen = c.at("add_generation_prompt").get<bool>();
      if (c.contains("expected")) {
        const auto segments = chat_template->render(messages, gen);
        std::string text;
        for (const TemplateSegment& s : segments) text += s.text;
        EXPECT_EQ(text, c.at("expected").get<std::string>()) << context;
        EXPECT_EQ(chat_template->render_text(messages, gen), text) << context;
        expect_well_formed(segments, context);
        ++rendered;
      } else {
        const std::string error = thrown_config_error([&] { chat_template->render(messages, gen); });
        EXPECT_NE(error.find(c.at("error").get<std::string>()), std::string::npos) << context << ": " << error;
        EXPECT_NE(error.find("'" + family + "'"), std::string::npos) << context << ": " << error;
        ++raised;
      }
    }
  }
  EXPECT_GT(rendered, 250);
  EXPECT_GT(raised, 30);
}

// Trainable: each assistant turn's content (as the family renders it: trimmed for llama3/gemma, stripped for
// llama2, after the space that follows "[/INST]") and its end-of-turn marker; nothing else.
TEST(ChatTemplate, TrainableSegmentsAreAssistantContentAndEndOfTurn) {
  const std::vector<ChatMessage> conversation = {user("Hi"), assistant(" Yo "), user("Q"), assistant("A")};
  const std::map<std::string, std::vector<std::string>> expected = {
      {"chatml", {" Yo <|im_end|>", "A<|im_end|>"}},
      {"qwen2", {" Yo <|im_end|>", "A<|im_end|>"}},
      {"qwen2_5", {" Yo <|im_end|>", "A<|im_end|>"}},
      {"llama3", {"Yo<|eot_id|>", "A<|eot_id|>"}},
      {"llama2", {" Yo </s>", " A </s>"}},
      {"mistral", {" Yo </s>", "A</s>"}},
      {"gemma", {"Yo<end_of_turn>", "A<end_of_turn>"}},
      {"phi3", {" Yo <|end|>", "A<|end|>"}},
      {"llava", {"  Yo </s>", " A</s>"}},
      {"default", {" Yo ", "A"}},
      {"raw", {" Yo ", "A"}},
  };
  ASSERT_EQ(expected.size(), chat_template_names().size());
  for (const std::string& name : chat_template_names()) {
    for (bool gen : {false, true}) {
      const auto segments = make_chat_template(name)->render(conversation, gen);
      expect_well_formed(segments, name);
      EXPECT_EQ(trainable_texts(segments), expected.at(name)) << name << (gen ? " +gen" : "");
    }
  }
}

TEST(ChatTemplate, SystemUserAndGenerationPromptAreNeverTrainable) {
  for (const std::string& name : chat_template_names()) {
    const auto chat_template = make_chat_template(name);
    const bool system_ok = name != "gemma" && name != "mistral";
    std::vector<ChatMessage> prompt;
    if (system_ok) prompt.push_back(system("Be kind."));
    prompt.push_back(user("Hello"));
    const auto segments = chat_template->render(prompt, true);
    EXPECT_TRUE(trainable_texts(segments).empty()) << name;
  }
}

// What inference renders (the conversation + generation prompt) is the start of what training renders once the
// answer is appended, and the answer begins right where the prompt ends.
TEST(ChatTemplate, GenerationPromptIsPrefixOfTrainedConversation) {
  for (const std::string& name : chat_template_names()) {
    const auto chat_template = make_chat_template(name);
    const std::vector<ChatMessage> prompt = {user("What is 2+2?"), assistant("4"), user("And 3+3?")};
    std::vector<ChatMessage> answered = prompt;
    answered.push_back(assistant("6"));
    const std::string inference = chat_template->render_text(prompt, true);
    const auto training = chat_template->render(answered, false);
    std::string text;
    size_t last_trainable_start = 0;
    for (const TemplateSegment& s : training) {
      if (s.trainable) last_trainable_start = text.size();
      text += s.text;
    }
    EXPECT_EQ(text.substr(0, inference.size()), inference) << name;
    EXPECT_EQ(last_trainable_start, inference.size()) << name;
  }
}

TEST(ChatTemplate, LossFalseExcludesAnAssistantTurn) {
  std::vector<ChatMessage> conversation = {user("Hi"), assistant("Skip me"), user("Q"), assistant("Train me")};
  conversation[1].loss = false;
  conversation[3].loss = true;
  const auto segments = make_chat_template("chatml")->render(conversation, false);
  EXPECT_EQ(trainable_texts(segments), std::vector<std::string>{"Train me<|im_end|>"});
  EXPECT_EQ(make_chat_template("chatml")->render_text(conversation, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSkip me<|im_end|>\n"
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nTrain me<|im_end|>\n");
}

TEST(ChatTemplate, LossOnOtherRoles) {
  std::vector<ChatMessage> conversation = {user("Hi"), assistant("Yo")};
  conversation[0].loss = false;  // accepted: user turns are never trained
  EXPECT_EQ(trainable_texts(make_chat_template("llama3")->render(conversation, false)),
            std::vector<std::string>{"Yo<|eot_id|>"});
  conversation[0].loss = true;
  const std::string error = thrown_config_error([&] { make_chat_template("llama3")->render(conversation, false); });
  EXPECT_NE(error.find("message 0"), std::string::npos) << error;
  EXPECT_NE(error.find("loss"), std::string::npos) << error;
}

TEST(ChatTemplate, RejectsEmptyConversationsAndToolRoles) {
  for (const std::string& name : chat_template_names()) {
    const auto chat_template = make_chat_template(name);
    EXPECT_NE(thrown_config_error([&] { chat_template->render({}, true); }).find("no messages"), std::string::npos)
        << name;
    const std::string error =
        thrown_config_error([&] { chat_template->render({user("Hi"), {"tool", "42", {}}}, false); });
    EXPECT_NE(error.find("role 'tool'"), std::string::npos) << name << ": " << error;
  }
}

TEST(ChatTemplate, UnknownNameListsTheKnownOnes) {
  const std::string error = thrown_config_error([] { make_chat_template("vicuna"); });
  EXPECT_NE(error.find("vicuna"), std::string::npos) << error;
  for (const std::string& name : chat_template_names()) EXPECT_NE(error.find(name), std::string::npos) << error;
}

TEST(ChatTemplate, NamesAreTheDocumentedList) {
  EXPECT_EQ(chat_template_names(), (std::vector<std::string>{"chatml", "qwen2", "qwen2_5", "llama3", "llama2",
                                                             "mistral", "gemma", "phi3", "llava", "default",
                                                             "raw"}));
}

TEST(ChatTemplate, TokensOverrideTheFamilyBosAndEos) {
  const std::vector<ChatMessage> conversation = {system("S"), user("U"), assistant("A")};
  const auto plain = make_chat_template("default");
  EXPECT_EQ(plain->render_text(conversation, false), "S\n\n### User:\nU\n\n### Assistant:\nA\n\n");
  const auto with_tokens = make_chat_template("default", {"<s>", "</s>"});
  const auto segments = with_tokens->render(conversation, false);
  EXPECT_EQ(with_tokens->render_text(conversation, false), "<s>S\n\n### User:\nU\n\n### Assistant:\nA</s>\n\n");
  EXPECT_EQ(trainable_texts(segments), std::vector<std::string>{"A</s>"});

  EXPECT_EQ(make_chat_template("raw", {"<s>", "</s>"})->render_text({user("Once upon"), assistant(" a time")}, false),
            "<s>Once upon a time</s>");
  EXPECT_EQ(make_chat_template("raw")->render_text({user("Once upon a time")}, true), "Once upon a time");
  TemplateTokens only_eos;
  only_eos.eos_token = "<|eos|>";
  EXPECT_EQ(make_chat_template("llama2", only_eos)->render_text({user("U"), assistant("A")}, false),
            "<s>[INST] U [/INST] A <|eos|>");
}

// Contents are UTF-8 but not necessarily valid: trimming never splits or drops a malformed byte.
TEST(ChatTemplate, TrimLeavesMalformedUtf8Alone) {
  const std::string content = "\xff abc \xe3";
  EXPECT_EQ(make_chat_template("gemma")->render_text({user(content)}, false),
            "<bos><start_of_turn>user\n" + content + "<end_of_turn>\n");
  EXPECT_EQ(make_chat_template("gemma")->render_text({user(" \xe3\x80\x80x\xc2\xa0\xe2\x80\x80 ")}, false),
            "<bos><start_of_turn>user\nx<end_of_turn>\n");
}

// ---------------------------------------------------------------------------------------------------------
// detect_chat_template

fs::path folder_with_config(const std::string& name, const json& config) {
  const fs::path dir = test::temp_dir("chat_template_" + name);
  write_file_atomic(dir / "tokenizer_config.json", config.dump(2));
  return dir;
}

std::string detect_from_template(const std::string& name, const std::string& chat_template) {
  return detect_chat_template(folder_with_config(name, {{"eos_token", "</s>"}, {"chat_template", chat_template}}));
}

TEST(ChatTemplateDetect, RealTemplates) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2_5"},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"},
      {"google-gemma-2-2b-it.jinja", "gemma"},
      {"microsoft-Phi-3.5-mini-instruct.jinja", "phi3"},
  };
  for (const auto& [file, expected] : cases) {
    const fs::path path = shared_templates() / file;
    SWIFTCPP_REQUIRE_SHARED(path);
    EXPECT_EQ(detect_from_template(expected, read_text_file(path)), expected) << file;
  }
}

TEST(ChatTemplateDetect, FormatFixtures) {
  for (const std::string name : {"chatml", "qwen2", "llama2", "mistral", "llava"}) {
    EXPECT_EQ(detect_from_template(name, read_text_file(fixtures_dir() / (name + ".jinja"))), name);
  }
}

TEST(ChatTemplateDetect, ListFormUsesTheDefaultEntry) {
  const std::string chatml = read_text_file(fixtures_dir() / "chatml.jinja");
  const std::string mistral = read_text_file(fixtures_dir() / "mistral.jinja");
  const json list =
      json::array({{{"name", "tool_use"}, {"template", mistral}}, {{"name", "default"}, {"template", chatml}}});
  EXPECT_EQ(detect_chat_template(folder_with_config("list", {{"chat_template", list}})), "chatml");

  const json no_default = json::array({{{"name", "tool_use"}, {"template", mistral}}});
  const fs::path dir = folder_with_config("list_no_default", {{"chat_template", no_default}});
  const std::string error = thrown_config_error([&] { detect_chat_template(dir); });
  EXPECT_NE(error.find("tool_use"), std::string::npos) << error;
  EXPECT_NE(error.find("--template"), std::string::npos) << error;

  EXPECT_THROW(detect_chat_template(folder_with_config("list_bad", {{"chat_template", 3}})), ConfigError);
}

TEST(ChatTemplateDetect, SeparateTemplateFilesWin) {
  const fs::path dir = folder_with_config("separate", {{"chat_template", read_text_file(fixtures_dir() / "mistral.jinja")}});
  write_file_atomic(dir / "chat_template.json", json{{"chat_template", read_text_file(fixtures_dir() / "llama2.jinja")}}.dump());
  EXPECT_EQ(detect_chat_template(dir), "llama2");
  write_file_atomic(dir / "chat_template.jinja", read_text_file(fixtures_dir() / "qwen2.jinja"));
  EXPECT_EQ(detect_chat_template(dir), "qwen2");
}

TEST(ChatTemplateDetect, UnknownTemplateIsAConfigError) {
  const std::string zephyr = "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] "
                             "+ eos_token }}{% endfor %}";
  const std::string error = thrown_config_error([&] { detect_from_template("unknown", zephyr); });
  EXPECT_NE(error.find("tokenizer_config.json"), std::string::npos) << error;
  EXPECT_NE(error.find("--template NAME"), std::string::npos) << error;
  EXPECT_NE(error.find("chatml"), std::string::npos) << error;
}

TEST(ChatTemplateDetect, RecognisablyDifferentVariantsAreRejected) {
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"qwen3", "{{- '<|im_start|>' + message.role }}{{- '<think>\\n\\n</think>\\n\\n' }}"},
      {"llama3_0", "{{ bos_token + '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"},
      {"gemma3", "{%- set first_user_prefix = messages[0]['content'] %}{{ '<start_of_turn>' + role }}"},
      {"other_chatml", "{{ '<|im_start|>system\\nYou are a pirate.<|im_end|>\\n' }}"},
      {"mistral_v3", "{{ bos_token }}{{ '[AVAILABLE_TOOLS] [INST] ' + message['content'] + '[/INST]' }}"},
  };
  for (const auto& [name, text] : variants) {
    EXPECT_THROW(detect_from_template(name, text), ConfigError) << name;
  }
}

TEST(ChatTemplateDetect, NoTemplateMeansRawText) {
  EXPECT_EQ(detect_chat_template(test::stories_dir()), "");
  EXPECT_EQ(detect_chat_template(test::temp_dir("chat_template_empty_folder")), "");
  EXPECT_EQ(detect_chat_template(folder_with_config("null", {{"chat_template", nullptr}})), "");
  EXPECT_THROW(detect_chat_template(test::temp_dir("chat_template_gone") / "missing"), IoError);
}

}  // namespace
}  // namespace swiftcpp
