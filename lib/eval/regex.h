// Perl-compatible regular expressions (PCRE2) with Python's re semantics for what evaluation rules use: groups,
// (?i), (?s), classes, look-arounds; findall / search / sub with an empty match moving on by one character.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace swiftcpp::eval {

/// A compiled pattern. Subjects that are not valid UTF-8 (a model's output can hold any bytes) are matched, and
/// their matches returned, as py::repair_utf8 gives them (lib/eval/pycompat.h).
class Pattern {
 public:
  /// Safe to share between threads (each match allocates its own match data). Throws ConfigError naming the pattern and the offset of a syntax error. `unicode`: \d, \w, \s and \b follow
  /// Unicode properties, as a Python str pattern does (PCRE2_UCP); else they are ASCII.
  explicit Pattern(const std::string& pattern, bool unicode = false);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  /// Every non-overlapping match from the left (re.finditer): [0] the whole match, [1..] the groups ("" when
  /// unset).
  std::vector<std::vector<std::string>> find_all(const std::string& s, size_t max_matches = SIZE_MAX) const;
  /// The first match (re.search), or an empty vector when none.
  std::vector<std::string> search(const std::string& s) const;
  /// Every match replaced by `replacement` taken literally (re.sub(pattern, replacement, s, count)); `count` 0:
  /// all.
  std::string replace_all(const std::string& s, const std::string& replacement = "", size_t count = 0) const;
  std::string remove_all(const std::string& s) const { return replace_all(s); }

  int groups() const { return groups_; }

 private:
  // Offsets [begin, end) of each group of the next match at or after `start`; false when none.
  bool match_at(const std::string& s, size_t start, std::vector<size_t>& offsets, pcre2_real_match_data_8* data) const;

  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  int groups_ = 0;
};

}  // namespace swiftcpp::eval
