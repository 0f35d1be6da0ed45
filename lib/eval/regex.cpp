#include "eval/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>

#include "core/error.h"
#include "eval/pycompat.h"

namespace swiftcpp::eval {

Pattern::Pattern(const std::string& pattern, bool unicode) : pattern_(pattern) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | (unicode ? PCRE2_UCP : 0u);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &code, &offset, nullptr);
  if (code_ == nullptr) {
    std::array<PCRE2_UCHAR, 256> buffer{};
    pcre2_get_error_message(code, buffer.data(), buffer.size());
    fail<ConfigError>("invalid regex '{}' at offset {}: {}", pattern, offset, reinterpret_cast<const char*>(buffer.data()));
  }
  uint32_t groups = 0;
  pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &groups);
  groups_ = static_cast<int>(groups);
}

Pattern::~Pattern() {
  pcre2_code_free(code_);
}

namespace {
// Match data of one call: a Pattern is shared (function-local statics), so nothing mutable lives in it.
struct MatchData {
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* data;
};
}  // namespace

bool Pattern::match_at(const std::string& s, size_t start, std::vector<size_t>& offsets,
                       pcre2_real_match_data_8* data) const {
  const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail<FormatError>("matching the regex '{}' failed (code {})", pattern_, rc);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
  offsets.assign(ov, ov + 2 * (groups_ + 1));
  return true;
}

namespace {
// The offset after a match: its end, or one character on for an empty match.
size_t next_start(const std::string& s, size_t begin, size_t end) {
  size_t start = end > begin ? end : end + 1;
  while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;  // stay on a character
  return start;
}
}  // namespace

std::vector<std::vector<std::string>> Pattern::find_all(const std::string& text, size_t max_matches) const {
  const std::string s = py::repair_utf8(text);
  std::vector<std::vector<std::string>> out;
  std::vector<size_t> ov;
  size_t start = 0;
  const MatchData data(code_);
  while (start <= s.size() && out.size() < max_matches && match_at(s, start, ov, data.data)) {
    std::vector<std::string> m;
    for (int g = 0; g <= groups_; ++g) {
      m.push_back(ov[2 * g] == PCRE2_UNSET ? std::string() : s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
    }
    out.push_back(std::move(m));
    start = next_start(s, ov[0], ov[1]);
  }
  return out;
}

std::vector<std::string> Pattern::search(const std::string& s) const {
  auto all = find_all(s, 1);
  return all.empty() ? std::vector<std::string>{} : std::move(all.front());
}

std::string Pattern::replace_all(const std::string& text, const std::string& replacement, size_t count) const {
  const std::string s = py::repair_utf8(text);
  std::string out;
  std::vector<size_t> ov;
  size_t last = 0, start = 0, done = 0;
  const MatchData data(code_);
  while (start <= s.size() && (count == 0 || done < count) && match_at(s, start, ov, data.data)) {
    out += s.substr(last, ov[0] - last);
    out += replacement;
    last = ov[1];
    ++done;
    start = next_start(s, ov[0], ov[1]);
  }
  if (last < s.size()) out += s.substr(last);
  return out;
}

}  // namespace swiftcpp::eval
