#include "eval/pycompat.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/text.h"

namespace swiftcpp::eval::py {

namespace {

// The length of the valid UTF-8 sequence at s[i] (no overlong forms, surrogates or code points past U+10FFFF), or
// 0 when there is none.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned b = at(0);
  const auto cont = [&](size_t k) { return (at(k) & 0xC0u) == 0x80u; };
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    const unsigned c = at(1);
    const bool second = b == 0xE0 ? (c >= 0xA0 && c <= 0xBF) : b == 0xED ? (c >= 0x80 && c <= 0x9F) : cont(1);
    return second && cont(2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const unsigned c = at(1);
    const bool second = b == 0xF0 ? (c >= 0x90 && c <= 0xBF) : b == 0xF4 ? (c >= 0x80 && c <= 0x8F) : cont(1);
    return second && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string repair_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) break;
    i += n;
  }
  if (i == s.size()) return std::string(s);
  std::string out(s.substr(0, i));
  while (i < s.size()) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

std::u32string decode(std::string_view raw) {
  const std::string repaired = repair_utf8(raw);
  const std::string_view s = repaired;
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + k]);
      ok = (t & 0xC0) == 0x80;
      c = (c << 6) | (t & 0x3F);
    }
    if (!ok) {
      out.push_back(b);
      ++i;
    } else {
      out.push_back(c);
      i += n;
    }
  }
  return out;
}

std::string encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t len(std::string_view s) { return decode(s).size(); }

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  if (c == 0xAA || c == 0xB5 || c == 0xBA) return true;
  if (c >= 0xC0 && c <= 0x24F) return c != 0xD7 && c != 0xF7;
  if (c >= 0x370 && c <= 0x3FF) return c != 0x375 && c != 0x37E && c != 0x384 && c != 0x385 && c != 0x387 && c != 0x3F6;
  if (c >= 0x400 && c <= 0x52F) return c < 0x482 || c > 0x489;
  return (c >= 0x531 && c <= 0x556) || (c >= 0x561 && c <= 0x587) || (c >= 0x5D0 && c <= 0x5EA) ||
         (c >= 0x620 && c <= 0x64A) || (c >= 0x3041 && c <= 0x3096) || (c >= 0x30A1 && c <= 0x30FA) ||
         (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xFF21 && c <= 0xFF3A) ||
         (c >= 0xFF41 && c <= 0xFF5A);
}

namespace {

char32_t lower_char(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';
    if (c == 0x178) return 0xFF;
    const bool even_upper = (c <= 0x137) || (c >= 0x14A && c <= 0x177);
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (even_upper && c % 2 == 0) return c + 1;
    if (odd_upper && c % 2 == 1) return c + 1;
    return c;
  }
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

// The value of a Unicode decimal digit (category Nd), or -1. Every Nd run is ten consecutive code points from 0.
int digit_value(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  static const char32_t kZeros[] = {
      0x660,   0x6F0,   0x7C0,   0x966,   0x9E6,   0xA66,   0xAE6,   0xB66,   0xBE6,   0xC66,   0xCE6,   0xD66,
      0xDE6,   0xE50,   0xED0,   0xF20,   0x1040,  0x1090,  0x17E0,  0x1810,  0x1946,  0x19D0,  0x1A80,  0x1A90,
      0x1B50,  0x1BB0,  0x1C40,  0x1C50,  0xA620,  0xA8D0,  0xA900,  0xA9D0,  0xA9F0,  0xAA50,  0xABF0,  0xFF10,
      0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730,
      0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC,
      0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0};
  for (char32_t z : kZeros) {
    if (c >= z && c < z + 10) return static_cast<int>(c - z);
  }
  return -1;
}

std::u32string strip_u32(const std::u32string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && is_space(s[b])) ++b;
  while (right && e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace

std::string lower(std::string_view s) {
  bool ascii = true;
  for (char ch : s) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& ch : out) ch = (ch >= 'A' && ch <= 'Z') ? static_cast<char>(ch + 32) : ch;
    return out;
  }
  std::u32string u = decode(s);
  for (char32_t& c : u) c = lower_char(c);
  return encode(u);
}

std::string upper_ascii(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = (ch >= 'a' && ch <= 'z') ? static_cast<char>(ch - 32) : ch;
  return out;
}

std::string strip(std::string_view s) { return encode(strip_u32(decode(s), true, true)); }
std::string rstrip(std::string_view s) { return encode(strip_u32(decode(s), false, true)); }

std::string strip_chars(std::string_view s, std::string_view chars) {
  size_t b = 0, e = s.size();
  while (b < e && chars.find(s[b]) != std::string_view::npos) ++b;
  while (e > b && chars.find(s[e - 1]) != std::string_view::npos) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  const std::u32string u = decode(s);
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && is_space(u[i])) ++i;
    const size_t b = i;
    while (i < u.size() && !is_space(u[i])) ++i;
    if (i > b) out.push_back(encode(u.substr(b, i - b)));
  }
  return out;
}

std::string after_last(std::string_view s, std::string_view sep) {
  const size_t at = s.rfind(sep);
  return at == std::string_view::npos ? std::string(s) : std::string(s.substr(at + sep.size()));
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  size_t last = 0;
  for (size_t at = s.find(from); at != std::string_view::npos; at = s.find(from, last)) {
    out.append(s.substr(last, at - last));
    out.append(to);
    last = at + from.size();
  }
  out.append(s.substr(last));
  return out;
}

std::optional<double> to_float(std::string_view text) {
  std::u32string u = strip_u32(decode(text), true, true);
  std::string ascii;
  for (char32_t c : u) {
    const int d = digit_value(c);
    if (d >= 0) {
      ascii += static_cast<char>('0' + d);
    } else if (c < 0x80) {
      ascii += static_cast<char>(c);
    } else {
      return std::nullopt;
    }
  }
  size_t i = 0;
  std::string clean;
  if (i < ascii.size() && (ascii[i] == '+' || ascii[i] == '-')) clean += ascii[i++];
  const std::string rest = lower(ascii.substr(i));
  if (rest == "inf" || rest == "infinity") return clean == "-" ? -HUGE_VAL : HUGE_VAL;
  if (rest == "nan") return std::nan("");
  // digitpart: digit ("_"? digit)*
  auto digits = [&](bool required) {
    const size_t start = i;
    while (i < ascii.size()) {
      if (std::isdigit(static_cast<unsigned char>(ascii[i]))) {
        clean += ascii[i++];
      } else if (ascii[i] == '_' && i > start && i + 1 < ascii.size() &&
                 std::isdigit(static_cast<unsigned char>(ascii[i - 1])) &&
                 std::isdigit(static_cast<unsigned char>(ascii[i + 1]))) {
        ++i;
      } else {
        break;
      }
    }
    return !required || i > start;
  };
  const size_t int_start = i;
  digits(false);
  const bool has_int = i > int_start;
  bool has_frac = false;
  if (i < ascii.size() && ascii[i] == '.') {
    clean += ascii[i++];
    const size_t frac_start = i;
    digits(false);
    has_frac = i > frac_start;
  }
  if (!has_int && !has_frac) return std::nullopt;
  if (i < ascii.size() && (ascii[i] == 'e' || ascii[i] == 'E')) {
    clean += ascii[i++];
    if (i < ascii.size() && (ascii[i] == '+' || ascii[i] == '-')) clean += ascii[i++];
    if (!digits(true)) return std::nullopt;
  }
  if (i != ascii.size()) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

double round_to(double x, int ndigits) {
  if (!std::isfinite(x)) return x;
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%.*f", std::clamp(ndigits, 0, 300), x);
  return std::strtod(buffer, nullptr);
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*e", precision - 1, x);
    if (std::strtod(buffer, nullptr) == x) break;
  }
  // buffer: [-]d.ddde[+-]XX
  std::string text = buffer;
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits = text.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exponent + 1;
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_text;
  }
  return negative ? "-" + out : out;
}

double sequential_mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

namespace {
double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}
}  // namespace

double numpy_mean(const std::vector<double>& values) {
  // numpy's add.reduce starts from the identity 0 and adds the pairwise sum of the whole array.
  const double sum = 0.0 + pairwise_sum(values.data(), values.size());
  return sum / static_cast<double>(values.size());
}

double exact_mean(const std::vector<double>& values) {
  if (values.empty()) return std::nan("");
  // Each value is m * 2^e with a 53-bit integer m; summed exactly as integers scaled to the smallest exponent.
  int emin = 0;
  bool first = true;
  std::vector<std::pair<int64_t, int>> parts;
  for (double v : values) {
    if (!std::isfinite(v)) return sequential_mean(values);
    int e = 0;
    const double f = std::frexp(v, &e);  // v = f * 2^e, 0.5 <= |f| < 1
    const auto m = static_cast<int64_t>(std::ldexp(f, 53));
    if (m == 0) continue;
    parts.emplace_back(m, e - 53);
    emin = first ? e - 53 : std::min(emin, e - 53);
    first = false;
  }
  if (parts.empty()) return 0.0;
  int emax = emin;
  for (const auto& p : parts) emax = std::max(emax, p.second);
  if (emax - emin > 60) return sequential_mean(values);  // too wide for the integer sum; not met by scores
  __int128 sum = 0;
  for (const auto& p : parts) sum += static_cast<__int128>(p.first) << (p.second - emin);
  const bool negative = sum < 0;
  unsigned __int128 s = negative ? static_cast<unsigned __int128>(-sum) : static_cast<unsigned __int128>(sum);
  if (s == 0) return 0.0;
  const auto n = static_cast<unsigned __int128>(values.size());
  // Quotient with at least 55 significant bits, then rounded to 53 with the remainder as a sticky bit.
  int shift = 0;
  auto bits = [](unsigned __int128 v) {
    int b = 0;
    while (v) {
      ++b;
      v >>= 1;
    }
    return b;
  };
  while (bits(s / n) < 56 && bits(s) < 126) {
    s <<= 1;
    ++shift;
  }
  unsigned __int128 q = s / n;
  bool sticky = (s % n) != 0;
  int drop = bits(q) - 53;
  if (drop < 0) drop = 0;
  int exponent = emin - shift;
  if (drop > 0) {
    const unsigned __int128 mask = (static_cast<unsigned __int128>(1) << drop) - 1;
    const unsigned __int128 rest = q & mask;
    const unsigned __int128 half = static_cast<unsigned __int128>(1) << (drop - 1);
    q >>= drop;
    exponent += drop;
    if (rest > half || (rest == half && (sticky || (q & 1)))) ++q;
  }
  const double out = std::ldexp(static_cast<double>(static_cast<uint64_t>(q)), exponent);
  return negative ? -out : out;
}

std::optional<std::vector<std::string>> list_literal(std::string_view s) {
  size_t i = 0;
  auto skip = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  };
  skip();
  if (i >= s.size() || s[i] != '[') return std::nullopt;
  ++i;
  std::vector<std::string> out;
  skip();
  if (i < s.size() && s[i] == ']') {
    ++i;
    skip();
    if (i != s.size()) return std::nullopt;
    return out;
  }
  while (true) {
    skip();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return std::nullopt;
    const char quote = s[i++];
    std::string value;
    bool closed = false;
    while (i < s.size()) {
      const char c = s[i++];
      if (c == quote) {
        closed = true;
        break;
      }
      if (c == '\n') return std::nullopt;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (i >= s.size()) return std::nullopt;
      const char e = s[i++];
      switch (e) {
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '0': value += '\0'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + width > s.size()) return std::nullopt;
          char32_t cp = 0;
          for (size_t k = 0; k < width; ++k) {
            const char h = s[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return std::nullopt;
            cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          i += width;
          if (cp > 0x10FFFF) return std::nullopt;
          value += encode(std::u32string(1, cp));
          break;
        }
        default:  // an unknown escape keeps its backslash, as Python does
          value += '\\';
          value += e;
      }
    }
    if (!closed) return std::nullopt;
    out.push_back(std::move(value));
    skip();
    if (i < s.size() && s[i] == ',') {
      ++i;
      skip();
      if (i < s.size() && s[i] == ']') {
        ++i;
        break;
      }
      continue;
    }
    if (i < s.size() && s[i] == ']') {
      ++i;
      break;
    }
    return std::nullopt;
  }
  skip();
  if (i != s.size()) return std::nullopt;
  return out;
}

void Random::seed(uint64_t seed) {
  // random.seed(int): init_genrand(19650218), then init_by_array with the absolute value's 32-bit words (one word
  // 0 for seed 0).
  std::vector<uint32_t> key;
  do {
    key.push_back(static_cast<uint32_t>(seed & 0xFFFFFFFFu));
    seed >>= 32;
  } while (seed != 0);
  state_[0] = 19650218u;
  for (int i = 1; i < 624; ++i) {
    state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  int i = 1;
  size_t j = 0;
  const size_t key_length = key.size();
  for (size_t k = std::max<size_t>(624, key_length); k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= 624) {
      state_[0] = state_[623];
      i = 1;
    }
    if (j >= key_length) j = 0;
  }
  for (int k = 623; k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= 624) {
      state_[0] = state_[623];
      i = 1;
    }
  }
  state_[0] = 0x80000000u;
  index_ = 624;
}

uint32_t Random::next() {
  if (index_ >= 624) {
    for (int k = 0; k < 624; ++k) {
      const uint32_t y = (state_[k] & 0x80000000u) | (state_[(k + 1) % 624] & 0x7FFFFFFFu);
      state_[k] = state_[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908B0DFu : 0u);
    }
    index_ = 0;
  }
  uint32_t y = state_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9D2C5680u;
  y ^= (y << 15) & 0xEFC60000u;
  y ^= y >> 18;
  return y;
}

uint32_t Random::getrandbits(int k) { return next() >> (32 - k); }

uint64_t Random::randbelow(uint64_t n) {
  if (n <= 1) return 0;
  int k = 0;
  for (uint64_t v = n; v; v >>= 1) ++k;
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

}  // namespace swiftcpp::eval::py
