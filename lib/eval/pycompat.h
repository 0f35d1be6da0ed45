// Python's string, number and random semantics that benchmark scoring code relies on, so that rules written for
// CPython give the same answers here: str.strip/split/lower on Unicode text, float() parsing, round(x, n),
// statistics.mean, numpy.mean, ast.literal_eval of a list of strings, and random.seed/choice (Mersenne Twister).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swiftcpp::eval::py {

/// `s` with each byte that starts no valid UTF-8 sequence (overlong forms, surrogates and code points past U+10FFFF
/// included) replaced by U+FFFD, as Python decodes bytes with errors="replace"; `s` itself when it is valid.
std::string repair_utf8(std::string_view s);
/// UTF-8 text as code points (repaired as repair_utf8 does) and back.
std::u32string decode(std::string_view s);
std::string encode(const std::u32string& s);
/// len(str): the number of code points.
size_t len(std::string_view s);

/// str.isspace() of one character: ASCII whitespace, \x1c-\x1f, U+0085, U+00A0 and the Unicode space separators.
bool is_space(char32_t c);
/// str.isalpha() of one character: letters of the Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, kana, CJK and
/// Hangul blocks (the other scripts count as not letters here).
bool is_alpha(char32_t c);
/// str.lower(): ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and full-width letters.
std::string lower(std::string_view s);
/// str.upper() of ASCII letters only (enough for option letters).
std::string upper_ascii(std::string_view s);
/// str.strip() / lstrip() / rstrip() without arguments (Unicode whitespace).
std::string strip(std::string_view s);
std::string rstrip(std::string_view s);
/// str.strip(chars) with ASCII `chars`.
std::string strip_chars(std::string_view s, std::string_view chars);
/// str.split() without arguments: runs of Unicode whitespace separate, no empty pieces.
std::vector<std::string> split(std::string_view s);
/// s.split(sep)[-1]: the text after the last `sep` (all of s when absent).
std::string after_last(std::string_view s, std::string_view sep);
/// str.replace(old, new) for every occurrence.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

/// float(s): surrounding Unicode whitespace, a sign ("+" or ASCII "-"), digits of any script's decimal digits
/// (Unicode Nd), "_" between digits, a fraction, an exponent, "inf"/"infinity"/"nan" in any case; nullopt where
/// Python raises ValueError.
std::optional<double> to_float(std::string_view s);
/// round(x, ndigits) for a double: the double nearest to x correctly rounded to `ndigits` decimals.
double round_to(double x, int ndigits);
/// repr(float): the shortest text that reads back as x ("1000.0", "0.1", "1e+16", "inf", "nan").
std::string float_repr(double x);

/// sum(values) / len(values), summed left to right (lm-eval's mean).
double sequential_mean(const std::vector<double>& values);
/// numpy.mean of a float64 array: numpy's pairwise summation, then / n.
double numpy_mean(const std::vector<double>& values);
/// statistics.mean: the exact mean of the doubles, rounded once.
double exact_mean(const std::vector<double>& values);

/// The strings of a Python list literal of string literals ("['a', \"b\"]"), as eval() gives them; nullopt when the
/// text is not such a literal (ast.literal_eval would fail or give something else).
std::optional<std::vector<std::string>> list_literal(std::string_view s);

/// CPython's random.Random: MT19937 seeded as random.seed(int) seeds it, getrandbits and choice.
class Random {
 public:
  explicit Random(uint64_t seed = 0) { this->seed(seed); }
  void seed(uint64_t seed);
  uint32_t getrandbits(int k);  // 1 <= k <= 32
  /// random.randrange(n) / choice index: _randbelow(n) by rejection on n.bit_length() bits.
  uint64_t randbelow(uint64_t n);

 private:
  uint32_t next();
  uint32_t state_[624] = {};
  int index_ = 624;
};

}  // namespace swiftcpp::eval::py
