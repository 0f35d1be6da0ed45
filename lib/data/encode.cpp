#include "data/encode.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "tokenizer/tokenizer.h"
#include "vision/image.h"
#include "models/decoder/config.h"
#include "vision/image_processor.h"

namespace swiftcpp {

namespace {

using vision::kMaxTokensPerImage;

void check_image_settings(const ImageEncoding& im) {
  const fs::path& model_dir = im.model_dir;
  if (im.image_token_id < 0) {
    fail<ConfigError>("{}: image token id must be in [0, {}], got {}", model_dir.string(), INT32_MAX, im.image_token_id);
  }
  const bool per_image = im.processor && im.processor->variable_size();
  if ((!per_image && im.tokens_per_image < 1) || im.tokens_per_image < 0 || im.tokens_per_image > kMaxTokensPerImage) {
    fail<ConfigError>("{}: image tokens per image must be in [1, {}], got {}", model_dir.string(), kMaxTokensPerImage,
                      im.tokens_per_image);
  }
}

// Runs `step` on one image of a row: a missing or undecodable file, or a size the processor refuses, is a bad row
// naming the file.
template <typename Step>
auto row_image_step(const fs::path& path, const std::string& where, const Step& step) -> decltype(step()) {
  const auto unreadable = [&](const Error& e) {
    const std::string what = e.what();
    throw BadRowError(where, "image unreadable",
                      what.find(path.string()) == std::string::npos ? path.string() + ": " + what : what);
  };
  try {
    return step();
  } catch (const IoError& e) {
    unreadable(e);
  } catch (const FormatError& e) {
    unreadable(e);
  }
  throw BadRowError(where, "image unreadable", path.string());  // not reached
}

// `what` with the file name in front unless it already names it.
std::string naming(const std::string& file, const std::string& what) {
  return what.find(file) == std::string::npos ? file + ": " + what : what;
}

}  // namespace

std::string with_image_markup(std::string text, const ImageEncoding& im) {
  if (im.image_markup == kImagePlaceholder) return text;
  std::string out;
  size_t from = 0;
  for (size_t at = text.find(kImagePlaceholder); at != std::string::npos; at = text.find(kImagePlaceholder, from)) {
    out.append(text, from, at - from);
    out += im.image_markup;
    from = at + kImagePlaceholder.size();
  }
  out.append(text, from, std::string::npos);
  return out;
}

void keep_whole_image_runs(const std::vector<TokenSpan>& runs, int64_t& begin, int64_t& end) {
  for (const TokenSpan& run : runs) {
    if (run.begin < begin && begin < run.end) begin = run.end;
    if (run.begin < end && end < run.end) end = run.begin;
  }
}

PlannedImage plan_image_file(const fs::path& path, const ImageEncoding& settings) {
  const int64_t max_pixels = settings.max_pixels > 0 ? settings.max_pixels : vision::kMaxImagePixels;
  return plan_image(vision::open_image(path, max_pixels), settings);  // open_image names the file in its errors
}

PlannedImage plan_image(vision::EncodedImage image, const ImageEncoding& settings) {
  if (!settings.processor) fail<ConfigError>("{}: image settings without an image processor", image.origin);
  const int64_t max_pixels = settings.max_pixels > 0 ? settings.max_pixels : vision::kMaxImagePixels;
  const std::string path = image.origin;
  PlannedImage out;
  out.file = std::move(image);
  try {
    out.tokens = settings.processor->variable_size()
                     ? settings.processor->tokens_for(out.file.height, out.file.width, max_pixels)
                     : settings.tokens_per_image;
  } catch (const FormatError& e) {
    fail<FormatError>("{}", naming(path, e.what()));
  }
  if (out.tokens < 1 || out.tokens > kMaxTokensPerImage) {
    fail<FormatError>("{}: the image takes {} tokens; [1, {}] are supported", path, out.tokens,
                      kMaxTokensPerImage);
  }
  return out;
}

vision::ProcessedImage process_planned_image(const PlannedImage& image, const ImageEncoding& settings) {
  const int64_t max_pixels = settings.max_pixels > 0 ? settings.max_pixels : vision::kMaxImagePixels;
  vision::ProcessedImage out;
  try {
    out = settings.processor->process(vision::decode_image(image.file, max_pixels), max_pixels);
  } catch (const FormatError& e) {
    fail<FormatError>("{}", naming(image.file.origin, e.what()));
  }
  if (!settings.processor->variable_size()) out.tokens = settings.tokens_per_image;
  if (out.tokens != image.tokens) {  // tokens_for and process disagree: a defect, not a bad file
    fail<Error>("{}: the image was counted at {} tokens and preprocessed to {}", image.file.origin, image.tokens,
                out.tokens);
  }
  return out;
}

vision::ProcessedImage process_image_file(const fs::path& path, const ImageEncoding& settings) {
  return process_planned_image(plan_image_file(path, settings), settings);
}

ImageInputs EncodedPrompt::batched_images() const {
  Sample s;
  s.pixel_values = pixel_values;
  s.image_grids = image_grids;
  return batch_images({&s});
}

ImageEncoding make_image_encoding(const fs::path& model_dir, const MultimodalConfig& mm,
                                  const vision::ImageProcessorOverrides& overrides) {
  ImageEncoding e;
  if (mm.image_token_index < 0 || mm.image_token_index > INT32_MAX) {
    fail<ConfigError>("{}: image token id must be in [0, {}], got {}", model_dir.string(), INT32_MAX,
                      mm.image_token_index);
  }
  e.image_token_id = static_cast<int32_t>(mm.image_token_index);
  e.tokens_per_image = mm.image_seq_length;
  e.image_markup = mm.image_markup;
  e.processor = vision::load_image_processor(model_dir, mm.image_seq_length, overrides);
  e.model_dir = model_dir;
  e.media_tokens.emplace_back(e.image_token_id, "image");
  if (mm.video_token_id >= 0 && mm.video_token_id <= INT32_MAX) {
    e.media_tokens.emplace_back(static_cast<int32_t>(mm.video_token_id), "video");
  }
  check_image_settings(e);
  return e;
}

ImageEncoding make_image_encoding(const fs::path& model_dir, int64_t image_token_id, int64_t tokens_per_image) {
  if (image_token_id < 0 || image_token_id > INT32_MAX) {
    fail<ConfigError>("{}: image token id must be in [0, {}], got {}", model_dir.string(), INT32_MAX, image_token_id);
  }
  if (tokens_per_image < 1 || tokens_per_image > kMaxTokensPerImage) {
    fail<ConfigError>("{}: image tokens per image must be in [1, {}], got {}", model_dir.string(), kMaxTokensPerImage,
                      tokens_per_image);
  }
  MultimodalConfig mm;
  mm.image_token_index = image_token_id;
  mm.image_seq_length = tokens_per_image;
  return make_image_encoding(model_dir, mm);
}

std::string image_encoding_fingerprint(const ImageEncoding& images) {
  std::string fp = fmt::format("image_token={};per_image={};markup={};max_pixels={}", images.image_token_id,
                               images.tokens_per_image, images.image_markup, images.max_pixels);
  if (images.processor) fp += ";" + images.processor->fingerprint();
  return fp;
}

std::vector<int> expand_image_tokens(const std::vector<int>& ids, int image_token_id, int64_t tokens_per_image) {
  if (tokens_per_image < 1 || tokens_per_image > kMaxTokensPerImage) {
    fail<ConfigError>("image tokens per image must be in [1, {}], got {}", kMaxTokensPerImage, tokens_per_image);
  }
  const auto images = std::count(ids.begin(), ids.end(), image_token_id);
  return expand_image_tokens(ids, image_token_id, std::vector<int64_t>(static_cast<size_t>(images), tokens_per_image));
}

std::vector<int> expand_image_tokens(const std::vector<int>& ids, int image_token_id,
                                     const std::vector<int64_t>& tokens_per_image) {
  std::vector<int> out;
  out.reserve(ids.size());
  size_t image = 0;
  for (int id : ids) {
    if (id != image_token_id) {
      out.push_back(id);
      continue;
    }
    if (image >= tokens_per_image.size()) {
      fail<ConfigError>("the ids hold more than {} image token(s) (id {})", tokens_per_image.size(), image_token_id);
    }
    const int64_t n = tokens_per_image[image++];
    if (n < 1 || n > kMaxTokensPerImage) {
      fail<ConfigError>("image tokens per image must be in [1, {}], got {}", kMaxTokensPerImage, n);
    }
    out.insert(out.end(), static_cast<size_t>(n), id);
  }
  if (image != tokens_per_image.size()) {
    fail<ConfigError>("the ids hold {} image token(s) (id {}), but {} image(s) were given", image, image_token_id,
                      tokens_per_image.size());
  }
  return out;
}

TruncationStrategy parse_truncation_strategy(const std::string& name) {
  if (name == "delete") return TruncationStrategy::kDelete;
  if (name == "left") return TruncationStrategy::kLeft;
  if (name == "right") return TruncationStrategy::kRight;
  fail<ConfigError>("truncation_strategy '{}' is not one of delete, left, right", name);
}

LossScale parse_loss_scale(const std::string& name) {
  if (name == "default") return LossScale::kDefault;
  if (name == "last_round") return LossScale::kLastRound;
  fail<ConfigError>("loss_scale '{}' is not one of default, last_round", name);
}

SampleEncoder::SampleEncoder(std::shared_ptr<const TextTokenizer> tokenizer,
                             std::shared_ptr<const ChatTemplate> chat_template, EncodeOptions options)
    : tokenizer_(std::move(tokenizer)), template_(std::move(chat_template)), options_(std::move(options)) {
  if (options_.max_length < 2) fail<ConfigError>("max_length must be >= 2, got {}", options_.max_length);
  if (options_.images) {
    const ImageEncoding& im = *options_.images;
    const std::string dir = im.model_dir.empty() ? std::string("the model folder") : im.model_dir.string();
    if (!im.processor) {
      fail<ConfigError>("{}: image settings without an image processor (preprocessor_config.json)", dir);
    }
    check_image_settings(im);
    const std::vector<int> ids = tokenizer_->encode_with_special_tokens(im.image_markup);
    if (std::count(ids.begin(), ids.end(), im.image_token_id) != 1) {
      fail<ConfigError>("the tokenizer in {} does not know the image markup '{}' as holding the image token {} once "
                        "(image_token_index): it encodes to [{}]; add the image token to the tokenizer's added tokens",
                        dir, im.image_markup, im.image_token_id, fmt::join(ids, ", "));
    }
    // A media token typed in a message would be parsed as that token: an image or video position without its
    // pixels. The placeholder itself (LLaVA's image token is "<image>") is how images are written.
    for (const auto& [id, what] : im.media_tokens) {
      if (id < 0 || id >= tokenizer_->vocab_size()) continue;
      std::string piece = tokenizer_->id_to_piece(id);
      if (!piece.empty() && piece != kImagePlaceholder) typed_media_.emplace_back(std::move(piece), what);
    }
  }
}

const std::pair<std::string, std::string>* SampleEncoder::typed_media_token(const std::string& text) const {
  for (const auto& token : typed_media_) {
    if (text.find(token.first) != std::string::npos) return &token;
  }
  return nullptr;
}

void SampleEncoder::refuse_typed_media(const std::string& text, const std::string& where,
                                       const std::string& what) const {
  if (const auto* token = typed_media_token(text)) {
    throw BadRowError(where, "media token in the text",
                      fmt::format("{} holds '{}', the model's {} token, as text: write {} where an image goes{}", what,
                                  token->first, token->second, kImagePlaceholder,
                                  token->second == "image" ? "" : " (videos are not supported yet)"));
  }
}

PlannedImage SampleEncoder::plan_row_image(const fs::path& path, const std::string& where) const {
  if (!options_.images) fail<ConfigError>("{}: images need a vision-language model", where);
  return row_image_step(path, where, [&] { return plan_image_file(path, *options_.images); });
}

vision::ProcessedImage SampleEncoder::process_row_image(const PlannedImage& image, const fs::path& path,
                                                        const std::string& where) const {
  if (!options_.images) fail<ConfigError>("{}: images need a vision-language model", where);
  return row_image_step(path, where, [&] { return process_planned_image(image, *options_.images); });
}

std::shared_ptr<const ChatTemplate> chat_template_for(const TextTokenizer& tokenizer, const std::string& name) {
  if (name.empty() || name == "raw") return nullptr;
  TemplateTokens tokens;
  const auto& sp = tokenizer.specials();
  if (sp.bos) tokens.bos_token = tokenizer.id_to_piece(*sp.bos);
  if (!sp.eos.empty()) tokens.eos_token = tokenizer.id_to_piece(sp.eos.front());
  return make_chat_template(name, tokens);
}

std::vector<int> tokenize_rendered(const TextTokenizer& tokenizer, const std::string& text) {
  std::vector<int> ids = tokenizer.encode_with_special_tokens(text);
  const auto& sp = tokenizer.specials();
  if (sp.add_bos && sp.bos && (ids.empty() || ids.front() != *sp.bos)) ids.insert(ids.begin(), *sp.bos);
  return ids;
}

std::vector<int> SampleEncoder::encode_prompt(const std::vector<ChatMessage>& messages) const {
  return encode_prompt(messages, std::vector<fs::path>{}).ids;
}

EncodedPrompt SampleEncoder::encode_prompt(const std::vector<ChatMessage>& messages,
                                           const std::vector<fs::path>& images) const {
  if (images.empty() || !options_.images) return encode_prompt(messages, std::vector<vision::EncodedImage>(images.size()));
  const int64_t max_pixels = options_.images->max_pixels > 0 ? options_.images->max_pixels : vision::kMaxImagePixels;
  std::vector<vision::EncodedImage> opened;
  for (const fs::path& path : images) opened.push_back(vision::open_image(path, max_pixels));
  return encode_prompt(messages, std::move(opened));
}

EncodedPrompt SampleEncoder::encode_prompt(const std::vector<ChatMessage>& messages,
                                           std::vector<vision::EncodedImage> images) const {
  EncodedPrompt prompt;
  std::string text;
  if (!template_) {
    for (const auto& m : messages) text += m.content;
  } else {
    text = template_->render_text(messages, /*add_generation_prompt=*/true);
  }
  if (!options_.images) {
    if (!images.empty()) {
      fail<ConfigError>("{} image(s) given, but images need a vision-language model (this model takes text only)",
                        images.size());
    }
    prompt.ids = tokenize_rendered(*tokenizer_, text);
    return prompt;
  }
  const ImageEncoding& im = *options_.images;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (const auto* token = typed_media_token(messages[i].content)) {
      fail<ConfigError>("message {} holds '{}', the model's {} token, as text: write {} where an image goes{}", i,
                        token->first, token->second, kImagePlaceholder,
                        token->second == "image" ? "" : " (videos are not supported yet)");
    }
  }
  prompt.ids = tokenize_rendered(*tokenizer_, with_image_markup(text, im));
  const auto tokens = std::count(prompt.ids.begin(), prompt.ids.end(), im.image_token_id);
  if (tokens != static_cast<std::ptrdiff_t>(images.size())) {
    fail<ConfigError>("image count mismatch: the prompt holds {} {} placeholder(s) but {} image(s) were given", tokens,
                      kImagePlaceholder, images.size());
  }
  // Counted from their headers first: a prompt that cannot fit is refused before any pixel is decoded.
  std::vector<PlannedImage> planned;
  std::vector<int64_t> counts;
  int64_t length = static_cast<int64_t>(prompt.ids.size());
  for (vision::EncodedImage& image : images) {
    planned.push_back(plan_image(std::move(image), im));
    counts.push_back(planned.back().tokens);
    length += planned.back().tokens - 1;
  }
  if (length > options_.max_length) {
    fail<ConfigError>("the prompt with its {} image(s) takes {} tokens ({} of them the images'), more than the {} "
                      "that fit (max_length; for infer the model's context): refused before decoding the images; lower max_pixels or give fewer images",
                      images.size(), length, length - static_cast<int64_t>(prompt.ids.size()) + tokens,
                      options_.max_length);
  }
  for (size_t i = 0; i < planned.size(); ++i) {
    vision::ProcessedImage image = process_planned_image(planned[i], im);
    planned[i] = PlannedImage();  // the file's bytes are no longer needed
    prompt.pixel_values.push_back(std::move(image.pixel_values));
    if (im.processor->variable_size()) prompt.image_grids.push_back(image.grid_thw);
  }
  prompt.ids = expand_image_tokens(prompt.ids, im.image_token_id, counts);
  return prompt;
}

std::optional<Sample> SampleEncoder::encode(const Conversation& c) const {
  if (!c.images.empty() && !options_.images) {
    throw BadRowError(c.where, "images need a vision-language model",
                      fmt::format("the row has {} image(s), the model takes text only", c.images.size()));
  }
  if (options_.images) {
    if (c.format == RowFormat::kText) refuse_typed_media(c.text, c.where, "the text");
    for (size_t i = 0; i < c.messages.size(); ++i) {
      refuse_typed_media(c.messages[i].content, c.where, fmt::format("message {}", i));
      if (c.messages[i].role == "assistant" && count_image_placeholders(c.messages[i].content) > 0) {
        throw BadRowError(c.where, "image in an assistant message", fmt::format("message {} holds an image", i));
      }
    }
  }
  std::vector<int> ids;
  std::vector<char> trained;  // per token
  std::string prefix;
  // A row without images that is cut on the right (or deleted) when too long stops being rendered once its tokens
  // run kStableTail past max_length: later text can only change the last tokens of the prefix (a piece or a
  // pre-token never spans more than a few), so the first max_length tokens and their labels are final, and a huge
  // row costs one tokenisation of what comes before the cut instead of one per later segment.
  constexpr size_t kStableTail = 64;
  const bool may_stop = c.images.empty() && options_.truncation != TruncationStrategy::kLeft;
  bool stopped = false;
  // Appends `text` to the rendered prefix. The whole prefix is tokenised again and the tokens past its common
  // part with what we had are the new text's, so every id is what tokenising the full text gives.
  auto append = [&](const std::string& text, bool train) {
    if (stopped) return;
    prefix += text;
    const std::vector<int> upto = tokenize_rendered(*tokenizer_, prefix);
    size_t common = 0;
    while (common < ids.size() && common < upto.size() && ids[common] == upto[common]) ++common;
    ids.resize(common);
    trained.resize(common);
    for (size_t j = common; j < upto.size(); ++j) {
      ids.push_back(upto[j]);
      trained.push_back(train ? 1 : 0);
    }
    if (may_stop && options_.max_length > 0 && ids.size() > static_cast<size_t>(options_.max_length) + kStableTail) {
      stopped = true;
    }
  };
  const auto& specials = tokenizer_->specials();
  auto append_eos = [&] {
    if (stopped || specials.eos.empty()) return;
    ids.push_back(specials.eos.front());
    trained.push_back(1);
  };

  if (c.format == RowFormat::kText) {
    append(c.text, true);
    append_eos();
  } else if (!template_) {
    // Raw text for a base model: the turns joined by newlines (separators untrained), trained where the
    // assistant speaks, then EOS.
    for (size_t i = 0; i < c.messages.size(); ++i) {
      const auto& m = c.messages[i];
      if (i > 0) append("\n", false);
      append(options_.images ? with_image_markup(m.content, *options_.images) : m.content,
             m.role == "assistant" && m.loss.value_or(true));
    }
    append_eos();
  } else {
    std::vector<TemplateSegment> segments;
    try {
      segments = template_->render(c.messages, /*add_generation_prompt=*/false);
    } catch (const ConfigError& e) {
      throw BadRowError(c.where, "rejected by the chat template", e.what());
    }
    // Runs of trainable segments map, in order, onto the assistant messages.
    std::vector<size_t> assistants;
    for (size_t i = 0; i < c.messages.size(); ++i) {
      if (c.messages[i].role == "assistant") assistants.push_back(i);
    }
    size_t run = 0;
    bool in_run = false;
    for (const auto& seg : segments) {
      if (seg.trainable && !in_run) ++run;
      in_run = seg.trainable;
      bool train = seg.trainable;
      if (train && run <= assistants.size()) {
        const ChatMessage& owner = c.messages[assistants[run - 1]];
        if (!owner.loss.value_or(true)) train = false;
        if (options_.loss_scale == LossScale::kLastRound && run != assistants.size()) train = false;
      }
      append(options_.images ? with_image_markup(seg.text, *options_.images) : seg.text, train);
    }
  }

  // Images: each image token becomes a run of as many tokens as the image takes, none of them a target.
  std::vector<TokenSpan> runs;
  std::vector<PlannedImage> planned;  // every image, opened and counted; decoded only when its run is kept
  if (options_.images) {
    const ImageEncoding& im = *options_.images;
    const auto tokens = std::count(ids.begin(), ids.end(), im.image_token_id);
    if (tokens != static_cast<std::ptrdiff_t>(c.images.size())) {
      throw BadRowError(c.where, "image count mismatch",
                        fmt::format("{} image token(s) in the rendered text, {} image(s) given", tokens,
                                    c.images.size()));
    }
    std::vector<int64_t> counts;
    for (const fs::path& path : c.images) {
      planned.push_back(plan_row_image(path, c.where));
      counts.push_back(planned.back().tokens);
    }
    int64_t expanded_length = static_cast<int64_t>(ids.size());
    for (const int64_t n : counts) expanded_length += n - 1;
    if (expanded_length > options_.max_length && options_.truncation == TruncationStrategy::kDelete) {
      return std::nullopt;  // known without expanding
    }
    if (tokens > 0) {
      std::vector<int> expanded;
      std::vector<char> expanded_trained;
      expanded.reserve(static_cast<size_t>(expanded_length));
      size_t image = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        if (ids[t] == im.image_token_id) {
          const int64_t n = counts[image++];
          const auto at = static_cast<int64_t>(expanded.size());
          runs.push_back({at, at + n});
          expanded.insert(expanded.end(), static_cast<size_t>(n), ids[t]);
          expanded_trained.insert(expanded_trained.end(), static_cast<size_t>(n), 0);
        } else {
          expanded.push_back(ids[t]);
          expanded_trained.push_back(trained[t]);
        }
      }
      ids = std::move(expanded);
      trained = std::move(expanded_trained);
    }
  }

  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t begin = 0, end = n;
  if (n > options_.max_length) {
    if (options_.truncation == TruncationStrategy::kDelete) return std::nullopt;
    if (options_.truncation == TruncationStrategy::kLeft) begin = n - options_.max_length;
    else end = options_.max_length;
    keep_whole_image_runs(runs, begin, end);  // a cut inside an image's run drops the whole image
    if (begin >= end) return std::nullopt;
  }
  Sample s;
  s.input_ids.assign(ids.begin() + begin, ids.begin() + end);
  s.labels.assign(s.input_ids.size(), kIgnoreIndex);
  for (int64_t t = begin; t + 1 < end; ++t) {
    if (trained[t + 1]) s.labels[t - begin] = ids[t + 1];
  }
  if (s.label_tokens() == 0) return std::nullopt;
  for (size_t i = 0; i < runs.size(); ++i) {  // the images whose runs were kept, in order
    if (runs[i].begin >= begin && runs[i].end <= end) {
      vision::ProcessedImage image = process_row_image(planned[i], c.images[i], c.where);
      planned[i] = PlannedImage();  // the file's bytes are no longer needed
      s.pixel_values.push_back(std::move(image.pixel_values));  // [C, H, W] | [patches, C T P P]
      if (options_.images->processor->variable_size()) s.image_grids.push_back(image.grid_thw);
      s.image_tokens.push_back(runs[i].end - runs[i].begin);
    }
  }
  return s;
}

}  // namespace swiftcpp
