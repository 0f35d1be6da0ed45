// Preference data (DPO, ORPO, CPO, SimPO, reward modelling, KTO): rows in ms-swift's, LLaMA-Factory's and TRL's
// forms normalised to a prompt and its final answers, encoded through the chat template exactly as SFT encodes a
// conversation with labels on the final answer only, batched the way TRL's trainers run them, and prepared through
// the same threaded, content-keyed cached pipeline as SFT data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/collate.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "data/pipeline.h"

namespace swiftcpp {

/// What a preference run trains on: two answers to one prompt, one preferred (dpo, orpo, cpo, simpo, rm), or
/// single completions labelled desirable or undesirable (kto).
enum class PreferenceTask { kPairs, kKto };

/// The task of an rlhf_type: "dpo", "orpo", "cpo", "simpo", "rm" -> kPairs; "kto" -> kKto. Throws ConfigError
/// listing the choices for any other name.
PreferenceTask preference_task_for(const std::string& rlhf_type);

/// One preference row, normalised. A pair row has `rejected`; a KTO row has `desirable` instead.
struct PreferenceRow {
  std::vector<ChatMessage> prompt;      // [system] user (assistant user)*: the conversation up to its last user turn
  std::string chosen;                   // pair rows: the preferred final answer; KTO rows: the completion
  std::optional<std::string> rejected;  // pair rows: the dispreferred final answer to the same prompt
  std::optional<bool> desirable;        // KTO rows: the row's "label"
  std::optional<double> margin;         // reward modelling: the row's "margin", when it has one
  /// The prompt's images, one per kImagePlaceholder of the prompt in order (answers hold none); relative paths in
  /// the row are taken relative to the dataset file's folder.
  std::vector<fs::path> images;
  std::string where;                    // "file:line" (JSONL) or "file[#index]" (JSON array)
};

/// Recognises and normalises one preference row (the form is detected per row):
///   ms-swift     {"messages": [... ending with the chosen assistant turn], "rejected_response": "..."}
///                {"messages": [...], "rejected_messages": [... the same prompt, ending with the rejected turn]}
///                {"messages": [...], "label": true|false}                                            (KTO)
///   LLaMA-Factory {"conversations": [{"from": "human"|"gpt"|"system", "value"}, ... ending with a human turn],
///                 "chosen": {"from": "gpt", "value"} | "...", "rejected": {"from": "gpt", "value"} | "..."}
///   prompt forms {"prompt"|"query": "...", "chosen"|"response"|"completion": ..., "rejected"|"rejected_response":
///                 ..., "history"?: [[q, a], ...]}, {"instruction", "input"?, "chosen"|"output", "rejected"}, and
///                TRL's conversational {"prompt": [messages], "chosen": [one assistant message], "rejected": [...]}
/// Every form may carry "system" (a string), "margin" (a number: reward modelling), "images" (the prompt's images,
/// as normalise_row reads them, or image parts in the prompt's messages; relative paths from `base_dir`) and, for
/// KTO, "label". An answer
/// given on its own ("chosen", "rejected", ...) is a string, a message ({"role": "assistant", "content"} or
/// {"from": "gpt", "value"}) or a list holding one such message. The conversation before the chosen answer is
/// checked as normalise_row checks it (roles alternate, starting with user), and the answers follow its last user
/// turn. With `task` kKto, a row with "label" is one KTO example and a pair row becomes two later (its chosen
/// answer desirable, its rejected one undesirable); with kPairs a "label" is ignored. `system_override`, when set,
/// replaces the row's system prompt (or adds one).
/// Throws BadRowError naming `where` with the reasons of normalise_row (wrong role order, non-string content,
/// unknown format, ...) and: "no chosen answer", "no rejected answer" (kPairs, or a kKto row that has neither a
/// label nor a rejected answer is "KTO row without a boolean label"), "empty chosen answer", "empty rejected
/// answer", "empty completion" (a KTO row's), "KTO row without a boolean label" (a "label" that is not true or
/// false), "label and rejected answer both given" (kKto), "rejected_messages prompt differs" (naming the first
/// message that differs), "rejected_messages images differ", "bad margin" (not a finite number in [-1e4, 1e4]),
/// the image reasons of normalise_row, and "image in an assistant message" (a rejected answer holding
/// kImagePlaceholder in a row with images).
PreferenceRow normalise_preference_row(const Json& row, const std::string& where, PreferenceTask task,
                                       const std::optional<std::string>& system_override = std::nullopt,
                                       const fs::path& base_dir = {});

/// How long encoded preference examples may be. TRL 0.9.6's rule (DPOTrainer.tokenize_row, KTO's
/// _process_tokens): when the prompt plus the longer answer exceed max_length, "delete" drops the pair (or the KTO
/// example); "left" (TRL's truncation_mode keep_end) and "right" (keep_start) first cut the prompt to its last /
/// first max_prompt_length tokens, and if the prompt plus the longer answer still exceed max_length, cut every
/// answer longer than max_length - max_prompt_length to its first max_length - max_prompt_length tokens (its
/// end-of-turn marker may be cut off, as in TRL). Both answers of a pair always keep the same prompt tokens.
/// Lengths count image tokens (each image's run); a prompt cut never keeps part of a run: the image is left out
/// whole (keep_whole_image_runs), its pixels too.
struct PreferenceEncodeOptions {
  int64_t max_length = 2048;         // prompt + one answer, in tokens
  int64_t max_prompt_length = 0;     // "left"/"right" only: in [1, max_length)
  TruncationStrategy truncation = TruncationStrategy::kDelete;
  /// Set for a vision-language model (as EncodeOptions::images); unset, a row with images is refused.
  std::optional<ImageEncoding> images;
};

/// Which tokens of a prompt and its answers cut_preference_lengths keeps.
struct PreferenceCut {
  bool keep = true;              // false: the example is dropped (truncation "delete")
  int64_t prompt_begin = 0;      // the prompt's kept ids are [prompt_begin, prompt_end)
  int64_t prompt_end = 0;
  std::vector<int64_t> answers;  // each answer keeps its first answers[i] ids
};

/// Applies PreferenceEncodeOptions' rule to a prompt of `prompt` ids and answers of `answers` ids (one for a KTO
/// example, two for a pair). Does not throw; options are checked by PreferenceEncoder.
PreferenceCut cut_preference_lengths(int64_t prompt, const std::vector<int64_t>& answers,
                                     const PreferenceEncodeOptions& options);

/// An answer's ids as they follow the prompt's, each marked trained (the answer and its end-of-turn marker) or
/// not (template text after the marker, such as ChatML's newline).
struct AnswerTokens {
  std::vector<int32_t> ids;
  std::vector<char> trained;  // same length as ids
};

/// The sample `prompt ++ answer`: labels (shifted, as in Sample) only where the next token is a trained answer
/// token, so the last prompt position predicts the answer's first token and no position predicts prompt text.
/// Throws ConfigError when answer.ids and answer.trained differ in length.
Sample join_prompt_answer(const std::vector<int32_t>& prompt, const AnswerTokens& answer);

/// The answer part of a sample whose first `prompt_length` ids are prompt: its ids and, for each, whether the
/// position before it has a label (the inverse of join_prompt_answer). Throws ConfigError when prompt_length is
/// outside [0, length].
AnswerTokens answer_of(const Sample& sample, int64_t prompt_length);

/// One encoded preference pair. chosen and rejected begin with the same `prompt_length` ids, and hold the same
/// images (the prompt's: the same tensors, decoded once).
struct PreferenceSample {
  Sample chosen;               // [P + Lc] ids: prompt + chosen answer; labels on the answer only
  Sample rejected;             // [P + Lr] ids: the same prompt + rejected answer; labels on the answer only
  int64_t prompt_length = 0;   // P
  double margin = 0;           // the row's margin (reward modelling), 0 when it has none
};

/// One encoded KTO example.
struct KtoSample {
  Sample completion;           // [P + L] ids: prompt + completion; labels on the completion only
  int64_t prompt_length = 0;   // P
  bool desirable = true;       // the row's label (a pair row's chosen answer: true, its rejected one: false)
};

/// Encodes preference rows through a chat template, as SampleEncoder encodes SFT conversations with loss_scale
/// last_round: only the final answer (and its end-of-turn marker) is trained; earlier assistant turns are prompt.
///
/// Tokenisation. The prompt's ids are shared by both answers. With a chat template they are exactly what inference
/// feeds (SampleEncoder::encode_prompt: the render with the generation prompt, special-token strings parsed, BOS as
/// the tokenizer adds it), and an answer's ids are those of the SFT encoding of prompt + answer (the whole render
/// tokenised at once) after the prompt's ids, when that encoding begins with them and trains nothing inside them.
/// That holds wherever the tokenizer does not merge text across the point where the answer starts. Where it does
/// (for instance an answer that starts with newlines after ChatML's "assistant\n" in a byte-level BPE, where "\n\n"
/// is one token), the answer's trained text (content and end-of-turn marker) and the text after it are tokenised on
/// their own and appended, as TRL's tokenize_row tokenises prompt and answer separately. Without a chat template
/// (raw text) the prompt is the messages' contents joined by "\n" (a single user turn: its text) with BOS, and the
/// answer is tokenised on its own followed by EOS, as TRL's tokenize_row lays them out. Rows with images are
/// refused at normalisation.
///
/// Images (options.images set): the prompt's kImagePlaceholders take the family's markup, the answers are found
/// after the prompt as for text (one image token per image), then each image token of the prompt is expanded to its
/// image's run. The images are opened and counted from their headers first: a pair dropped by its length decodes
/// none, and only the images whose runs the kept prompt holds are decoded, once for both answers.
class PreferenceEncoder {
 public:
  /// `chat_template` null means raw text. Throws ConfigError when max_length < 2, or when truncation is "left" or
  /// "right" and max_prompt_length is not in [1, max_length).
  PreferenceEncoder(std::shared_ptr<const TextTokenizer> tokenizer, std::shared_ptr<const ChatTemplate> chat_template,
                    PreferenceEncodeOptions options);

  /// The prompt's ids (see the class comment), one image token per kImagePlaceholder (unexpanded). Throws
  /// BadRowError naming `where` when the chat template rejects the messages ("rejected by the chat template").
  std::vector<int32_t> encode_prompt(const std::vector<ChatMessage>& prompt, const std::string& where) const;

  /// One answer's ids after `prompt_ids` (which must be encode_prompt(prompt)), untruncated. Throws BadRowError
  /// naming `where` when the chat template rejects the conversation.
  AnswerTokens encode_answer(const std::vector<ChatMessage>& prompt, const std::vector<int32_t>& prompt_ids,
                             const std::string& answer, const std::string& where) const;

  /// The pair of a pair row, or nullopt when truncation "delete" drops it or an answer keeps no trained token.
  /// Throws BadRowError naming row.where for a row without a rejected answer ("no rejected answer"), like
  /// encode_answer, and for images as SampleEncoder::encode does ("images need a vision-language model", "image
  /// count mismatch", "image in an assistant message", "media token in the text", "image unreadable").
  std::optional<PreferenceSample> encode_pair(const PreferenceRow& row) const;

  /// The KTO examples of a row, in order: a KTO row gives one (desirable = its label), a pair row two (its chosen
  /// answer desirable, then its rejected answer undesirable, as TRL's unpair_preference_dataset splits pairs). An
  /// example that truncation "delete" drops, or that keeps no trained token, is nullopt. Throws like encode_answer.
  std::vector<std::optional<KtoSample>> encode_kto(const PreferenceRow& row) const;

  /// A generation prompt (GRPO's): the ids encode_prompt gives with each image token expanded to its image's run,
  /// and the images decoded (EncodedPrompt's layout). A prompt longer than `max_tokens` is nullopt, or with
  /// `keep_end` keeps its last max_tokens tokens, the cut moved off image runs (an image it would split is left out
  /// whole, its pixels too; nullopt when nothing is left). The images are counted from their headers first: a
  /// prompt dropped for its length decodes none. Throws BadRowError naming `where` as encode_pair does.
  std::optional<EncodedPrompt> encode_generation_prompt(const std::vector<ChatMessage>& prompt,
                                                        const std::vector<fs::path>& images, const std::string& where,
                                                        int64_t max_tokens, bool keep_end) const;

  /// A stable text of everything here that decides the encoded samples (template name, length and image
  /// settings), for cache keys. Does not throw.
  std::string fingerprint() const;

  const PreferenceEncodeOptions& options() const { return options_; }

 private:
  /// A row's prompt: its ids with one image token per image (the answers are split off after these), the messages
  /// as rendered (image markup in place), and with images the expanded ids, each image's run and its plan.
  struct Prompt {
    std::vector<ChatMessage> messages;
    std::vector<int32_t> ids;       // one image token per image
    std::vector<int32_t> expanded;  // each image token expanded to its image's run (= ids without images)
    std::vector<TokenSpan> runs;    // in `expanded`, one per image
    std::vector<PlannedImage> images;
    std::vector<std::optional<vision::ProcessedImage>> decoded;  // per image, once decoded (shared by the answers)
  };
  Prompt prompt_of(const PreferenceRow& row) const;
  /// The answer's ids after the prompt; refuses an answer holding an image or a typed media token.
  AnswerTokens answer_of_row(const Prompt& prompt, const std::string& answer, const PreferenceRow& row) const;
  /// The images whose runs lie in the kept prompt [cut.prompt_begin, cut.prompt_end), each decoded once per row,
  /// into `sample` (pixel_values, image_grids, image_tokens; the other fields untouched).
  void add_images(const PreferenceRow& row, Prompt& prompt, const PreferenceCut& cut, Sample& sample) const;

  SampleEncoder sft_;  // loss_scale last_round, no length limit: the SFT encoding of prompt + answer (text only)
  std::optional<SampleEncoder> media_;  // with the image settings: typed media tokens, image planning and decoding
  PreferenceEncodeOptions options_;
};

/// A batch of preference pairs as TRL's concatenated_forward runs it: one right-padded batch of 2B rows.
struct PreferenceBatch {
  Batch batch;        // [2B, T]: rows 0..B-1 prompt + chosen of pairs 0..B-1, rows B..2B-1 prompt + rejected of the
                      // same pairs; T is the longest of all 2B rows; labels only on the answers. pixel_values is
                      // undefined (the images are `images`); image_grid_thw is [2N, 3], every row's grids
  at::Tensor margin;  // [B] float32, each pair's margin (0 when the row had none)
  /// The pairs' prompt images once (batch_images of the chosen rows): their features serve the chosen rows and
  /// then the rejected rows, which hold the same images in the same order. Empty without images.
  ImageInputs images;
};

/// Collates `pairs` (B >= 1) into a PreferenceBatch, padding with `pad_id` (labels kIgnoreIndex, key_valid false).
/// Throws ConfigError when `pairs` is empty.
PreferenceBatch collate_preference(const std::vector<const PreferenceSample*>& pairs, int32_t pad_id);

/// The mismatched rows of TRL's KL estimate for one block of B >= 2 KTO examples (TRL's _get_kl_dataset, over a
/// global batch): row i is the prompt of example i followed by the completion of example B-1-i (the completions
/// reversed, the prompts in place), labelled on that completion. A row longer than max_length is cut as an example
/// is: with "left"/"right" by cut_preference_lengths' rule on the two parts; with "delete" (nothing may be dropped
/// here) the completion keeps its first max_length - prompt ids (at least one). The parts are those kept for their
/// own examples, so where truncation shortened them a row can differ from TRL's, which re-truncates the untruncated
/// texts. A row holds the images of its prompt (example i's) that the cut keeps whole. Throws ConfigError when the
/// block has fewer than 2 examples (TRL refuses a KL term for batch size 1), and when options.images is unset but an
/// example has images.
std::vector<Sample> kto_kl_samples(const std::vector<const KtoSample*>& block, const PreferenceEncodeOptions& options);

/// A batch of KTO examples with its KL rows.
struct KtoBatch {
  Batch completions;     // [B, T]: prompt + completion of each example, right-padded; labels on completions
  at::Tensor desirable;  // [B] bool
  Batch kl;              // [B, T_kl]: the KL rows (kto_kl_samples), right-padded; undefined tensors when none given
};

/// Collates `examples` and, when given, their `kl` rows (one per example, as kto_kl_samples makes them) with
/// `pad_id`. Throws ConfigError when `examples` is empty or `kl` is neither empty nor of the same size.
KtoBatch collate_kto(const std::vector<const KtoSample*>& examples, const std::vector<const Sample*>& kl,
                     int32_t pad_id);

/// Prepared preference pairs: training and validation pairs and what was read, made and skipped. stats.samples
/// counts pairs; tokens and label_tokens count both sequences of each pair.
struct PreferenceData {
  std::vector<PreferenceSample> train;
  std::vector<PreferenceSample> validation;
  DataStats stats;
};

/// Prepared KTO examples; stats.samples counts examples.
struct KtoData {
  std::vector<KtoSample> train;
  std::vector<KtoSample> validation;
  DataStats stats;
};

/// Reads, normalises (normalise_preference_row, task kPairs) and encodes every row of options.dataset as
/// prepare_data does for SFT: streamed, on num_threads workers in input order; pairs dropped by truncation counted
/// as "longer than max_length or nothing to train"; bad rows thrown (strict, BadRowError naming file:line) or counted
/// by reason; training pairs shuffled with the seed; validation from val_dataset or split off
/// (split_dataset_ratio). With a cache_dir, the result is stored (layout in docs/formats.md) under a key hashed from
/// the dataset files' bytes, `fingerprint` (tokenizer files and template), encoder.fingerprint() and the options,
/// and later calls with the same key load it; a damaged file or one of another kind or version is rebuilt. Throws
/// ConfigError, BadRowError, IoError and FormatError as prepare_data does.
PreferenceData prepare_preference_data(const DataOptions& options, const PreferenceEncoder& encoder,
                                       const std::string& fingerprint);

/// prepare_preference_data for KTO (task kKto): each row gives one example, a pair row two (encode_kto); an example
/// dropped by truncation is counted as "longer than max_length or nothing to train". The cache is of its own kind.
KtoData prepare_kto_data(const DataOptions& options, const PreferenceEncoder& encoder, const std::string& fingerprint);

}  // namespace swiftcpp
