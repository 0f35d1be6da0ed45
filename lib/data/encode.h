// Conversations -> (input_ids, labels): the chat template renders the text, the tokenizer encodes it, and the
// template's trainable parts (assistant turns and their end-of-turn markers) become labels.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/collate.h"
#include "data/dataset.h"
#include "vision/image_processor.h"

namespace swiftcpp {

class TextTokenizer;
struct MultimodalConfig;

/// Tokenises rendered text exactly as training and inference both do: special-token strings become their ids,
/// and BOS is prepended when the tokenizer adds one and the text does not already start with it (chat templates
/// that write their own BOS string, as Hugging Face's apply_chat_template does). Throws like the tokenizer.
std::vector<int> tokenize_rendered(const TextTokenizer& tokenizer, const std::string& text);

/// The chat template `name` writing the tokenizer's own BOS/EOS strings (as Hugging Face passes bos_token and
/// eos_token to the Jinja template); null for "" or "raw" (raw text). Throws ConfigError for an unknown name.
std::shared_ptr<const ChatTemplate> chat_template_for(const TextTokenizer& tokenizer, const std::string& name);

enum class TruncationStrategy { kDelete, kLeft, kRight };
enum class LossScale { kDefault, kLastRound };

/// Parses "delete" | "left" | "right"; throws ConfigError listing the choices.
TruncationStrategy parse_truncation_strategy(const std::string& name);
/// Parses "default" | "last_round"; throws ConfigError listing the choices.
LossScale parse_loss_scale(const std::string& name);

/// How a vision-language model takes images: each kImagePlaceholder in the rendered text becomes the family's
/// `image_markup` (LLaVA: "<image>" itself; Qwen2-VL: "<|vision_start|><|image_pad|><|vision_end|>"), which holds
/// `image_token_id` (a special token of the tokenizer) once; that token is expanded to as many copies as the image
/// takes positions (`tokens_per_image` for fixed-count families, else what `processor` says for each image), the
/// positions the model fills with the image's features. The image file is read and preprocessed by `processor`.
struct ImageEncoding {
  int32_t image_token_id = -1;   // config.json's image_token_index / image_token_id
  int64_t tokens_per_image = 0;  // fixed-count families (MultimodalConfig::image_seq_length); 0: per image
  std::string image_markup = std::string(kImagePlaceholder);  // MultimodalConfig::image_markup
  std::shared_ptr<const vision::ImageProcessor> processor;    // chosen by preprocessor_config.json
  int64_t max_pixels = 0;        // images larger than this (width * height) are refused; 0: vision::kMaxImagePixels
  fs::path model_dir;            // where the tokenizer and processor come from, named in errors
  /// The model's media placeholder tokens with what they stand for ("image", "video"): the positions its encoders
  /// fill. A message may not hold one as typed text (its string is not kImagePlaceholder); images are written
  /// kImagePlaceholder and expanded by the encoder.
  std::vector<std::pair<int32_t, std::string>> media_tokens;
};

/// The image settings of the vision-language checkpoint in `model_dir` whose config is `mm`: its
/// preprocessor_config.json's processor (with `overrides`), image token, markup and fixed count. The one way
/// every command (train, infer, eval, deploy, data) sets images up. Throws like vision::load_image_processor,
/// and ConfigError when the image token id is out of range.
ImageEncoding make_image_encoding(const fs::path& model_dir, const MultimodalConfig& mm,
                                  const vision::ImageProcessorOverrides& overrides = {});

/// A fixed-count encoding (LLaVA-style: CLIP's processor from `model_dir`, `tokens_per_image` per image) for the
/// given image token. Throws like vision::load_image_processor, and ConfigError when image_token_id < 0 or
/// tokens_per_image < 1.
ImageEncoding make_image_encoding(const fs::path& model_dir, int64_t image_token_id, int64_t tokens_per_image);

/// A stable text of everything in `images` that decides the encoded samples (token id, features per image, every
/// processor setting), for cache keys and resume fingerprints. Does not throw.
std::string image_encoding_fingerprint(const ImageEncoding& images);

/// `ids` with every `image_token_id` repeated `tokens_per_image` times: the expanded layout a vision-language
/// model takes, from ids that hold one image token per image (as transformers 4.40's LlavaProcessor gives them).
/// Throws ConfigError when tokens_per_image < 1.
std::vector<int> expand_image_tokens(const std::vector<int>& ids, int image_token_id, int64_t tokens_per_image);

/// `ids` with the i-th `image_token_id` repeated tokens_per_image[i] times (variable-size images). Throws
/// ConfigError when the image tokens and the counts differ in number or a count is outside [1, 2^20].
std::vector<int> expand_image_tokens(const std::vector<int>& ids, int image_token_id,
                                     const std::vector<int64_t>& tokens_per_image);

/// Reads and preprocesses the image file at `path` with the encoding's processor; tokens is the positions it
/// takes. Throws IoError / FormatError naming the file, FormatError when the image would take no or too many tokens.
vision::ProcessedImage process_image_file(const fs::path& path, const ImageEncoding& settings);

/// An image of a prompt or a row, opened and counted: its file read and its header checked, the positions it takes
/// known from its size, no pixel decoded. Every command counts its images this way first, so a prompt or row too
/// long for its context is refused before any image is decoded or resized.
struct PlannedImage {
  vision::EncodedImage file;
  int64_t tokens = 0;
};

/// Counts the positions of an opened image (vision::ImageProcessor::tokens_for). Throws FormatError naming its
/// origin: a size the processor refuses, no or too many tokens.
PlannedImage plan_image(vision::EncodedImage image, const ImageEncoding& settings);

/// Opens the image file at `path` and counts its positions (vision::ImageProcessor::tokens_for). Throws IoError /
/// FormatError naming the file: missing, not a supported JPEG/PNG, more than the encoding's max_pixels, a size the
/// processor refuses, no or too many tokens.
PlannedImage plan_image_file(const fs::path& path, const ImageEncoding& settings);

/// Decodes and preprocesses a planned image; its tokens are the plan's. Throws FormatError naming the file.
vision::ProcessedImage process_planned_image(const PlannedImage& image, const ImageEncoding& settings);

/// `text` with every kImagePlaceholder replaced by the encoding's image_markup (the text as the family's tokenizer
/// takes it: one image token per image). Does not throw.
std::string with_image_markup(std::string text, const ImageEncoding& settings);

/// Moves the ends of a cut [begin, end) of a sequence off the image runs `runs` (sorted, disjoint): a run the cut
/// would split is left out whole, as truncation never keeps part of an image. `begin` may end up at or past `end`.
/// Does not throw.
void keep_whole_image_runs(const std::vector<TokenSpan>& runs, int64_t& begin, int64_t& end);

struct EncodeOptions {
  int64_t max_length = 2048;
  TruncationStrategy truncation = TruncationStrategy::kDelete;
  LossScale loss_scale = LossScale::kDefault;  // default: every assistant turn; last_round: the last one only
  /// Set for a vision-language model; unset, a row with images is refused ("images need a vision-language model").
  std::optional<ImageEncoding> images;
};

/// A generation prompt: its ids (image tokens expanded) and the preprocessed images, one per image-token run, in
/// order ([C, H, W] float32, or [patches, C T P P] with its grid in image_grids for variable-size processors).
struct EncodedPrompt {
  std::vector<int> ids;
  std::vector<at::Tensor> pixel_values;
  std::vector<std::array<int64_t, 3>> image_grids;  // variable-size images only
  /// The images as one forward takes them: pixel_values and image_grid_thw (collate.h's batch_images); both
  /// undefined without images.
  ImageInputs batched_images() const;
};

/// Encodes conversations the way inference will see them: the exact text the template renders (byte-identical
/// to the Hugging Face chat template), tokenised as one string with special-token strings parsed, so training
/// and `swiftcpp infer` feed the model the same ids. Labels are shifted (labels[t] is what position t predicts)
/// and cover each trained assistant turn including its end-of-turn marker; a message with "loss": false (or
/// loss_weight 0) is not trained. Plain-text rows become [BOS] text [EOS] with every token trained.
///
/// Images (options.images set): every kImagePlaceholder tokenises to the image token, which is expanded to
/// tokens_per_image copies; the i-th run takes the i-th image of the conversation, read and preprocessed into
/// Sample::pixel_values. No position is trained to predict an image token (the position before a run and every
/// position inside it but the last have no label); the last position of a run predicts the token after it when
/// that token is trained, as in Hugging Face's LLaVA. Truncation never cuts through a run: with "left" or "right"
/// an image whose run would be cut is dropped whole (its tokens and its pixel values; the sample may end up
/// shorter than max_length), images outside the kept window are dropped, and "delete" drops the whole row as
/// for text.
class SampleEncoder {
 public:
  /// `chat_template` null means raw text (a base model without a chat template). Throws ConfigError when
  /// max_length < 2, and, with options.images, when its settings are incomplete or the tokenizer does not
  /// encode kImagePlaceholder to exactly image_token_id (naming options.images->model_dir).
  SampleEncoder(std::shared_ptr<const TextTokenizer> tokenizer, std::shared_ptr<const ChatTemplate> chat_template,
                EncodeOptions options);

  /// The sample, or nullopt when it is longer than max_length and truncation is "delete", or when it has no
  /// trained token left (e.g. every assistant turn has loss false). Images are opened and counted first
  /// (plan_image_file): a row too long with them is dropped before any is decoded, and only the images whose runs
  /// are kept are decoded. Throws BadRowError naming the row's `where` for a conversation the template rejects,
  /// and for images: a row with images on an encoder without image settings ("images need a vision-language
  /// model"), image tokens in the text that do not match the row's images in number ("image count mismatch"), an
  /// image token in an assistant turn ("image in an assistant message"), a message holding one of the model's media
  /// tokens as typed text ("media token in the text", naming it), an image that is missing, unreadable or not a
  /// supported JPEG/PNG ("image unreadable", naming the file).
  std::optional<Sample> encode(const Conversation& conversation) const;

  /// The ids of a prompt for generation: the rendered conversation (ending with a user turn) plus the
  /// template's generation prompt, tokenised exactly as encode() tokenises training text. With image settings,
  /// throws like encode_prompt(messages, {}) (a prompt holding image tokens needs its images).
  std::vector<int> encode_prompt(const std::vector<ChatMessage>& messages) const;

  /// A prompt with images: the ids as encode_prompt(messages) gives them with each image token expanded to
  /// tokens_per_image copies, and `images` read and preprocessed in order (the i-th for the i-th run). The images
  /// are counted from their headers first: a prompt longer than max_length with them is refused before any is
  /// decoded. Throws ConfigError when images are given to an encoder without image settings, when the image
  /// tokens of the prompt and `images` differ in number (naming both counts), when a message holds one of the
  /// model's media tokens as typed text (naming it), or when the expanded prompt is longer than max_length;
  /// IoError / FormatError naming the file when an image cannot be read.
  EncodedPrompt encode_prompt(const std::vector<ChatMessage>& messages, const std::vector<fs::path>& images) const;
  /// The same with images already read into memory (a request's parts); errors name each image's origin.
  EncodedPrompt encode_prompt(const std::vector<ChatMessage>& messages, std::vector<vision::EncodedImage> images) const;

  /// Refuses `text` when it holds one of the image settings' media tokens as typed text: BadRowError naming `where`
  /// ("media token in the text", naming the token and `what`, e.g. "message 2"). Nothing without image settings.
  void refuse_typed_media(const std::string& text, const std::string& where, const std::string& what) const;

  /// Opens and counts an image of a row (plan_image_file with the image settings). Throws ConfigError without image
  /// settings, and BadRowError naming `where` ("image unreadable", naming the file) when the file is missing, not a
  /// supported JPEG/PNG, too large, or of a size the processor refuses.
  PlannedImage plan_row_image(const fs::path& path, const std::string& where) const;
  /// Decodes and preprocesses an image plan_row_image planned. Throws like plan_row_image.
  vision::ProcessedImage process_row_image(const PlannedImage& image, const fs::path& path,
                                           const std::string& where) const;

  const EncodeOptions& options() const { return options_; }
  const std::shared_ptr<const TextTokenizer>& tokenizer() const { return tokenizer_; }
  /// Null for raw text.
  const std::shared_ptr<const ChatTemplate>& chat_template() const { return template_; }

 private:
  std::shared_ptr<const TextTokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;
  EncodeOptions options_;
  /// The strings of the image settings' media tokens a message may not hold, with what each stands for.
  std::vector<std::pair<std::string, std::string>> typed_media_;

  /// The first media token string `text` holds, or null.
  const std::pair<std::string, std::string>* typed_media_token(const std::string& text) const;
};

}  // namespace swiftcpp
