#include "data/preference_data.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "data/prepare.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

PreferenceTask preference_task_for(const std::string& rlhf_type) {
  if (rlhf_type == "dpo" || rlhf_type == "orpo" || rlhf_type == "cpo" || rlhf_type == "simpo" || rlhf_type == "rm") {
    return PreferenceTask::kPairs;
  }
  if (rlhf_type == "kto") return PreferenceTask::kKto;
  fail<ConfigError>("rlhf_type '{}' is not one of dpo, orpo, cpo, simpo, rm, kto", rlhf_type);
}

namespace {

// The largest |margin| a reward-model row may carry.
constexpr double kMaxMargin = 1e4;

[[noreturn]] void bad(const std::string& where, const std::string& reason, const std::string& detail = "") {
  throw BadRowError(where, reason, detail);
}

bool has(const Json& row, const char* key) { return row.contains(key) && !row.at(key).is_null(); }

bool is_assistant_role(const std::string& role) { return role == "assistant" || role == "gpt" || role == "model"; }

// An answer given on its own: a string, a message ({"role", "content"} or {"from", "value"}) of the assistant, or a
// list holding one such message (TRL's conversational form).
std::string answer_text(const Json& value, const std::string& key, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array() && value.size() == 1) return answer_text(value[0], key, where);
  if (value.is_object()) {
    const char* role_key = value.contains("role") ? "role" : "from";
    if (value.contains(role_key)) {
      const Json& role = value.at(role_key);
      if (!role.is_string()) bad(where, "unknown format", fmt::format("'{}' has a non-string '{}'", key, role_key));
      if (!is_assistant_role(role.get<std::string>())) {
        bad(where, "wrong role order",
            fmt::format("'{}' is a '{}' message; an answer is the assistant's", key, role.get<std::string>()));
      }
    }
    const char* text_key = value.contains("content") ? "content" : "value";
    if (!value.contains(text_key)) bad(where, "unknown format", fmt::format("'{}' needs a 'content' or 'value'", key));
    if (!value.at(text_key).is_string()) {
      bad(where, "non-string content", fmt::format("'{}' {} is {}", key, text_key, describe_json(value.at(text_key))));
    }
    return value.at(text_key).get<std::string>();
  }
  bad(where, "non-string content",
      fmt::format("'{}' must be a string or an assistant message, got {}", key, describe_json(value)));
}

// A message list's last entry is a user turn ({"role": "user"} / {"from": "human"}).
bool ends_with_user_turn(const Json& list) {
  if (!list.is_array() || list.empty() || !list.back().is_object()) return false;
  const Json& last = list.back();
  for (const char* key : {"role", "from"}) {
    if (last.contains(key) && last.at(key).is_string()) {
      const std::string role = last.at(key).get<std::string>();
      return role == "user" || role == "human";
    }
  }
  return false;
}

// The key an SFT row holds a message list under: ShareGPT turns ("from"/"value") or messages ("role"/"content").
const char* list_key_for(const Json& list) {
  if (list.is_array() && !list.empty() && list[0].is_object() && list[0].contains("from")) return "conversations";
  return "messages";
}

Json answer_message(const char* list_key, const std::string& text) {
  if (std::strcmp(list_key, "conversations") == 0) return Json{{"from", "gpt"}, {"value", text}};
  return Json{{"role", "assistant"}, {"content", text}};
}

void copy_keys(const Json& from, Json& to, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (from.contains(key)) to[key] = from.at(key);
  }
}

}  // namespace

PreferenceRow normalise_preference_row(const Json& row, const std::string& where, PreferenceTask task,
                                       const std::optional<std::string>& system_override, const fs::path& base_dir) {
  if (!row.is_object()) bad(where, "unknown format", std::string("a row must be a JSON object, got ") + row.type_name());
  refuse_unsupported_columns(row, where);
  const char* rejected_key = nullptr;
  for (const char* key : {"rejected_messages", "rejected_response", "rejected"}) {
    if (!has(row, key)) continue;
    if (rejected_key != nullptr) bad(where, "unknown format", fmt::format("both '{}' and '{}' given", rejected_key, key));
    rejected_key = key;
  }

  // The chosen conversation, as an SFT row that normalise_row checks.
  Json sft = Json::object();
  copy_keys(row, sft, {"system", "history", "images"});
  const bool prompt_is_list = has(row, "prompt") && row.at("prompt").is_array();
  if (row.contains("messages") || row.contains("conversations") || prompt_is_list) {
    const char* source_key = row.contains("messages") ? "messages" : row.contains("conversations") ? "conversations"
                                                                                                    : "prompt";
    Json list = row.at(source_key);
    const char* list_key = source_key == std::string("prompt") ? list_key_for(list) : source_key;
    if (has(row, "chosen")) {
      if (!list.is_array()) bad(where, "unknown format", fmt::format("'{}' must be a list", source_key));
      list.push_back(answer_message(list_key, answer_text(row.at("chosen"), "chosen", where)));
    } else if (ends_with_user_turn(list)) {
      bad(where, "no chosen answer", fmt::format("'{}' ends with a user turn and there is no 'chosen'", source_key));
    }
    sft[list_key] = std::move(list);
  } else if (row.contains("prompt") || row.contains("query") || row.contains("instruction")) {
    const char* chosen_key = nullptr;
    for (const char* key : {"chosen", "response", "completion", "output"}) {
      if (has(row, key)) {
        chosen_key = key;
        break;
      }
    }
    if (chosen_key == nullptr) bad(where, "no chosen answer", "expected 'chosen', 'response', 'completion' or 'output'");
    const std::string chosen = answer_text(row.at(chosen_key), chosen_key, where);
    if (row.contains("instruction")) {
      copy_keys(row, sft, {"instruction", "input"});
      sft["output"] = chosen;
    } else {
      sft["query"] = row.contains("prompt") ? row.at("prompt") : row.at("query");
      sft["response"] = chosen;
    }
  } else {
    std::string keys;
    for (auto it = row.begin(); it != row.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
    bad(where, "unknown format",
        "keys {" + keys + "}; expected messages, conversations (with chosen), prompt/query or instruction with "
        "chosen and rejected answers");
  }
  const Conversation chosen = normalise_row(sft, where, system_override, base_dir);

  PreferenceRow out;
  out.where = where;
  out.prompt.assign(chosen.messages.begin(), chosen.messages.end() - 1);
  out.chosen = chosen.messages.back().content;
  out.images = chosen.images;

  if (rejected_key != nullptr && std::strcmp(rejected_key, "rejected_messages") == 0) {
    const Json& list = row.at("rejected_messages");
    Json rejected_row = Json::object();
    copy_keys(row, rejected_row, {"system", "images"});
    rejected_row[list_key_for(list)] = list;
    const Conversation rejected = normalise_row(rejected_row, where, system_override, base_dir);
    if (rejected.images != out.images) {
      bad(where, "rejected_messages images differ",
          fmt::format("the prompt has {} image(s) in 'messages' and {} in 'rejected_messages', or other files",
                      out.images.size(), rejected.images.size()));
    }
    const size_t n = rejected.messages.size() - 1;
    for (size_t i = 0; i < std::max(n, out.prompt.size()); ++i) {
      if (i >= n || i >= out.prompt.size()) {
        bad(where, "rejected_messages prompt differs",
            fmt::format("the prompt has {} message(s) in 'messages' and {} in 'rejected_messages'", out.prompt.size(),
                        n));
      }
      if (rejected.messages[i].role != out.prompt[i].role || rejected.messages[i].content != out.prompt[i].content) {
        bad(where, "rejected_messages prompt differs", fmt::format("message {} differs", i));
      }
    }
    out.rejected = rejected.messages.back().content;
  } else if (rejected_key != nullptr) {
    out.rejected = answer_text(row.at(rejected_key), rejected_key, where);
    if (!out.images.empty() && count_image_placeholders(*out.rejected) > 0) {
      bad(where, "image in an assistant message", fmt::format("'{}' holds {}", rejected_key, kImagePlaceholder));
    }
  }

  if (task == PreferenceTask::kKto) {
    if (has(row, "label")) {
      const Json& label = row.at("label");
      if (!label.is_boolean()) bad(where, "KTO row without a boolean label", "'label' is " + describe_json(label));
      if (out.rejected) bad(where, "label and rejected answer both given", "a KTO row has one completion");
      out.desirable = label.get<bool>();
    } else if (!out.rejected) {
      bad(where, "KTO row without a boolean label",
          "a KTO row needs 'label': true or false (a pair row with a rejected answer gives two examples)");
    }
  } else if (!out.rejected) {
    bad(where, "no rejected answer",
        has(row, "label") ? "a row with a 'label' is a KTO row (rlhf_type kto)"
                          : "expected 'rejected_response', 'rejected_messages' or 'rejected'");
  }

  if (has(row, "margin")) {
    const Json& margin = row.at("margin");
    // A margin is a difference of rewards (a few units); past 1e4 the loss overflows to inf in float32.
    if (!margin.is_number() || !std::isfinite(margin.get<double>()) || std::abs(margin.get<double>()) > kMaxMargin) {
      bad(where, "bad margin", "'margin' must be a finite number in [-1e4, 1e4], got " + describe_json(margin));
    }
    out.margin = margin.get<double>();
  }
  if (out.chosen.empty()) bad(where, out.desirable ? "empty completion" : "empty chosen answer");
  if (out.rejected && out.rejected->empty()) bad(where, "empty rejected answer");
  return out;
}

PreferenceCut cut_preference_lengths(int64_t prompt, const std::vector<int64_t>& answers,
                                     const PreferenceEncodeOptions& options) {
  PreferenceCut cut;
  cut.prompt_end = prompt;
  cut.answers = answers;
  const int64_t longer = answers.empty() ? 0 : *std::max_element(answers.begin(), answers.end());
  const int64_t limit = options.max_length;
  if (prompt + longer <= limit) return cut;
  if (options.truncation == TruncationStrategy::kDelete) {
    cut.keep = false;
    return cut;
  }
  const int64_t max_prompt = options.max_prompt_length;
  if (prompt > max_prompt) {
    if (options.truncation == TruncationStrategy::kLeft) {
      cut.prompt_begin = prompt - max_prompt;  // keep_end
    } else {
      cut.prompt_end = max_prompt;  // keep_start
    }
  }
  if (cut.prompt_end - cut.prompt_begin + longer > limit) {
    for (int64_t& a : cut.answers) a = std::min(a, limit - max_prompt);
  }
  return cut;
}

Sample join_prompt_answer(const std::vector<int32_t>& prompt, const AnswerTokens& answer) {
  if (answer.ids.size() != answer.trained.size()) {
    fail<ConfigError>("an answer of {} ids has {} trained flags", answer.ids.size(), answer.trained.size());
  }
  Sample s;
  s.input_ids = prompt;
  s.input_ids.insert(s.input_ids.end(), answer.ids.begin(), answer.ids.end());
  s.labels.assign(s.input_ids.size(), kIgnoreIndex);
  const size_t p = prompt.size();
  for (size_t k = 0; k < answer.ids.size(); ++k) {
    if (answer.trained[k] && p + k >= 1) s.labels[p + k - 1] = answer.ids[k];
  }
  return s;
}

AnswerTokens answer_of(const Sample& sample, int64_t prompt_length) {
  const auto n = static_cast<int64_t>(sample.input_ids.size());
  if (prompt_length < 0 || prompt_length > n) {
    fail<ConfigError>("a prompt of {} ids in a sample of {}", prompt_length, n);
  }
  AnswerTokens a;
  a.ids.assign(sample.input_ids.begin() + prompt_length, sample.input_ids.end());
  for (int64_t t = prompt_length; t < n; ++t) {
    a.trained.push_back(t >= 1 && sample.labels[static_cast<size_t>(t - 1)] != kIgnoreIndex ? 1 : 0);
  }
  return a;
}

namespace {

EncodeOptions last_round_unlimited() {
  EncodeOptions o;
  o.max_length = std::numeric_limits<int64_t>::max();
  o.loss_scale = LossScale::kLastRound;
  return o;
}

std::vector<int32_t> to_int32(const std::vector<int>& ids) { return {ids.begin(), ids.end()}; }

// The kept parts of a prompt and one answer: the sample, or nullopt when nothing is trained.
std::optional<Sample> cut_sample(const std::vector<int32_t>& prompt, const PreferenceCut& cut, size_t answer_index,
                                 const AnswerTokens& answer) {
  const std::vector<int32_t> kept_prompt(prompt.begin() + cut.prompt_begin, prompt.begin() + cut.prompt_end);
  AnswerTokens kept = answer;
  const auto n = static_cast<size_t>(cut.answers[answer_index]);
  kept.ids.resize(n);
  kept.trained.resize(n);
  Sample s = join_prompt_answer(kept_prompt, kept);
  if (s.label_tokens() == 0) return std::nullopt;
  return s;
}

}  // namespace

PreferenceEncoder::PreferenceEncoder(std::shared_ptr<const TextTokenizer> tokenizer,
                                     std::shared_ptr<const ChatTemplate> chat_template, PreferenceEncodeOptions options)
    : sft_(std::move(tokenizer), std::move(chat_template), last_round_unlimited()), options_(std::move(options)) {
  if (options_.max_length < 2) fail<ConfigError>("max_length must be >= 2, got {}", options_.max_length);
  if (options_.images) {  // checks the settings against the tokenizer as SFT does
    EncodeOptions media = last_round_unlimited();
    media.images = options_.images;
    media_.emplace(sft_.tokenizer(), sft_.chat_template(), std::move(media));
  }
  if (options_.truncation != TruncationStrategy::kDelete &&
      (options_.max_prompt_length < 1 || options_.max_prompt_length >= options_.max_length)) {
    fail<ConfigError>("max_prompt_length must be in [1, max_length = {}) with truncation_strategy left or right (the "
                      "prompt is cut to it first), got {}",
                      options_.max_length, options_.max_prompt_length);
  }
}

std::vector<int32_t> PreferenceEncoder::encode_prompt(const std::vector<ChatMessage>& prompt,
                                                      const std::string& where) const {
  if (!sft_.chat_template()) {
    std::string text;
    for (size_t i = 0; i < prompt.size(); ++i) text += (i > 0 ? "\n" : "") + prompt[i].content;
    return to_int32(tokenize_rendered(*sft_.tokenizer(), text));
  }
  try {
    return to_int32(sft_.encode_prompt(prompt));
  } catch (const ConfigError& e) {
    throw BadRowError(where, "rejected by the chat template", e.what());
  }
}

AnswerTokens PreferenceEncoder::encode_answer(const std::vector<ChatMessage>& prompt,
                                              const std::vector<int32_t>& prompt_ids, const std::string& answer,
                                              const std::string& where) const {
  const TextTokenizer& tokenizer = *sft_.tokenizer();
  AnswerTokens out;
  const auto append = [&](const std::string& text, bool trained) {
    for (int id : tokenizer.encode_with_special_tokens(text)) {
      out.ids.push_back(id);
      out.trained.push_back(trained ? 1 : 0);
    }
  };
  if (!sft_.chat_template()) {  // raw text: the answer on its own, then EOS
    append(answer, true);
    if (!tokenizer.specials().eos.empty()) {
      out.ids.push_back(tokenizer.specials().eos.front());
      out.trained.push_back(1);
    }
    return out;
  }
  Conversation c;
  c.where = where;
  c.messages = prompt;
  c.messages.push_back({"assistant", answer, std::nullopt});
  const std::optional<Sample> full = sft_.encode(c);  // throws BadRowError when the template rejects it
  if (!full) return out;                              // nothing trained
  const size_t p = prompt_ids.size();
  const size_t n = full->input_ids.size();
  bool shared = p >= 1 && n > p && std::equal(prompt_ids.begin(), prompt_ids.end(), full->input_ids.begin());
  for (size_t t = 0; shared && t + 1 < p; ++t) shared = full->labels[t] == kIgnoreIndex;
  if (shared) return answer_of(*full, static_cast<int64_t>(p));

  // The tokenizer merged across the answer's start: the answer's trained text and what follows it, each on its own.
  const std::vector<TemplateSegment> segments = sft_.chat_template()->render(c.messages, false);
  size_t last = segments.size();
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].trainable) last = i;
  }
  size_t first = last;
  while (first > 0 && segments[first - 1].trainable) --first;
  std::string trained, tail;
  for (size_t i = first; i <= last && i < segments.size(); ++i) trained += segments[i].text;
  for (size_t i = last + 1; i < segments.size(); ++i) tail += segments[i].text;
  append(trained, true);
  append(tail, false);
  return out;
}

PreferenceEncoder::Prompt PreferenceEncoder::prompt_of(const PreferenceRow& row) const {
  Prompt p;
  p.messages = row.prompt;
  if (!row.images.empty() && !media_) {
    throw BadRowError(row.where, "images need a vision-language model",
                      fmt::format("the row has {} image(s), the model takes text only", row.images.size()));
  }
  if (media_) {
    for (size_t i = 0; i < p.messages.size(); ++i) {
      media_->refuse_typed_media(p.messages[i].content, row.where, fmt::format("message {}", i));
      p.messages[i].content = with_image_markup(std::move(p.messages[i].content), *options_.images);
    }
  }
  p.ids = encode_prompt(p.messages, row.where);
  if (!media_) {
    p.expanded = p.ids;
    return p;
  }
  const int32_t image_token = options_.images->image_token_id;
  const auto tokens = std::count(p.ids.begin(), p.ids.end(), image_token);
  if (tokens != static_cast<std::ptrdiff_t>(row.images.size())) {
    throw BadRowError(row.where, "image count mismatch",
                      fmt::format("{} image token(s) in the rendered prompt, {} image(s) given", tokens,
                                  row.images.size()));
  }
  for (const fs::path& path : row.images) p.images.push_back(media_->plan_row_image(path, row.where));
  size_t image = 0;
  for (const int32_t id : p.ids) {  // each image token -> its image's run
    if (id != image_token) {
      p.expanded.push_back(id);
      continue;
    }
    const int64_t n = p.images[image++].tokens;
    const auto at = static_cast<int64_t>(p.expanded.size());
    p.runs.push_back({at, at + n});
    p.expanded.insert(p.expanded.end(), static_cast<size_t>(n), id);
  }
  return p;
}

AnswerTokens PreferenceEncoder::answer_of_row(const Prompt& prompt, const std::string& answer,
                                              const PreferenceRow& row) const {
  if (media_) {
    media_->refuse_typed_media(answer, row.where, "an answer");
    if (count_image_placeholders(answer) > 0) {
      throw BadRowError(row.where, "image in an assistant message",
                        fmt::format("an answer holds {}", kImagePlaceholder));
    }
  }
  return encode_answer(prompt.messages, prompt.ids, answer, row.where);
}

void PreferenceEncoder::add_images(const PreferenceRow& row, Prompt& prompt, const PreferenceCut& cut,
                                   Sample& sample) const {
  for (size_t i = 0; i < prompt.runs.size(); ++i) {
    const TokenSpan& run = prompt.runs[i];
    if (run.begin < cut.prompt_begin || run.end > cut.prompt_end) continue;  // cut off whole
    if (prompt.decoded.size() != prompt.images.size()) prompt.decoded.resize(prompt.images.size());
    if (!prompt.decoded[i]) {
      prompt.decoded[i] = media_->process_row_image(prompt.images[i], row.images[i], row.where);
      prompt.images[i] = PlannedImage();  // the file's bytes are no longer needed
    }
    const vision::ProcessedImage& image = *prompt.decoded[i];
    sample.pixel_values.push_back(image.pixel_values);  // [C, H, W] | [patches, C T P P]
    if (options_.images->processor->variable_size()) sample.image_grids.push_back(image.grid_thw);
    sample.image_tokens.push_back(run.end - run.begin);
  }
}

namespace {

// The images (pixels, grids, token counts) of `from` given to `to` as the same tensors.
void share_images(const Sample& from, Sample& to) {
  to.pixel_values = from.pixel_values;
  to.image_grids = from.image_grids;
  to.image_tokens = from.image_tokens;
}

// The cut with its prompt ends moved off image runs (a run cut in part is left out whole).
void keep_whole_runs(const std::vector<TokenSpan>& runs, PreferenceCut& cut) {
  keep_whole_image_runs(runs, cut.prompt_begin, cut.prompt_end);
  cut.prompt_begin = std::min(cut.prompt_begin, cut.prompt_end);
}

}  // namespace

std::optional<PreferenceSample> PreferenceEncoder::encode_pair(const PreferenceRow& row) const {
  if (!row.rejected) throw BadRowError(row.where, "no rejected answer", "a KTO row in a pair task");
  Prompt prompt = prompt_of(row);
  const AnswerTokens chosen = answer_of_row(prompt, row.chosen, row);
  const AnswerTokens rejected = answer_of_row(prompt, *row.rejected, row);
  PreferenceCut cut = cut_preference_lengths(
      static_cast<int64_t>(prompt.expanded.size()),
      {static_cast<int64_t>(chosen.ids.size()), static_cast<int64_t>(rejected.ids.size())}, options_);
  if (!cut.keep) return std::nullopt;  // known before any image is decoded
  keep_whole_runs(prompt.runs, cut);
  std::optional<Sample> c = cut_sample(prompt.expanded, cut, 0, chosen);
  std::optional<Sample> r = cut_sample(prompt.expanded, cut, 1, rejected);
  if (!c || !r) return std::nullopt;
  add_images(row, prompt, cut, *c);
  share_images(*c, *r);
  PreferenceSample s;
  s.chosen = std::move(*c);
  s.rejected = std::move(*r);
  s.prompt_length = cut.prompt_end - cut.prompt_begin;
  s.margin = row.margin.value_or(0.0);
  return s;
}

std::vector<std::optional<KtoSample>> PreferenceEncoder::encode_kto(const PreferenceRow& row) const {
  std::vector<std::pair<const std::string*, bool>> examples;
  if (row.desirable) {
    examples.emplace_back(&row.chosen, *row.desirable);
  } else {
    examples.emplace_back(&row.chosen, true);
    if (row.rejected) examples.emplace_back(&*row.rejected, false);
  }
  Prompt prompt = prompt_of(row);
  std::vector<std::optional<KtoSample>> out;
  for (const auto& [answer, desirable] : examples) {
    const AnswerTokens completion = answer_of_row(prompt, *answer, row);
    PreferenceCut cut = cut_preference_lengths(static_cast<int64_t>(prompt.expanded.size()),
                                               {static_cast<int64_t>(completion.ids.size())}, options_);
    if (cut.keep) keep_whole_runs(prompt.runs, cut);
    std::optional<Sample> s = cut.keep ? cut_sample(prompt.expanded, cut, 0, completion) : std::nullopt;
    if (!s) {
      out.emplace_back();
      continue;
    }
    KtoSample k;
    k.completion = std::move(*s);
    k.prompt_length = cut.prompt_end - cut.prompt_begin;
    k.desirable = desirable;
    add_images(row, prompt, cut, k.completion);
    out.emplace_back(std::move(k));
  }
  return out;
}

std::optional<EncodedPrompt> PreferenceEncoder::encode_generation_prompt(const std::vector<ChatMessage>& prompt,
                                                                     const std::vector<fs::path>& images,
                                                                     const std::string& where, int64_t max_tokens,
                                                                     bool keep_end) const {
  PreferenceRow row;
  row.prompt = prompt;
  row.images = images;
  row.where = where;
  Prompt p = prompt_of(row);
  PreferenceCut cut;
  cut.prompt_end = static_cast<int64_t>(p.expanded.size());
  if (cut.prompt_end > max_tokens) {
    if (!keep_end) return std::nullopt;  // known before any image is decoded
    cut.prompt_begin = cut.prompt_end - max_tokens;
    keep_whole_runs(p.runs, cut);
  }
  if (cut.prompt_begin >= cut.prompt_end) return std::nullopt;
  EncodedPrompt out;
  out.ids.assign(p.expanded.begin() + cut.prompt_begin, p.expanded.begin() + cut.prompt_end);
  Sample decoded;
  add_images(row, p, cut, decoded);
  out.pixel_values = std::move(decoded.pixel_values);
  out.image_grids = std::move(decoded.image_grids);
  return out;
}

std::string PreferenceEncoder::fingerprint() const {
  const char* truncation = options_.truncation == TruncationStrategy::kDelete ? "delete"
                           : options_.truncation == TruncationStrategy::kLeft ? "left"
                                                                               : "right";
  std::string fp = fmt::format("preference;template={};max_length={};max_prompt_length={};truncation={}",
                               sft_.chat_template() ? sft_.chat_template()->name() : "raw", options_.max_length,
                               options_.max_prompt_length, truncation);
  if (options_.images) fp += ";images=" + image_encoding_fingerprint(*options_.images);
  return fp;
}

PreferenceBatch collate_preference(const std::vector<const PreferenceSample*>& pairs, int32_t pad_id) {
  if (pairs.empty()) fail<ConfigError>("a preference batch needs at least one pair");
  std::vector<const Sample*> rows;
  rows.reserve(2 * pairs.size());
  for (const PreferenceSample* p : pairs) rows.push_back(&p->chosen);
  for (const PreferenceSample* p : pairs) rows.push_back(&p->rejected);
  PreferenceBatch out;
  // The chosen rows' images serve the rejected rows too: stacked once, and the rows collated from copies of their
  // ids and labels without images (stacking every row's images would copy each twice, to be dropped).
  out.images = batch_images(std::vector<const Sample*>(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(pairs.size())));
  if (out.images.empty()) {
    out.batch = collate_padded(rows, pad_id);  // [2B, T]
  } else {
    std::vector<Sample> ids_only(rows.size());
    std::vector<const Sample*> stripped;
    for (size_t i = 0; i < rows.size(); ++i) {
      ids_only[i].input_ids = rows[i]->input_ids;
      ids_only[i].labels = rows[i]->labels;
      stripped.push_back(&ids_only[i]);
    }
    out.batch = collate_padded(stripped, pad_id);  // [2B, T], no pixels
    if (out.images.image_grid_thw.defined()) {     // every row's grids: the chosen rows', then the same again
      out.batch.image_grid_thw = at::cat({out.images.image_grid_thw, out.images.image_grid_thw});  // [2N, 3]
    }
  }
  out.margin = at::empty({static_cast<int64_t>(pairs.size())}, at::kFloat);  // [B]
  for (size_t i = 0; i < pairs.size(); ++i) out.margin[static_cast<int64_t>(i)] = pairs[i]->margin;
  return out;
}

std::vector<Sample> kto_kl_samples(const std::vector<const KtoSample*>& block, const PreferenceEncodeOptions& options) {
  const size_t n = block.size();
  if (n < 2) {
    fail<ConfigError>("the KL term of KTO needs at least 2 examples per batch (the completions of the others), got {}",
                      n);
  }
  std::vector<Sample> rows;
  rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const KtoSample& own = *block[i];
    const KtoSample& other = *block[n - 1 - i];
    const std::vector<int32_t> prompt(own.completion.input_ids.begin(),
                                      own.completion.input_ids.begin() + own.prompt_length);
    std::vector<TokenSpan> runs;  // the prompt's image runs (all of the example's images are in its prompt)
    if (!own.completion.pixel_values.empty()) {
      if (!options.images) fail<ConfigError>("a KTO example has images but the encoding has no image settings");
      runs = image_token_runs(prompt, options.images->image_token_id, own.completion.image_tokens);
    }
    const AnswerTokens completion = answer_of(other.completion, other.prompt_length);
    const auto p = static_cast<int64_t>(prompt.size());
    const auto a = static_cast<int64_t>(completion.ids.size());
    PreferenceCut cut;
    if (options.truncation == TruncationStrategy::kDelete) {
      cut.prompt_end = p;
      cut.answers = {std::min(a, std::max<int64_t>(1, options.max_length - p))};
    } else {
      cut = cut_preference_lengths(p, {a}, options);
    }
    keep_whole_runs(runs, cut);
    const std::vector<int32_t> kept_prompt(prompt.begin() + cut.prompt_begin, prompt.begin() + cut.prompt_end);
    AnswerTokens kept = completion;
    kept.ids.resize(static_cast<size_t>(cut.answers[0]));
    kept.trained.resize(kept.ids.size());
    Sample row = join_prompt_answer(kept_prompt, kept);
    for (size_t k = 0; k < runs.size(); ++k) {  // the prompt's images the cut keeps whole
      if (runs[k].begin < cut.prompt_begin || runs[k].end > cut.prompt_end) continue;
      row.pixel_values.push_back(own.completion.pixel_values[k]);
      if (!own.completion.image_grids.empty()) row.image_grids.push_back(own.completion.image_grids[k]);
      row.image_tokens.push_back(runs[k].end - runs[k].begin);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

KtoBatch collate_kto(const std::vector<const KtoSample*>& examples, const std::vector<const Sample*>& kl,
                     int32_t pad_id) {
  if (examples.empty()) fail<ConfigError>("a KTO batch needs at least one example");
  if (!kl.empty() && kl.size() != examples.size()) {
    fail<ConfigError>("a KTO batch of {} examples was given {} KL rows (one per example)", examples.size(), kl.size());
  }
  std::vector<const Sample*> rows;
  rows.reserve(examples.size());
  for (const KtoSample* e : examples) rows.push_back(&e->completion);
  KtoBatch out;
  out.completions = collate_padded(rows, pad_id);                                  // [B, T]
  out.desirable = at::empty({static_cast<int64_t>(examples.size())}, at::kBool);  // [B]
  for (size_t i = 0; i < examples.size(); ++i) out.desirable[static_cast<int64_t>(i)] = examples[i]->desirable;
  if (!kl.empty()) out.kl = collate_padded(kl, pad_id);  // [B, T_kl]
  return out;
}

namespace {

using data_detail::CacheReader;

bool read_prompt_length(CacheReader& in, int64_t& prompt_length) {
  uint64_t p = 0;
  if (!in.u64(p) || p > (1ULL << 32)) return false;
  prompt_length = static_cast<int64_t>(p);
  return true;
}

// A stored sample holds its prompt: within the sample, and no label inside the prompt.
bool holds_prompt(const Sample& s, int64_t prompt_length) {
  if (prompt_length > static_cast<int64_t>(s.input_ids.size())) return false;
  for (int64_t t = 0; t + 1 < prompt_length; ++t) {
    if (s.labels[static_cast<size_t>(t)] != kIgnoreIndex) return false;
  }
  return true;
}

void count_sample(const Sample& s, DataStats& stats) {
  stats.tokens += static_cast<int64_t>(s.input_ids.size());
  stats.label_tokens += s.label_tokens();
}

// Pairs, version 2: per pair u64 prompt length, f64 margin, the chosen sample with the prompt's images and the
// rejected sample without them (it holds the same ones).
const data_detail::ItemCodec<PreferenceSample>& pair_codec() {
  static const data_detail::ItemCodec<PreferenceSample> codec{
      {'S', 'W', 'D', 'P', 'A', 'I', 'R', '2'},
      [](std::ostream& out, const PreferenceSample& p) {
        data_detail::write_u64(out, static_cast<uint64_t>(p.prompt_length));
        out.write(reinterpret_cast<const char*>(&p.margin), 8);
        data_detail::write_sample(out, p.chosen);
        Sample rejected_ids;
        rejected_ids.input_ids = p.rejected.input_ids;
        rejected_ids.labels = p.rejected.labels;
        data_detail::write_sample(out, rejected_ids);
      },
      [](CacheReader& in, PreferenceSample& p) {
        if (!read_prompt_length(in, p.prompt_length) || !in.read(&p.margin, 8) || !std::isfinite(p.margin) ||
            !data_detail::read_sample(in, p.chosen) || !data_detail::read_sample(in, p.rejected) ||
            !p.rejected.pixel_values.empty()) {
          return false;
        }
        share_images(p.chosen, p.rejected);
        const auto prompt = static_cast<std::ptrdiff_t>(p.prompt_length);
        return holds_prompt(p.chosen, p.prompt_length) && holds_prompt(p.rejected, p.prompt_length) &&
               std::equal(p.chosen.input_ids.begin(), p.chosen.input_ids.begin() + prompt,
                          p.rejected.input_ids.begin());
      },
      [] { return 16 + 2 * data_detail::kMinSampleBytes; },
      [](const PreferenceSample& p, DataStats& stats) {
        count_sample(p.chosen, stats);
        count_sample(p.rejected, stats);
      }};
  return codec;
}

// KTO examples, version 1: per example u64 prompt length, u8 desirable, the sample.
const data_detail::ItemCodec<KtoSample>& kto_codec() {
  static const data_detail::ItemCodec<KtoSample> codec{
      {'S', 'W', 'D', 'K', 'T', 'O', '0', '1'},
      [](std::ostream& out, const KtoSample& k) {
        data_detail::write_u64(out, static_cast<uint64_t>(k.prompt_length));
        const char desirable = k.desirable ? 1 : 0;
        out.write(&desirable, 1);
        data_detail::write_sample(out, k.completion);
      },
      [](CacheReader& in, KtoSample& k) {
        char desirable = 0;
        if (!read_prompt_length(in, k.prompt_length) || !in.read(&desirable, 1) || (desirable != 0 && desirable != 1) ||
            !data_detail::read_sample(in, k.completion)) {
          return false;
        }
        k.desirable = desirable == 1;
        return holds_prompt(k.completion, k.prompt_length);
      },
      [] { return 9 + data_detail::kMinSampleBytes; },
      [](const KtoSample& k, DataStats& stats) { count_sample(k.completion, stats); }};
  return codec;
}

constexpr const char* kDropped = "longer than max_length or nothing to train";

}  // namespace

PreferenceData prepare_preference_data(const DataOptions& options, const PreferenceEncoder& encoder,
                                       const std::string& fingerprint) {
  // Image files are hashed only when there is a cache to key.
  data_detail::ImageManifest manifest;
  data_detail::ImageManifest* images = !options.cache_dir.empty() && encoder.options().images ? &manifest : nullptr;
  const data_detail::RowEncoder<PreferenceSample> encode =
      [&](const Json& row, const std::string& where, const fs::path& base_dir, std::vector<PreferenceSample>& out,
          SkipCounts& skipped) {
        const PreferenceRow r = normalise_preference_row(row, where, PreferenceTask::kPairs, options.system, base_dir);
        if (images != nullptr) {
          for (const fs::path& image : r.images) images->add(image);
        }
        std::optional<PreferenceSample> pair = encoder.encode_pair(r);  // reads and preprocesses the row's images
        if (!pair) {
          skipped.add(kDropped);
          return;
        }
        out.push_back(std::move(*pair));
      };
  auto prepared = data_detail::prepare_items(options, {fingerprint, encoder.fingerprint(), "pairs"}, encode,
                                             pair_codec(), images);
  return {std::move(prepared.train), std::move(prepared.validation), std::move(prepared.stats)};
}

KtoData prepare_kto_data(const DataOptions& options, const PreferenceEncoder& encoder, const std::string& fingerprint) {
  data_detail::ImageManifest manifest;
  data_detail::ImageManifest* images = !options.cache_dir.empty() && encoder.options().images ? &manifest : nullptr;
  const data_detail::RowEncoder<KtoSample> encode = [&](const Json& row, const std::string& where,
                                                        const fs::path& base_dir, std::vector<KtoSample>& out,
                                                        SkipCounts& skipped) {
    const PreferenceRow r = normalise_preference_row(row, where, PreferenceTask::kKto, options.system, base_dir);
    if (images != nullptr) {
      for (const fs::path& image : r.images) images->add(image);
    }
    for (std::optional<KtoSample>& example : encoder.encode_kto(r)) {
      if (example) {
        out.push_back(std::move(*example));
      } else {
        skipped.add(kDropped);
      }
    }
  };
  auto prepared =
      data_detail::prepare_items(options, {fingerprint, encoder.fingerprint(), "kto"}, encode, kto_codec(), images);
  return {std::move(prepared.train), std::move(prepared.validation), std::move(prepared.stats)};
}

}  // namespace swiftcpp
