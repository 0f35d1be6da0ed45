#include "data/dataset.h"

#include <charconv>
#include <fstream>

namespace swiftcpp {

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& reason, const std::string& detail = "") {
  throw BadRowError(where, reason, detail);
}

std::string string_field(const Json& row, const char* key, const std::string& where) {
  const Json& v = row.at(key);
  if (!v.is_string()) bad(where, "non-string content", std::string("'") + key + "' is " + v.type_name());
  return v.get<std::string>();
}

// An image path as a row writes it: a local path, optionally as a file:// URL. Remote images are not fetched.
std::string image_path_text(const Json& value, const char* key, const std::string& where) {
  if (!value.is_string()) {
    bad(where, "bad images", std::string("an image ") + key + " must be a string, got " + describe_json(value));
  }
  std::string path = value.get<std::string>();
  if (path.rfind("file://", 0) == 0) path.erase(0, 7);
  if (path.rfind("http://", 0) == 0 || path.rfind("https://", 0) == 0 || path.rfind("data:", 0) == 0) {
    bad(where, "bad images", "'" + path.substr(0, 64) + "': only local image files are supported");
  }
  if (path.empty()) bad(where, "bad images", "an empty image path");
  if (path.find('\0') != std::string::npos) bad(where, "bad images", "an image path holding a NUL character");
  return path;
}

// One entry of an "images" column or of an image part: a path string or {"path": string} ({"url": string} for
// image_url parts).
std::string image_entry(const Json& entry, const char* object_key, const std::string& where) {
  if (entry.is_object()) {
    if (!entry.contains(object_key)) {
      bad(where, "bad images",
          std::string("an image object needs a '") + object_key + "', got " + describe_json(entry));
    }
    return image_path_text(entry.at(object_key), object_key, where);
  }
  return image_path_text(entry, "path", where);
}

// A message content: a string, or a list of parts: {"type": "text", "text"|"value": "..."}, or an image part
// ({"type": "image", "image": ...} / {"type": "image_url", "image_url": ...}), written as the placeholder at its
// place with its path appended to `images`.
std::string content_text(const Json& content, const std::string& where, std::vector<std::string>& images) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (const auto& part : content) {
      // (part.value("type", "") would throw nlohmann's type_error on a "type" that is not a string.)
      if (!part.is_object() || !part.contains("type") || !part.at("type").is_string()) {
        bad(where, "non-text content", "a content part needs a string 'type', got " + describe_json(part));
      }
      const std::string type = part.at("type").get<std::string>();
      if (type == "image" || type == "image_url") {
        const char* key = type == "image" ? "image" : "image_url";
        if (!part.contains(key)) bad(where, "bad images", "an image part without '" + std::string(key) + "'");
        images.push_back(image_entry(part.at(key), type == "image" ? "path" : "url", where));
        text += kImagePlaceholder;
        continue;
      }
      if (type != "text") {
        bad(where, "non-text content", "only text and image parts are supported, got " + describe_json(part));
      }
      const char* key = part.contains("text") ? "text" : "value";
      if (!part.contains(key) || !part.at(key).is_string()) bad(where, "non-string content", "text part without a string");
      text += part.at(key).get<std::string>();
    }
    return text;
  }
  bad(where, "non-string content", std::string("content is ") + content.type_name());
}

// The "images" column: null (none), a path string, or a list of path strings / {"path": string}.
std::vector<std::string> images_column(const Json& row, const std::string& where) {
  std::vector<std::string> images;
  const Json& column = row.at("images");
  if (column.is_string()) {
    images.push_back(image_path_text(column, "path", where));
  } else if (column.is_array()) {
    for (const auto& entry : column) images.push_back(image_entry(entry, "path", where));
  } else if (!column.is_null()) {
    bad(where, "bad images", std::string("'images' must be a list of paths or a path, got ") + column.type_name());
  }
  return images;
}

std::string normalise_role(const std::string& role, const std::string& where) {
  if (role == "system") return "system";
  if (role == "user" || role == "human") return "user";
  if (role == "assistant" || role == "gpt" || role == "model") return "assistant";
  if (role == "function_call" || role == "observation" || role == "tool" || role == "function") {
    bad(where, "tool-call rows are not supported yet", "role '" + role + "'");
  }
  bad(where, "unknown role", "'" + role + "'");
}

// After an optional system message: user, assistant, user, assistant, ..., ending with assistant.
void check_order(const std::vector<ChatMessage>& messages, const std::string& where) {
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") i = 1;
  bool has_assistant = false;
  for (size_t k = i; k < messages.size(); ++k) {
    const char* expected = (k - i) % 2 == 0 ? "user" : "assistant";
    if (messages[k].role != expected) {
      if (messages[k].role == "system") bad(where, "wrong role order", "a system message after the first turn");
      bad(where, "wrong role order", "message " + std::to_string(k) + " is '" + messages[k].role + "', expected '" +
                                         expected + "'");
    }
    has_assistant = has_assistant || messages[k].role == "assistant";
  }
  if (!has_assistant) bad(where, "no assistant turn");
  if (messages.back().role != "assistant") bad(where, "wrong role order", "the last message is not the assistant's");
}

void apply_system(std::vector<ChatMessage>& messages, const std::optional<std::string>& system) {
  if (!system) return;
  if (!messages.empty() && messages[0].role == "system") {
    messages[0].content = *system;
  } else {
    messages.insert(messages.begin(), ChatMessage{"system", *system, std::nullopt});
  }
}

void add_history(std::vector<ChatMessage>& messages, const Json& row, const std::string& where) {
  if (!row.contains("history") || row.at("history").is_null()) return;
  const Json& history = row.at("history");
  if (!history.is_array()) bad(where, "bad history", "'history' must be a list of [query, response] pairs");
  for (const auto& pair : history) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string()) {
      bad(where, "bad history", "each history entry must be [query, response] strings");
    }
    messages.push_back({"user", pair[0].get<std::string>(), std::nullopt});
    messages.push_back({"assistant", pair[1].get<std::string>(), std::nullopt});
  }
}

// The images of a row in placeholder order, their paths resolved against `base_dir`, after checking them against
// the placeholders of the normalised conversation (only for rows that declare images: a text row's "<image>"
// stays text).
void attach_images(Conversation& c, const std::vector<std::string>& column, const std::vector<std::string>& parts,
                   bool declared, const fs::path& base_dir) {
  if (!declared) return;
  if (!column.empty() && !parts.empty()) {
    bad(c.where, "images given twice",
        fmt::format("{} in the 'images' column and {} as content parts; use one or the other", column.size(),
                    parts.size()));
  }
  int64_t placeholders = count_image_placeholders(c.text);
  for (size_t i = 0; i < c.messages.size(); ++i) {
    const int64_t n = count_image_placeholders(c.messages[i].content);
    if (c.messages[i].role == "assistant" && n > 0) {
      bad(c.where, "image in an assistant message", fmt::format("message {} holds an image", i));
    }
    placeholders += n;
  }
  const std::vector<std::string>& paths = parts.empty() ? column : parts;
  if (placeholders != static_cast<int64_t>(paths.size())) {
    bad(c.where, "image count mismatch",
        fmt::format("{} {} placeholder(s) in the text, {} image(s) given", placeholders, kImagePlaceholder,
                    paths.size()));
  }
  for (const std::string& p : paths) {
    const fs::path path(p);
    c.images.push_back(path.is_absolute() || base_dir.empty() ? path : base_dir / path);
  }
}

}  // namespace

std::string message_content_text(const Json& content, const std::string& where, std::vector<std::string>& image_paths) {
  return content_text(content, where, image_paths);
}

std::vector<fs::path> prompt_images(const Json& row, const std::vector<ChatMessage>& messages,
                                    const std::vector<std::string>& part_paths, const std::string& where,
                                    const fs::path& base_dir) {
  Conversation c;
  c.where = where;
  c.messages = messages;
  const bool has_column = row.is_object() && row.contains("images") && !row.at("images").is_null();
  const std::vector<std::string> column = has_column ? images_column(row, where) : std::vector<std::string>{};
  attach_images(c, column, part_paths, has_column || !part_paths.empty(), base_dir);
  return c.images;
}

int64_t count_image_placeholders(std::string_view text) {
  int64_t n = 0;
  for (size_t at = text.find(kImagePlaceholder); at != std::string_view::npos;
       at = text.find(kImagePlaceholder, at + kImagePlaceholder.size())) {
    ++n;
  }
  return n;
}

void refuse_unsupported_columns(const Json& row, const std::string& where) {
  if (!row.is_object()) return;
  for (const char* key : {"videos", "audios", "objects"}) {
    if (!row.contains(key)) continue;
    const Json& v = row.at(key);
    if (v.is_null() || ((v.is_array() || v.is_object()) && v.empty()) ||
        (v.is_string() && v.get_ref<const std::string&>().empty())) {
      continue;
    }
    bad(where, "unsupported column",
        fmt::format("'{}': {} are not supported yet; remove the column or the row", key,
                    std::string(key) == "objects" ? "grounding objects" : key));
  }
}

Conversation normalise_row(const Json& row, const std::string& where, const std::optional<std::string>& system_override,
                           const fs::path& base_dir) {
  if (!row.is_object()) bad(where, "unknown format", std::string("a row must be a JSON object, got ") + row.type_name());
  refuse_unsupported_columns(row, where);
  Conversation c;
  c.where = where;
  const bool has_column = row.contains("images") && !row.at("images").is_null();
  const std::vector<std::string> column = has_column ? images_column(row, where) : std::vector<std::string>{};
  std::vector<std::string> parts;  // paths of image content parts, in order
  // An image part in an assistant message is refused at once (the model reads images, it never writes them).
  const auto check_part_owner = [&](const std::string& role, size_t images_before, size_t index) {
    if (role == "assistant" && parts.size() > images_before) {
      bad(where, "image in an assistant message", fmt::format("message {} holds an image part", index));
    }
  };
  std::optional<std::string> system;
  if (row.contains("system") && !row.at("system").is_null()) system = string_field(row, "system", where);
  if (system_override) system = system_override;

  if (row.contains("messages")) {
    c.format = RowFormat::kMessages;
    const Json& list = row.at("messages");
    if (!list.is_array()) bad(where, "unknown format", "'messages' must be a list");
    for (const auto& m : list) {
      if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m.at("role").is_string()) {
        bad(where, "unknown format", "each message needs a string 'role' and a 'content'");
      }
      const size_t images_before = parts.size();
      ChatMessage msg{normalise_role(m.at("role").get<std::string>(), where),
                      content_text(m.at("content"), where, parts), std::nullopt};
      check_part_owner(msg.role, images_before, c.messages.size());
      // Loss flags matter on assistant turns only; other roles are never trained.
      if (msg.role == "assistant") {
        if (m.contains("loss") && m.at("loss").is_boolean()) msg.loss = m.at("loss").get<bool>();
        if (m.contains("loss_weight") && m.at("loss_weight").is_number()) msg.loss = m.at("loss_weight").get<double>() != 0.0;
      }
      c.messages.push_back(std::move(msg));
    }
  } else if (row.contains("conversations")) {
    c.format = RowFormat::kShareGpt;
    const Json& list = row.at("conversations");
    if (!list.is_array()) bad(where, "unknown format", "'conversations' must be a list");
    for (const auto& m : list) {
      if (!m.is_object() || !m.contains("from") || !m.contains("value") || !m.at("from").is_string()) {
        bad(where, "unknown format", "each ShareGPT turn needs a string 'from' and a 'value'");
      }
      const size_t images_before = parts.size();
      c.messages.push_back({normalise_role(m.at("from").get<std::string>(), where),
                            content_text(m.at("value"), where, parts), std::nullopt});
      check_part_owner(c.messages.back().role, images_before, c.messages.size() - 1);
    }
  } else if (row.contains("instruction") || (row.contains("output") && !row.contains("query"))) {
    c.format = RowFormat::kAlpaca;
    if (!row.contains("instruction")) bad(where, "unknown format", "an Alpaca row needs 'instruction'");
    if (!row.contains("output")) bad(where, "no assistant turn", "an Alpaca row needs 'output'");
    add_history(c.messages, row, where);
    std::string prompt = string_field(row, "instruction", where);
    if (row.contains("input") && !row.at("input").is_null()) {
      const std::string input = string_field(row, "input", where);
      if (!input.empty()) prompt += "\n" + input;
    }
    c.messages.push_back({"user", prompt, std::nullopt});
    c.messages.push_back({"assistant", string_field(row, "output", where), std::nullopt});
  } else if (row.contains("query")) {
    c.format = RowFormat::kQueryResponse;
    if (!row.contains("response")) bad(where, "no assistant turn", "a query row needs 'response'");
    add_history(c.messages, row, where);
    c.messages.push_back({"user", string_field(row, "query", where), std::nullopt});
    c.messages.push_back({"assistant", string_field(row, "response", where), std::nullopt});
  } else if (row.contains("text")) {
    c.format = RowFormat::kText;
    c.text = string_field(row, "text", where);
    if (c.text.empty()) bad(where, "empty text");
    attach_images(c, column, parts, has_column, base_dir);
    return c;
  } else {
    std::string keys;
    for (auto it = row.begin(); it != row.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
    bad(where, "unknown format",
        "keys {" + keys + "}; expected messages, conversations, instruction/output, query/response or text");
  }
  apply_system(c.messages, system);
  if (c.messages.empty()) bad(where, "no assistant turn", "the conversation is empty");
  check_order(c.messages, where);
  attach_images(c, column, parts, has_column || !parts.empty(), base_dir);
  return c;
}

DatasetSource parse_dataset_source(const std::string& spec) {
  DatasetSource s;
  const size_t hash = spec.rfind('#');
  if (hash == std::string::npos) {
    s.path = spec;
    return s;
  }
  s.path = spec.substr(0, hash);
  const std::string n = spec.substr(hash + 1);
  int64_t limit = 0;
  const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), limit);
  if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || ec != std::errc() ||
      end != n.data() + n.size() || limit <= 0) {
    fail<ConfigError>("dataset '{}': the part after '#' must be a positive row count of at most {}", spec, INT64_MAX);
  }
  s.limit = limit;
  return s;
}

void for_each_row(const DatasetSource& source, const std::function<void(Json&&, const std::string&)>& on_row,
                  const std::function<void(const std::string&, const std::string&, const std::string&)>& on_bad) {
  const std::string file = source.path.string();
  require_regular_file(source.path, "dataset");
  std::ifstream in(source.path, std::ios::binary);
  if (!in) fail<IoError>("cannot open dataset '{}'", file);
  const int64_t limit = source.limit.value_or(INT64_MAX);
  int64_t rows = 0;
  // A JSON array starts with '['; anything else is read as JSONL.
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {}
  if (!in) return;  // empty file: no rows
  in.unget();
  if (first == '[') {
    struct Stop {};
    int64_t index = 0;
    auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (depth > kMaxJsonDepth) {
        fail<FormatError>("{}: invalid JSON in row #{}: arrays and objects nested deeper than {} levels", file, index,
                          kMaxJsonDepth);
      }
      if (depth == 1 && (event == Json::parse_event_t::object_end || event == Json::parse_event_t::array_end ||
                         event == Json::parse_event_t::value)) {
        const std::string where = fmt::format("{}[#{}]", file, index++);
        on_row(std::move(parsed), where);
        if (++rows >= limit) throw Stop{};
        return false;  // discard: the array is never held whole
      }
      return true;
    };
    try {
      const Json discarded = Json::parse(in, callback);  // rows go to the callback; the whole is left empty
      (void)discarded;
    } catch (const Stop&) {
    } catch (const nlohmann::json::parse_error& e) {
      fail<FormatError>("{}: invalid JSON at byte {} (after row #{}): {}", file, e.byte, index, e.what());
    } catch (const nlohmann::json::exception& e) {  // a number out of range of a double (1e999): out_of_range
      fail<FormatError>("{}: invalid JSON in row #{}: {}", file, index, e.what());
    }
    return;
  }
  std::string line;
  for (size_t number = 1; rows < limit && std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", file, number);
    Json row;
    std::string error;
    if (!try_parse_json(line, row, error)) {
      on_bad(where, "invalid JSON", error);
      continue;
    }
    on_row(std::move(row), where);
    ++rows;
  }
  if (in.bad()) fail<IoError>("error while reading dataset '{}'", file);
}

int64_t SkipCounts::total() const {
  int64_t n = 0;
  for (const auto& [reason, count] : by_reason) n += count;
  return n;
}

std::string SkipCounts::summary() const {
  if (by_reason.empty()) return "";
  std::string parts;
  for (const auto& [reason, count] : by_reason) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", count, reason);
  return fmt::format("{} rows skipped: {}", total(), parts);
}

}  // namespace swiftcpp
