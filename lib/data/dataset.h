// Dataset files: JSON arrays and JSONL rows in the ms-swift forms, normalised to conversations.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/fs.h"
#include "core/json.h"
#include "template/template.h"

namespace swiftcpp {

/// The form a row was recognised as.
enum class RowFormat { kMessages, kShareGpt, kAlpaca, kQueryResponse, kText };

/// One training example: a conversation (for a chat template) or plain text (continued pre-training: loss on
/// every token, no template).
struct Conversation {
  RowFormat format = RowFormat::kMessages;
  std::vector<ChatMessage> messages;  // empty for kText
  std::string text;                   // kText only
  std::string where;                  // "file:line" (JSONL) or "file[#index]" (JSON array), for messages
  /// The images of the row, one per kImagePlaceholder in the text, in order of appearance (messages in order).
  /// A relative path in the row is taken relative to the dataset file's folder; an absolute one is kept.
  std::vector<fs::path> images;
};

/// The text that marks where an image goes in a message ("<image>", as ms-swift and LLaVA write it). A
/// vision-language tokenizer maps it to the model's image token.
constexpr std::string_view kImagePlaceholder = "<image>";

/// The number of non-overlapping kImagePlaceholder occurrences in `text`. Does not throw.
int64_t count_image_placeholders(std::string_view text);

/// A bad row: what was wrong and where. The reason is a short stable phrase used to count skips.
class BadRowError : public FormatError {
 public:
  BadRowError(const std::string& where, std::string reason, const std::string& detail)
      : FormatError(where + ": " + reason + (detail.empty() ? "" : " (" + detail + ")")), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

/// Refuses (BadRowError "unsupported column", naming the column) a row with a non-empty ms-swift column that
/// swiftcpp does not train from yet: "videos", "audios", "objects" (grounding). Taken as text, their tags would be
/// trained as words. Null and empty columns pass.
void refuse_unsupported_columns(const Json& row, const std::string& where);

/// Recognises and normalises one row (auto-detected per row):
///   {"messages": [{"role", "content", "loss"?|"loss_weight"?}]}   content: string or a list of parts
///   {"conversations": [{"from": human|gpt|system, "value"}], "system"?}                        (ShareGPT)
///   {"instruction", "input"?, "output", "system"?, "history"?}                                 (Alpaca)
///   {"query", "response", "history"?: [[q, a], ...], "system"?}
///   {"text": "..."}                                                                            (plain text)
/// Content parts: {"type": "text", "text"|"value": "..."}, {"type": "image", "image": path | {"path": path}} and
/// {"type": "image_url", "image_url": path | {"url": path}} (a local path, "file://" allowed); an image part
/// becomes kImagePlaceholder at its place in the text and its path is appended to the row's images.
/// Every form may carry "images": a list of paths (strings or {"path": ...}) or a single path string, one per
/// placeholder in order. Relative image paths are resolved against `base_dir` (the dataset file's folder; empty:
/// left relative). `system_override`, when set, replaces the row's system prompt (or adds one).
/// Throws BadRowError naming `where` when the row has an unsupported column (refuse_unsupported_columns), no
/// assistant turn, roles out of order (after an optional
/// system message, user and assistant must alternate, starting with user and ending with assistant), a
/// non-string content, tool-call roles (not supported yet) or an unknown form; and, for a row that has images
/// (an "images" column or image parts), when "images" is malformed ("bad images"), both an "images" column and
/// image parts hold images ("images given twice"), an assistant message holds an image ("image in an assistant
/// message") or the placeholders over all messages do not match the images in number ("image count mismatch",
/// naming both counts). A row without images keeps any "<image>" text as it is (the encoder of a
/// vision-language model then refuses it).
Conversation normalise_row(const Json& row, const std::string& where,
                           const std::optional<std::string>& system_override = std::nullopt,
                           const fs::path& base_dir = {});

/// A message content as normalise_row reads it: a string, or a list of text parts ({"type": "text", "text"|"value"})
/// and image parts ({"type": "image", "image": path | {"path"}} / {"type": "image_url", "image_url": url |
/// {"url"}}), each image part written as kImagePlaceholder with its path appended to `image_paths`. Throws
/// BadRowError naming `where` ("non-text content", "non-string content", "bad images").
std::string message_content_text(const Json& content, const std::string& where, std::vector<std::string>& image_paths);

/// The images of a prompt as normalise_row attaches them to a conversation: the row's "images" column (when it has
/// one that is not null) or the paths of the messages' image parts (`part_paths`, as message_content_text gave
/// them), in placeholder order, relative paths resolved against `base_dir`. Throws BadRowError naming `where` as
/// normalise_row does ("bad images", "images given twice", "image in an assistant message", "image count mismatch").
std::vector<fs::path> prompt_images(const Json& row, const std::vector<ChatMessage>& messages,
                                    const std::vector<std::string>& part_paths, const std::string& where,
                                    const fs::path& base_dir);

/// A dataset argument "path" or "path#N" (the first N rows).
struct DatasetSource {
  fs::path path;
  std::optional<int64_t> limit;
};
/// Parses "path[#N]". Throws ConfigError when N is not a positive integer.
DatasetSource parse_dataset_source(const std::string& spec);

/// Streams the rows of a JSONL file (one object per line, blank lines skipped) or a JSON file holding one array
/// of objects, without reading the whole file into memory; calls `on_row(row, where)` for each, stopping
/// after `limit` rows. A line that is not valid JSON is reported to `on_bad(where, reason, detail)`, which
/// may throw. Throws IoError when the file cannot be read, FormatError when a .json file is not an array.
void for_each_row(const DatasetSource& source, const std::function<void(Json&&, const std::string&)>& on_row,
                  const std::function<void(const std::string&, const std::string&, const std::string&)>& on_bad);

/// Counts of rows skipped by reason, for the summary at the end of preprocessing.
struct SkipCounts {
  std::map<std::string, int64_t> by_reason;
  int64_t total() const;
  void add(const std::string& reason, int64_t n = 1) { by_reason[reason] += n; }
  /// "3 rows skipped: 2 no assistant turn, 1 invalid JSON" (empty string when none).
  std::string summary() const;
};

}  // namespace swiftcpp
