#include "tokenizer/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/text.h"

namespace swiftcpp {

namespace {

constexpr size_t kNpos = std::string::npos;

// The pre-tokenizer of GPT-2 (and of every ByteLevel pre-tokenizer with use_regex).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------------------
// UTF-8

// The length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is ill-formed; then `bad` is the
// length of its maximal ill-formed subpart (at least 1), which is what one U+FFFD replaces.
size_t utf8_sequence(std::string_view s, size_t i, size_t& bad) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = at(i);
  if (b0 < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 == 0xE0) {
    len = 3, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    len = 3;
  } else if (b0 == 0xED) {
    len = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    len = 4, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    len = 4;
  } else if (b0 == 0xF4) {
    len = 4, hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      bad = k;
      return 0;
    }
    const unsigned char b = at(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      bad = k;
      return 0;
    }
  }
  return len;
}

// The offset of the first ill-formed byte, kNpos when `s` is valid UTF-8.
size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    size_t bad = 0;
    const size_t len = utf8_sequence(s, i, bad);
    if (len == 0) return i;
    i += len;
  }
  return kNpos;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// `bytes` with each maximal ill-formed subpart replaced by U+FFFD (what Rust's from_utf8_lossy does).
std::string to_valid_utf8(std::string bytes) {
  if (find_invalid_utf8(bytes) == kNpos) return bytes;
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t i = 0;
  while (i < bytes.size()) {
    size_t bad = 0;
    const size_t len = utf8_sequence(bytes, i, bad);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(bytes, i, len);
      i += len;
    }
  }
  return out;
}

// The code point at s[i] of valid UTF-8; `len` gets its byte length.
char32_t code_point_at(std::string_view s, size_t i, size_t& len) {
  const auto at = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[k])); };
  const char32_t b0 = at(i);
  if (b0 < 0x80) return len = 1, b0;
  if (b0 < 0xE0) return len = 2, ((b0 & 0x1F) << 6) | (at(i + 1) & 0x3F);
  if (b0 < 0xF0) return len = 3, ((b0 & 0x0F) << 12) | ((at(i + 1) & 0x3F) << 6) | (at(i + 2) & 0x3F);
  return len = 4, ((b0 & 0x07) << 18) | ((at(i + 1) & 0x3F) << 12) | ((at(i + 2) & 0x3F) << 6) | (at(i + 3) & 0x3F);
}

// ---------------------------------------------------------------------------------------------------------
// The byte-to-unicode map of byte-level BPE: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, the other 68 bytes, in increasing order, for U+0100, U+0101, ...

struct ByteMap {
  std::array<std::string, 256> to_utf8;  // byte -> its character as UTF-8
  std::array<int, 324> from_cp;           // code point -> byte, -1 outside the image
};

const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.from_cp.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      m.from_cp[cp] = b;
      append_utf8(m.to_utf8[b], cp);
    }
    return m;
  }();
  return map;
}

// The bytes a byte-level vocabulary string stands for; false when it has a character outside the image.
bool unmap_bytes(std::string_view s, std::string& out) {
  const ByteMap& map = byte_map();
  out.clear();
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    const char32_t cp = code_point_at(s, i, len);
    if (cp >= map.from_cp.size() || map.from_cp[cp] < 0) return false;
    out += static_cast<char>(map.from_cp[cp]);
    i += len;
  }
  return true;
}

std::string map_bytes(std::string_view raw) {
  const ByteMap& map = byte_map();
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out += map.to_utf8[static_cast<unsigned char>(c)];
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// PCRE2 regexes, compiled with UTF and UCP (\s, \w, \d and POSIX classes follow Unicode) and JIT where the
// library has it. Subjects are validated once by the caller, so every match skips PCRE2's UTF check.

pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  if (holder.data == nullptr) throw std::bad_alloc();
  return holder.data;
}

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &code,
                          &offset, nullptr);
    if (code_ == nullptr) {
      fail<FormatError>("{}: the regex '{}' does not compile (PCRE2, at offset {}): {}", where, pattern, offset,
                        pcre2_message(code));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT support, matching falls back to the interpreter
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in s[start, end) (lookarounds see the whole of `s`); false when there is none.
  bool find(std::string_view s, size_t start, size_t& begin, size_t& end) const {
    if (start > s.size() || s.empty()) return false;
    pcre2_match_data* data = thread_match_data();
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    int rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) fail<Error>("matching the regex '{}' failed: {}", pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    begin = ovector[0];
    end = ovector[1];
    return true;
  }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------
// Splitting: a piece is cut into segments that cover it (matches and the text between them), then a behaviour
// decides which segments become pieces and which are glued together (Hugging Face's SplitDelimiterBehavior).

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  size_t begin;
  size_t end;
  bool match;
};

// Calls visit(Segment) for the matches of `regex` in `s` and the gaps between them, left to right. An empty
// match right after the previous match is skipped and the search moves on by one character (as the Rust
// regex iterators do); other empty matches still cut the gap they sit in.
template <typename Visit>
void regex_segments(const Regex& regex, std::string_view s, Visit&& visit) {
  size_t prev = 0, pos = 0, begin = 0, end = 0;
  size_t last_match_end = kNpos;
  while (pos <= s.size() && regex.find(s, pos, begin, end)) {
    if (begin == end) {
      if (begin != last_match_end) {
        if (begin > prev) visit(Segment{prev, begin, false});
        visit(Segment{begin, begin, true});
        prev = begin;
      }
      if (begin >= s.size()) break;
      size_t len = 0;
      code_point_at(s, begin, len);
      pos = begin + len;
      last_match_end = kNpos;
      continue;
    }
    if (begin > prev) visit(Segment{prev, begin, false});
    visit(Segment{begin, end, true});
    prev = pos = last_match_end = end;
  }
  if (prev < s.size()) visit(Segment{prev, s.size(), false});
}

template <typename Visit>
void literal_segments(std::string_view literal, std::string_view s, Visit&& visit) {
  size_t prev = 0;
  if (!literal.empty()) {
    for (size_t at = s.find(literal); at != kNpos; at = s.find(literal, prev)) {
      if (at > prev) visit(Segment{prev, at, false});
      visit(Segment{at, at + literal.size(), true});
      prev = at + literal.size();
    }
  }
  if (prev < s.size()) visit(Segment{prev, s.size(), false});
}

// One segment per character for which `is_match` holds; the characters between them form one segment each run.
template <typename Pred, typename Visit>
void char_segments(std::string_view s, Pred&& is_match, Visit&& visit) {
  size_t prev = 0, i = 0;
  while (i < s.size()) {
    size_t len = 0;
    const char32_t cp = code_point_at(s, i, len);
    if (is_match(cp)) {
      if (i > prev) visit(Segment{prev, i, false});
      visit(Segment{i, i + len, true});
      prev = i + len;
    }
    i += len;
  }
  if (prev < s.size()) visit(Segment{prev, s.size(), false});
}

// Applies `behavior` to segments that cover a piece (match flags already inverted where asked).
std::vector<Segment> apply_behavior(const std::vector<Segment>& segments, Behavior behavior) {
  std::vector<Segment> out;
  out.reserve(segments.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      out = segments;
      break;
    case Behavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.match) out.push_back(s);
      }
      break;
    case Behavior::kMergedWithPrevious:
      // A match joins the piece before it (the first of consecutive matches only).
      for (const Segment& s : segments) {
        if (s.match && !previous_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous_match = s.match;
      }
      break;
    case Behavior::kMergedWithNext:
      // A match joins the piece after it (the last of consecutive matches only).
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->match && !previous_match && !out.empty()) out.back().begin = it->begin;
        else out.push_back(*it);
        previous_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      // Runs of matches (and runs of non-matches) become one piece.
      for (const Segment& s : segments) {
        if (s.match == previous_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous_match = s.match;
      }
      break;
  }
  return out;
}

Behavior parse_behavior(const Json& value, const std::string& where) {
  if (value.is_string()) {
    const std::string name = value.get<std::string>();
    if (name == "Removed") return Behavior::kRemoved;
    if (name == "Isolated") return Behavior::kIsolated;
    if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
    if (name == "MergedWithNext") return Behavior::kMergedWithNext;
    if (name == "Contiguous") return Behavior::kContiguous;
  }
  fail<FormatError>("{}.behavior: expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous, got {}",
                    where, describe_json(value));
}

// Unicode punctuation (general category P) or ASCII punctuation, as Hugging Face's Punctuation pre-tokenizer.
bool is_punctuation(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                        (cp >= 0x7B && cp <= 0x7E);
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK) != 0;
}

// ---------------------------------------------------------------------------------------------------------
// Pre-tokenizer steps.

struct PreStep {
  enum class Kind { kByteLevel, kSplitRegex, kSplitString, kDigits, kPunctuation };
  Kind kind = Kind::kByteLevel;
  std::shared_ptr<const Regex> regex;  // kSplitRegex; kByteLevel with use_regex (the GPT-2 pattern)
  std::string literal;                 // kSplitString
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  bool mapped = false;            // runs after ByteLevel, on the byte-to-unicode image of the piece
};

// ---------------------------------------------------------------------------------------------------------
// (left id, right id) -> (rank, merged id): open addressing, linear probing, power-of-two capacity.

class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int rank = 0;
    int id = 0;
  };

  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n + 16) capacity <<= 1;
    slots_.assign(capacity, Entry{});
    mask_ = capacity - 1;
  }
  // Inserts or replaces (a later duplicate of a merge wins, as in Hugging Face's hash map).
  void put(int left, int right, int rank, int id) {
    const uint64_t key = pack(left, right);
    for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Entry{key, rank, id};
        return;
      }
    }
  }
  const Entry* find(int left, int right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  static uint64_t pack(int left, int right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Entry> slots_;
  uint64_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// Pre-token bytes -> ids, shared by all threads. 64 shards, each with a table of kSlots atomic slots and an
// arena of immutable entries (u32 key bytes, u32 id count, key padded to 4 bytes, ids). Lookups take no lock
// and write nothing shared: a slot is published with a release store after its entry is written, and neither
// slots nor entries ever change or move afterwards. Inserts take the shard's mutex. A shard stops taking words
// once half its slots or its arena are used (a bounded cache, like Hugging Face's).

class PieceCache {
 public:
  static constexpr size_t kMaxKeyBytes = 256;

  PieceCache() = default;
  PieceCache(const PieceCache&) = delete;
  PieceCache& operator=(const PieceCache&) = delete;
  ~PieceCache() {
    for (Shard& shard : shards_) delete shard.table.load(std::memory_order_relaxed);
  }

  bool find(std::string_view key, size_t hash, std::vector<int>& out) const {
    const Table* table = shards_[shard_of(hash)].table.load(std::memory_order_acquire);
    if (table == nullptr) return false;
    for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const uint64_t slot = table->slots[i].load(std::memory_order_acquire);
      if (slot == 0) return false;
      if ((slot >> kTagShift) != (static_cast<uint64_t>(hash) >> kTagShift)) continue;
      const char* entry = table->arena + (slot & kOffsetMask);
      uint32_t key_bytes = 0, n_ids = 0;
      std::memcpy(&key_bytes, entry, 4);
      if (key_bytes != key.size() || std::memcmp(entry + 8, key.data(), key.size()) != 0) continue;
      std::memcpy(&n_ids, entry + 4, 4);
      const size_t start = out.size();
      out.resize(start + n_ids);
      std::memcpy(out.data() + start, entry + 8 + padded(key_bytes), n_ids * sizeof(int));
      return true;
    }
  }

  void insert(std::string_view key, size_t hash, const int* ids, size_t n) {
    Shard& shard = shards_[shard_of(hash)];
    std::lock_guard<std::mutex> lock(shard.mutex);
    Table* table = shard.table.load(std::memory_order_relaxed);
    if (table == nullptr) {
      table = new Table;  // the arena stays untouched (and unbacked by memory) until used
      for (auto& slot : table->slots) slot.store(0, std::memory_order_relaxed);
      shard.table.store(table, std::memory_order_release);
    }
    const size_t entry_bytes = 8 + padded(key.size()) + n * sizeof(int);
    if (2 * (table->entries + 1) > kSlots || table->used + entry_bytes > kArenaBytes) return;
    size_t i = hash & (kSlots - 1);
    for (;; i = (i + 1) & (kSlots - 1)) {
      const uint64_t slot = table->slots[i].load(std::memory_order_relaxed);
      if (slot == 0) break;
      if ((slot >> kTagShift) != (static_cast<uint64_t>(hash) >> kTagShift)) continue;
      const char* entry = table->arena + (slot & kOffsetMask);
      uint32_t key_bytes = 0;
      std::memcpy(&key_bytes, entry, 4);
      if (key_bytes == key.size() && std::memcmp(entry + 8, key.data(), key.size()) == 0) return;  // already in
    }
    char* entry = table->arena + table->used;
    const auto key_bytes = static_cast<uint32_t>(key.size()), n_ids = static_cast<uint32_t>(n);
    std::memcpy(entry, &key_bytes, 4);
    std::memcpy(entry + 4, &n_ids, 4);
    std::memcpy(entry + 8, key.data(), key.size());
    std::memcpy(entry + 8 + padded(key.size()), ids, n * sizeof(int));
    const uint64_t slot = ((static_cast<uint64_t>(hash) >> kTagShift) << kTagShift) | kOccupied | table->used;
    table->used += entry_bytes;
    ++table->entries;
    table->slots[i].store(slot, std::memory_order_release);
  }

 private:
  static constexpr size_t kShards = 64;
  static constexpr size_t kSlots = 4096;
  static constexpr size_t kArenaBytes = size_t{1} << 20;
  // A slot: bits 21..63 the key's hash (the tag), bit 20 set when occupied, bits 0..19 the entry's offset.
  static constexpr unsigned kTagShift = 21;
  static constexpr uint64_t kOccupied = uint64_t{1} << 20;
  static constexpr uint64_t kOffsetMask = kOccupied - 1;
  struct Table {
    std::atomic<uint64_t> slots[kSlots];
    char arena[kArenaBytes];
    size_t used = 0;     // arena bytes written (under the shard's mutex)
    size_t entries = 0;  // slots used (under the shard's mutex)
  };
  struct Shard {
    std::mutex mutex;
    std::atomic<Table*> table{nullptr};
  };
  static size_t shard_of(size_t hash) { return (static_cast<uint64_t>(hash) >> 58) % kShards; }
  static size_t padded(size_t n) { return (n + 3) & ~static_cast<size_t>(3); }
  std::array<Shard, kShards> shards_;
};

// ---------------------------------------------------------------------------------------------------------
// JSON helpers whose errors name the file and the key path.

const Json& member(const Json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) fail<FormatError>("{}: missing key '{}'", where, key);
  return obj.at(key);
}

bool bool_or(const Json& obj, const char* key, bool fallback, const std::string& where) {
  if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
  if (!obj.at(key).is_boolean()) fail<FormatError>("{}.{}: expected true or false, got {}", where, key, describe_json(obj.at(key)));
  return obj.at(key).get<bool>();
}

std::string string_of(const Json& value, const std::string& where) {
  if (!value.is_string()) fail<FormatError>("{}: expected a string, got {}", where, describe_json(value));
  return value.get<std::string>();
}

std::string type_of(const Json& obj, const std::string& where) {
  if (!obj.is_object()) fail<FormatError>("{}: expected an object with a 'type', got {}", where, describe_json(obj));
  return string_of(member(obj, "type", where), where + ".type");
}

int id_of(const Json& value, const std::string& where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT_MAX) {
    fail<FormatError>("{}: expected a non-negative token id, got {}", where, describe_json(value));
  }
  return value.get<int>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------

struct BpeTokenizer::Impl {
  std::string origin;

  // Vocabulary. `pieces` are the strings as written (vocabulary strings, added-token contents); `bytes` what
  // each id decodes to.
  std::vector<std::string> pieces;
  std::vector<char> present;
  std::vector<std::string> bytes;
  std::vector<char> special;
  std::unordered_map<std::string, int> piece_ids;
  std::vector<std::string> model_bytes;                   // model vocabulary: the bytes of byte-level strings
  std::unordered_map<std::string_view, int> bytes_to_id;  // model vocabulary only; views into model_bytes
  std::array<int, 256> byte_ids{};
  MergeTable merges;
  bool ignore_merges = false;
  int unk_id = -1;
  bool fuse_unk = false;

  // Pipeline.
  std::vector<const UNormalizer2*> normalizers;
  std::vector<PreStep> steps;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_all, raw_plain;          // added tokens matched in the raw text (all / not special)
  AddedTokenMatcher normalized_all, normalized_plain;  // ... in the normalized text
  std::optional<int> bos, eos;

  mutable PieceCache cache;

  // ---- loading ----

  // Ids index dense tables, so an id is refused when the entries of the file could not fill the table up to it:
  // gaps may cover about half the ids (plus kIdSlack), never 2^31 slots for one token.
  static constexpr size_t kIdSlack = 65536;
  size_t id_limit = kIdSlack;

  void add_piece(int id, const std::string& piece) {
    if (static_cast<size_t>(id) >= id_limit) {
      fail<FormatError>("{}: token id {} of '{}' is far beyond the number of tokens defined (ids from 0 up to {} are "
                        "accepted)", origin, id, piece.substr(0, 80), id_limit - 1);
    }
    if (static_cast<size_t>(id) >= pieces.size()) {
      pieces.resize(id + 1);
      present.resize(id + 1, 0);
      bytes.resize(id + 1);
      special.resize(id + 1, 0);
    }
    pieces[id] = piece;
    present[id] = 1;
    std::string raw;
    bytes[id] = unmap_bytes(piece, raw) ? raw : piece;
    piece_ids[piece] = id;
  }

  void set_vocab(const Json& vocab, const std::string& where) {
    if (!vocab.is_object()) fail<FormatError>("{}: expected an object of token -> id", where);
    piece_ids.reserve(vocab.size() + 1024);
    id_limit = 2 * vocab.size() + kIdSlack;
    for (const auto& [piece, id] : vocab.items()) {
      const int value = id_of(id, where + "['" + piece + "']");
      if (static_cast<size_t>(value) < present.size() && present[value]) {
        fail<FormatError>("{}: id {} is given to both '{}' and '{}'", where, value, pieces[value], piece);
      }
      add_piece(value, piece);
    }
    // The bytes of each model token that is a byte-level string; bytes_to_id's views point into model_bytes,
    // which is never changed afterwards.
    byte_ids.fill(-1);
    model_bytes.assign(pieces.size(), std::string());
    std::vector<char> valid(pieces.size(), 0);
    for (size_t id = 0; id < pieces.size(); ++id) {
      valid[id] = present[id] && unmap_bytes(pieces[id], model_bytes[id]);
    }
    bytes_to_id.reserve(pieces.size());
    for (size_t id = 0; id < pieces.size(); ++id) {
      if (!valid[id]) continue;
      const std::string& raw = model_bytes[id];
      bytes_to_id.emplace(std::string_view(raw), static_cast<int>(id));
      if (raw.size() == 1) byte_ids[static_cast<unsigned char>(raw[0])] = static_cast<int>(id);
    }
  }

  int model_id(const std::string& piece) const {
    const auto it = piece_ids.find(piece);
    return it == piece_ids.end() ? -1 : it->second;
  }

  void add_merge(const std::string& left, const std::string& right, int rank, const std::string& where) {
    const int a = model_id(left), b = model_id(right), merged = model_id(left + right);
    if (a < 0) fail<FormatError>("{}: merge {} ('{} {}') names '{}', which is not in the vocabulary", where, rank, left, right, left);
    if (b < 0) fail<FormatError>("{}: merge {} ('{} {}') names '{}', which is not in the vocabulary", where, rank, left, right, right);
    if (merged < 0) {
      fail<FormatError>("{}: merge {} ('{} {}') makes '{}', which is not in the vocabulary", where, rank, left, right,
                        left + right);
    }
    merges.put(a, b, rank, merged);
  }

  void parse_normalizer(const Json& node, const std::string& where) {
    if (node.is_null()) return;
    const std::string type = type_of(node, where);
    UErrorCode status = U_ZERO_ERROR;
    const UNormalizer2* normalizer = nullptr;
    if (type == "Sequence") {
      const Json& list = member(node, "normalizers", where);
      if (!list.is_array()) fail<FormatError>("{}.normalizers: expected a list", where);
      for (size_t i = 0; i < list.size(); ++i) parse_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
      return;
    } else if (type == "NFC") {
      normalizer = unorm2_getNFCInstance(&status);
    } else if (type == "NFD") {
      normalizer = unorm2_getNFDInstance(&status);
    } else if (type == "NFKC") {
      normalizer = unorm2_getNFKCInstance(&status);
    } else if (type == "NFKD") {
      normalizer = unorm2_getNFKDInstance(&status);
    } else {
      fail<FormatError>("{}: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)", where,
                        type);
    }
    if (U_FAILURE(status) || normalizer == nullptr) {
      fail<Error>("{}: ICU cannot provide the {} normalizer: {}", where, type, u_errorName(status));
    }
    normalizers.push_back(normalizer);
  }

  void parse_pre_tokenizer(const Json& node, const std::string& where, bool& seen_byte_level) {
    if (node.is_null()) return;
    const std::string type = type_of(node, where);
    PreStep step;
    step.mapped = seen_byte_level;
    if (type == "Sequence") {
      const Json& list = member(node, "pretokenizers", where);
      if (!list.is_array()) fail<FormatError>("{}.pretokenizers: expected a list", where);
      for (size_t i = 0; i < list.size(); ++i) {
        parse_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), seen_byte_level);
      }
      return;
    } else if (type == "ByteLevel") {
      if (seen_byte_level) fail<FormatError>("{}: a second ByteLevel pre-tokenizer is not supported", where);
      seen_byte_level = true;
      step.kind = PreStep::Kind::kByteLevel;
      step.add_prefix_space = bool_or(node, "add_prefix_space", true, where);
      if (bool_or(node, "use_regex", true, where)) step.regex = std::make_shared<Regex>(kGpt2Pattern, where);
    } else if (type == "Split") {
      const Json& pattern = member(node, "pattern", where);
      if (pattern.is_object() && pattern.contains("Regex")) {
        step.kind = PreStep::Kind::kSplitRegex;
        step.regex = std::make_shared<Regex>(string_of(pattern.at("Regex"), where + ".pattern.Regex"), where);
      } else if (pattern.is_object() && pattern.contains("String")) {
        step.kind = PreStep::Kind::kSplitString;
        step.literal = string_of(pattern.at("String"), where + ".pattern.String");
      } else {
        fail<FormatError>("{}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}, got {}", where, describe_json(pattern));
      }
      step.behavior = parse_behavior(member(node, "behavior", where), where);
      step.invert = bool_or(node, "invert", false, where);
    } else if (type == "Digits") {
      step.kind = PreStep::Kind::kDigits;
      step.behavior = bool_or(node, "individual_digits", false, where) ? Behavior::kIsolated : Behavior::kContiguous;
    } else if (type == "Punctuation") {
      step.kind = PreStep::Kind::kPunctuation;
      step.behavior = node.contains("behavior") ? parse_behavior(node.at("behavior"), where) : Behavior::kIsolated;
    } else {
      fail<FormatError>("{}: pre-tokenizer type '{}' is not supported (supported: ByteLevel, Split, Digits, "
                        "Punctuation, Sequence)",
                        where, type);
    }
    steps.push_back(std::move(step));
  }

  // Returns how many ByteLevel decoders the node holds.
  int parse_decoder(const Json& node, const std::string& where) {
    const std::string type = type_of(node, where);
    if (type == "ByteLevel") return 1;
    if (type == "Fuse") return 0;  // joins the token strings into one: what concatenating bytes does anyway
    if (type == "Sequence") {
      const Json& list = member(node, "decoders", where);
      if (!list.is_array()) fail<FormatError>("{}.decoders: expected a list", where);
      int count = 0;
      for (size_t i = 0; i < list.size(); ++i) count += parse_decoder(list[i], fmt::format("{}.decoders[{}]", where, i));
      return count;
    }
    fail<FormatError>("{}: decoder type '{}' is not supported with byte-level BPE (supported: ByteLevel, Fuse, "
                      "Sequence)",
                      where, type);
  }

  // The id of a post-processor's special token: its special_tokens entry, else the vocabulary.
  int template_token_id(const Json& processor, const std::string& name, const std::string& where) const {
    if (processor.contains("special_tokens") && processor.at("special_tokens").is_object() &&
        processor.at("special_tokens").contains(name)) {
      const Json& entry = processor.at("special_tokens").at(name);
      const Json& ids = member(entry, "ids", where + ".special_tokens['" + name + "']");
      if (!ids.is_array() || ids.size() != 1) {
        fail<FormatError>("{}.special_tokens['{}'].ids: expected exactly one id, got {}", where, name, describe_json(ids));
      }
      return id_of(ids[0], where + ".special_tokens['" + name + "'].ids[0]");
    }
    const int id = model_id(name);
    if (id < 0) fail<FormatError>("{}: special token '{}' is neither in special_tokens nor in the vocabulary", where, name);
    return id;
  }

  void parse_post_processor(const Json& node, const std::string& where) {
    if (node.is_null()) return;
    const std::string type = type_of(node, where);
    if (type == "ByteLevel") return;  // changes offsets only
    if (type == "Sequence") {
      const Json& list = member(node, "processors", where);
      if (!list.is_array()) fail<FormatError>("{}.processors: expected a list", where);
      for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list[i], fmt::format("{}.processors[{}]", where, i));
      return;
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
      for (const char* key : {"cls", "sep"}) {
        const Json& pair = member(node, key, where);
        if (!pair.is_array() || pair.size() != 2) fail<FormatError>("{}.{}: expected [token, id]", where, key);
        (std::string(key) == "cls" ? bos : eos) = id_of(pair[1], fmt::format("{}.{}[1]", where, key));
      }
      return;
    }
    if (type != "TemplateProcessing") {
      fail<FormatError>("{}: post-processor type '{}' is not supported (supported: TemplateProcessing, ByteLevel, "
                        "RobertaProcessing, BertProcessing, Sequence)",
                        where, type);
    }
    const Json& single = member(node, "single", where);
    if (!single.is_array()) fail<FormatError>("{}.single: expected a list", where);
    std::vector<int> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string at = fmt::format("{}.single[{}]", where, i);
      const Json& item = single[i];
      std::optional<std::string> special;
      if (item.is_object() && item.contains("SpecialToken")) {
        special = string_of(member(item.at("SpecialToken"), "id", at + ".SpecialToken"), at + ".SpecialToken.id");
      } else if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.is_string() && !item.get<std::string>().empty() && item.get<std::string>()[0] == '$') {
        seen_sequence = true;
      } else if (item.is_string()) {
        special = item.get<std::string>();
      } else {
        fail<FormatError>("{}: expected a SpecialToken or a Sequence, got {}", at, describe_json(item));
      }
      if (special) (seen_sequence ? after : before).push_back(template_token_id(node, *special, where));
    }
    if (!seen_sequence) fail<FormatError>("{}.single: the template has no sequence ($A)", where);
    if (before.size() > 1 || after.size() > 1) {
      fail<FormatError>("{}.single: only one special token before and one after the sequence are supported", where);
    }
    if (!before.empty()) bos = before[0];
    if (!after.empty()) eos = after[0];
  }

  void set_added_tokens(std::vector<AddedToken> tokens) {
    id_limit += 2 * tokens.size();
    for (const AddedToken& token : tokens) {
      add_piece(token.id, token.content);
      special[token.id] = token.special ? 1 : 0;
    }
    added = tokens;
    std::vector<AddedToken> raw, raw_plain_tokens, norm, norm_plain;
    for (AddedToken token : tokens) {
      if (token.normalized && !normalizers.empty()) token.content = normalize(token.content);
      auto& all = token.normalized ? norm : raw;
      auto& plain = token.normalized ? norm_plain : raw_plain_tokens;
      if (!token.special) plain.push_back(token);
      all.push_back(std::move(token));
    }
    raw_all = AddedTokenMatcher(std::move(raw));
    raw_plain = AddedTokenMatcher(std::move(raw_plain_tokens));
    normalized_all = AddedTokenMatcher(std::move(norm));
    normalized_plain = AddedTokenMatcher(std::move(norm_plain));
  }

  void check_byte_coverage(const std::string& where, bool byte_fallback) const {
    int missing = 0;
    for (int id : byte_ids) missing += id < 0 ? 1 : 0;
    if (byte_fallback && missing > 0) {
      fail<FormatError>("{}: byte_fallback with {} bytes missing from the byte-level vocabulary is not supported",
                        where, missing);
    }
  }

  // ---- encoding ----

  std::string normalize(std::string_view text) const {
    std::string current(text);
    for (const UNormalizer2* normalizer : normalizers) {
      if (is_ascii(current)) break;  // every Unicode normalization form leaves ASCII unchanged
      UErrorCode status = U_ZERO_ERROR;
      std::vector<UChar> utf16(current.size() + 1);
      int32_t length = 0;
      u_strFromUTF8(utf16.data(), static_cast<int32_t>(utf16.size()), &length, current.data(),
                    static_cast<int32_t>(current.size()), &status);
      if (U_SUCCESS(status) && unorm2_isNormalized(normalizer, utf16.data(), length, &status) && U_SUCCESS(status)) {
        continue;
      }
      status = U_ZERO_ERROR;
      std::vector<UChar> normalized(static_cast<size_t>(length) * 3 + 16);
      const int32_t n = unorm2_normalize(normalizer, utf16.data(), length, normalized.data(),
                                         static_cast<int32_t>(normalized.size()), &status);
      std::string out(static_cast<size_t>(n) * 3 + 4, '\0');
      int32_t out_length = 0;
      if (U_SUCCESS(status)) {
        u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_length, normalized.data(), n, &status);
      }
      if (U_FAILURE(status)) fail<Error>("{}: Unicode normalization failed: {}", origin, u_errorName(status));
      out.resize(static_cast<size_t>(out_length));
      current = std::move(out);
    }
    return current;
  }

  // Cuts `text` at the matches of `matcher`: parts go to `part`, matches become their ids.
  template <typename Part>
  static void split_added(const AddedTokenMatcher& matcher, std::string_view text, std::vector<int>& out, Part&& part) {
    if (matcher.empty()) {
      part(text);
      return;
    }
    size_t pos = 0;
    for (const AddedTokenMatcher::Match& m : matcher.find_all(text)) {
      if (m.begin > pos) part(text.substr(pos, m.begin - pos));
      out.push_back(matcher.tokens()[m.index].id);
      pos = m.end;
    }
    if (pos < text.size()) part(text.substr(pos));
  }

  std::vector<int> encode(const std::string& text, bool parse_special) const {
    const size_t bad = find_invalid_utf8(text);
    if (bad != kNpos) fail<FormatError>("text to encode is not valid UTF-8 (byte {} of {})", bad, text.size());
    std::vector<int> out;
    out.reserve(text.size() / 3 + 4);
    const AddedTokenMatcher& raw = parse_special ? raw_all : raw_plain;
    const AddedTokenMatcher& norm = parse_special ? normalized_all : normalized_plain;
    split_added(raw, text, out, [&](std::string_view part) {
      if (normalizers.empty()) {
        split_added(norm, part, out, [&](std::string_view piece) { run(0, piece, out); });
      } else {
        const std::string normalized = normalize(part);
        split_added(norm, normalized, out, [&](std::string_view piece) { run(0, piece, out); });
      }
    });
    return out;
  }

  // Pre-tokenizer step k on `piece`, then the next steps on each resulting piece, then BPE.
  void run(size_t k, std::string_view piece, std::vector<int>& out) const {
    if (piece.empty()) return;
    if (k == steps.size()) {
      merge(piece, out);
      return;
    }
    const PreStep& step = steps[k];
    if (!step.mapped) {
      split(step, piece, [&](std::string_view sub) { run(k + 1, sub, out); });
      return;
    }
    const std::string mapped = map_bytes(piece);
    std::string raw;
    split(step, mapped, [&](std::string_view sub) {
      unmap_bytes(sub, raw);  // `sub` is a run of whole characters of the image
      run(k + 1, raw, out);
    });
  }

  template <typename Emit>
  void split(const PreStep& step, std::string_view s, Emit&& emit) const {
    using Kind = PreStep::Kind;
    if (step.kind == Kind::kByteLevel) {
      std::string prefixed;
      if (step.add_prefix_space && s.front() != ' ') {
        prefixed.reserve(s.size() + 1);
        prefixed += ' ';
        prefixed += s;
        s = prefixed;
      }
      if (!step.regex) {
        emit(s);
        return;
      }
      regex_segments(*step.regex, s, [&](const Segment& seg) {
        if (seg.end > seg.begin) emit(s.substr(seg.begin, seg.end - seg.begin));
      });
      return;
    }
    const bool streaming = step.behavior == Behavior::kIsolated || step.behavior == Behavior::kRemoved;
    std::vector<Segment> segments;
    const auto visit = [&](const Segment& seg) {
      const bool match = seg.match != step.invert;
      if (streaming) {
        if (seg.end > seg.begin && (step.behavior == Behavior::kIsolated || !match)) {
          emit(s.substr(seg.begin, seg.end - seg.begin));
        }
      } else {
        segments.push_back(Segment{seg.begin, seg.end, match});
      }
    };
    switch (step.kind) {
      case Kind::kSplitRegex:
        regex_segments(*step.regex, s, visit);
        break;
      case Kind::kSplitString:
        literal_segments(step.literal, s, visit);
        break;
      case Kind::kDigits:
        char_segments(s, [](char32_t cp) { return cp >= '0' && cp <= '9'; }, visit);
        break;
      case Kind::kPunctuation:
        char_segments(s, is_punctuation, visit);
        break;
      case Kind::kByteLevel:
        break;
    }
    if (streaming) return;
    for (const Segment& seg : apply_behavior(segments, step.behavior)) {
      if (seg.end > seg.begin) emit(s.substr(seg.begin, seg.end - seg.begin));
    }
  }

  // BPE on the bytes of one pre-token, through the cache.
  void merge(std::string_view piece, std::vector<int>& out) const {
    if (piece.size() == 1 && byte_ids[static_cast<unsigned char>(piece[0])] >= 0) {
      out.push_back(byte_ids[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (ignore_merges) {
      const auto it = bytes_to_id.find(piece);
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const bool cacheable = piece.size() <= PieceCache::kMaxKeyBytes;
    const size_t hash = cacheable ? std::hash<std::string_view>{}(piece) : 0;
    if (cacheable && cache.find(piece, hash, out)) return;
    const size_t start = out.size();
    merge_uncached(piece, out);
    if (cacheable) cache.insert(piece, hash, out.data() + start, out.size() - start);
  }

  void merge_uncached(std::string_view piece, std::vector<int>& out) const {
    // Initial symbols: one per byte. A byte outside the vocabulary becomes unk when there is one (consecutive
    // ones fused with fuse_unk) and is dropped otherwise, as Hugging Face does.
    std::vector<int> ids;
    ids.reserve(piece.size());
    bool previous_unk = false;
    for (char c : piece) {
      const int id = byte_ids[static_cast<unsigned char>(c)];
      if (id >= 0) {
        ids.push_back(id);
        previous_unk = false;
      } else if (unk_id >= 0) {
        if (!(fuse_unk && previous_unk)) ids.push_back(unk_id);
        previous_unk = true;
      }
    }
    if (ids.size() >= 2) {
      if (ids.size() <= 48) merge_short(ids);
      else merge_long(ids);
    }
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // Repeatedly merges the lowest-ranked adjacent pair, the leftmost among equal ranks. Quadratic, with small
  // constants: for the usual short word.
  void merge_short(std::vector<int>& ids) const {
    std::vector<const MergeTable::Entry*> pairs(ids.size() - 1);
    for (size_t i = 0; i + 1 < ids.size(); ++i) pairs[i] = merges.find(ids[i], ids[i + 1]);
    while (!pairs.empty()) {
      size_t best = kNpos;
      for (size_t i = 0; i < pairs.size(); ++i) {
        if (pairs[i] != nullptr && (best == kNpos || pairs[i]->rank < pairs[best]->rank)) best = i;
      }
      if (best == kNpos) break;
      ids[best] = pairs[best]->id;
      ids.erase(ids.begin() + best + 1);
      pairs.erase(pairs.begin() + best);
      if (best > 0) pairs[best - 1] = merges.find(ids[best - 1], ids[best]);
      if (best < pairs.size()) pairs[best] = merges.find(ids[best], ids[best + 1]);
    }
  }

  // The same order with a linked list of symbols and a heap of candidate pairs (rank, position): for long
  // pre-tokens such as runs of whitespace or symbols. A popped candidate is stale unless the two symbols at its
  // position still carry the ids it was made for.
  void merge_long(std::vector<int>& ids) const {
    const int n = static_cast<int>(ids.size());
    std::vector<int> prev(n), next(n);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
      int rank, pos, left, right;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    const auto consider = [&](int pos) {
      if (pos < 0 || next[pos] < 0) return;
      if (const MergeTable::Entry* e = merges.find(ids[pos], ids[next[pos]])) {
        heap.push(Candidate{e->rank, pos, ids[pos], ids[next[pos]]});
      }
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const int right = next[c.pos];
      if (ids[c.pos] != c.left || right < 0 || ids[right] != c.right) continue;
      ids[c.pos] = merges.find(c.left, c.right)->id;
      ids[right] = -1;
      next[c.pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = c.pos;
      consider(prev[c.pos]);
      consider(c.pos);
    }
    size_t kept = 0;
    for (int i = 0; i >= 0 && i < n; i = next[i]) ids[kept++] = ids[i];
    ids.resize(kept);
  }

  // ---- decoding ----

  std::string decode(const std::vector<int>& ids, bool render_special) const {
    std::string text;
    for (int id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= pieces.size() || !present[id]) {
        fail<Error>("token id {} is outside the vocabulary of {} (size {})", id, origin, pieces.size());
      }
      if (special[id] && !render_special) continue;
      text += bytes[id];
    }
    return to_valid_utf8(std::move(text));
  }
};

// ---------------------------------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

bool BpeTokenizer::is_byte_level(const Json& root) {
  const std::function<bool(const Json&)> has = [&](const Json& node) {
    if (!node.is_object() || !node.contains("type") || !node.at("type").is_string()) return false;
    const std::string type = node.at("type").get<std::string>();
    if (type == "ByteLevel") return true;
    if (type == "Sequence" && node.contains("pretokenizers") && node.at("pretokenizers").is_array()) {
      for (const Json& child : node.at("pretokenizers")) {
        if (has(child)) return true;
      }
    }
    return false;
  };
  return root.is_object() && root.contains("pre_tokenizer") && has(root.at("pre_tokenizer"));
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::load(const fs::path& tokenizer_json) {
  if (!fs::exists(tokenizer_json)) fail<IoError>("tokenizer file '{}' does not exist", tokenizer_json.string());
  return from_json(load_json_file(tokenizer_json), tokenizer_json.string());
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::from_json(const Json& root, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  if (!root.is_object()) fail<FormatError>("{}: expected a JSON object at the top level", origin);
  const Json& model = member(root, "model", origin);
  const std::string where = origin + ": model";
  if (!model.is_object()) fail<FormatError>("{}: expected an object", where);
  if (model.contains("type")) {
    const std::string type = string_of(model.at("type"), where + ".type");
    if (type != "BPE") {
      fail<FormatError>("{}: model type '{}' is not supported (only byte-level BPE is)", where, type);
    }
  }
  impl->set_vocab(member(model, "vocab", where), where + ".vocab");

  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0)) {
    fail<FormatError>("{}.dropout: BPE dropout ({}) is not supported", where, describe_json(model.at("dropout")));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "") {
      fail<FormatError>("{}.{}: '{}' is not supported with byte-level BPE", where, key, describe_json(model.at(key)));
    }
  }
  if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
    const std::string unk = string_of(model.at("unk_token"), where + ".unk_token");
    impl->unk_id = impl->model_id(unk);
    if (impl->unk_id < 0) fail<FormatError>("{}.unk_token: '{}' is not in the vocabulary", where, unk);
  }
  impl->fuse_unk = bool_or(model, "fuse_unk", false, where);
  impl->ignore_merges = bool_or(model, "ignore_merges", false, where);
  const bool byte_fallback = bool_or(model, "byte_fallback", false, where);

  const Json& merges = member(model, "merges", where);
  if (!merges.is_array()) fail<FormatError>("{}.merges: expected a list", where);
  impl->merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    const std::string at = fmt::format("{}.merges[{}]", where, rank);
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space == kNpos || text.find(' ', space + 1) != kNpos) {
        fail<FormatError>("{}: expected two tokens separated by one space, got '{}'", at, text);
      }
      impl->add_merge(text.substr(0, space), text.substr(space + 1), static_cast<int>(rank), where + ".merges");
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      impl->add_merge(m[0].get<std::string>(), m[1].get<std::string>(), static_cast<int>(rank), where + ".merges");
    } else {
      fail<FormatError>("{}: expected \"a b\" or [\"a\", \"b\"], got {}", at, describe_json(m));
    }
  }

  const auto node = [&](const char* key) -> const Json& {
    static const Json null_json;
    return root.contains(key) ? root.at(key) : null_json;
  };
  impl->parse_normalizer(node("normalizer"), origin + ": normalizer");
  bool byte_level = false;
  impl->parse_pre_tokenizer(node("pre_tokenizer"), origin + ": pre_tokenizer", byte_level);
  if (!byte_level) {
    fail<FormatError>("{}: pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are supported", origin);
  }
  if (node("decoder").is_null() || impl->parse_decoder(node("decoder"), origin + ": decoder") != 1) {
    fail<FormatError>("{}: decoder must be ByteLevel (alone or once in a Sequence) for byte-level BPE", origin);
  }
  impl->check_byte_coverage(where, byte_fallback);

  std::vector<AddedToken> added;
  const Json& added_json = node("added_tokens");
  if (!added_json.is_null()) {
    if (!added_json.is_array()) fail<FormatError>("{}: added_tokens: expected a list", origin);
    for (size_t i = 0; i < added_json.size(); ++i) {
      const std::string at = fmt::format("{}: added_tokens[{}]", origin, i);
      const Json& entry = added_json[i];
      AddedToken token;
      token.id = id_of(member(entry, "id", at), at + ".id");
      token.content = string_of(member(entry, "content", at), at + ".content");
      if (token.content.empty()) fail<FormatError>("{}.content: an added token cannot be empty", at);
      token.special = bool_or(entry, "special", false, at);
      token.lstrip = bool_or(entry, "lstrip", false, at);
      token.rstrip = bool_or(entry, "rstrip", false, at);
      token.normalized = bool_or(entry, "normalized", !token.special, at);
      token.single_word = bool_or(entry, "single_word", false, at);
      added.push_back(std::move(token));
    }
  }
  impl->set_added_tokens(std::move(added));
  impl->parse_post_processor(node("post_processor"), origin + ": post_processor");
  for (const std::optional<int>& id : {impl->bos, impl->eos}) {
    if (id && (static_cast<size_t>(*id) >= impl->pieces.size() || !impl->present[*id])) {
      fail<FormatError>("{}: post_processor names token id {}, which is not in the vocabulary", origin, *id);
    }
  }
  return std::shared_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::load_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt,
                                                              std::vector<AddedToken> added_tokens) {
  if (!fs::exists(vocab_json)) fail<IoError>("tokenizer file '{}' does not exist", vocab_json.string());
  if (!fs::exists(merges_txt)) fail<IoError>("tokenizer file '{}' does not exist", merges_txt.string());
  auto impl = std::make_unique<Impl>();
  impl->origin = vocab_json.string();
  impl->set_vocab(load_json_file(vocab_json), vocab_json.string());

  std::istringstream lines(read_text_file(merges_txt));
  std::string line;
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == kNpos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != kNpos) {
      fail<FormatError>("{}:{}: expected two tokens separated by one space, got '{}'", merges_txt.string(), number, line);
    }
    pairs.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  impl->merges.reserve(pairs.size());
  for (size_t rank = 0; rank < pairs.size(); ++rank) {
    impl->add_merge(pairs[rank].first, pairs[rank].second, static_cast<int>(rank), merges_txt.string());
  }

  PreStep step;
  step.kind = PreStep::Kind::kByteLevel;
  step.regex = std::make_shared<Regex>(kGpt2Pattern, vocab_json.string());
  impl->steps.push_back(std::move(step));
  for (const AddedToken& token : added_tokens) {
    if (token.id < 0 || token.content.empty()) {
      fail<FormatError>("{}: added token '{}' has id {} (expected a non-empty token with a non-negative id)",
                        vocab_json.string(), token.content, token.id);
    }
  }
  // Matched in the raw text: without a normalizer, normalized and raw text are the same.
  for (AddedToken& token : added_tokens) token.normalized = false;
  impl->set_added_tokens(std::move(added_tokens));
  return std::shared_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::vector<int> BpeTokenizer::encode(const std::string& text) const { return impl_->encode(text, false); }

std::vector<int> BpeTokenizer::encode_with_special_tokens(const std::string& text) const {
  return impl_->encode(text, true);
}

std::string BpeTokenizer::decode(const std::vector<int>& ids) const { return impl_->decode(ids, false); }

std::string BpeTokenizer::decode_with_special_tokens(const std::vector<int>& ids) const {
  return impl_->decode(ids, true);
}

int BpeTokenizer::vocab_size() const { return static_cast<int>(impl_->pieces.size()); }

int BpeTokenizer::bos_id() const { return impl_->bos.value_or(-1); }

std::vector<int> BpeTokenizer::eos_ids() const {
  return impl_->eos ? std::vector<int>{*impl_->eos} : std::vector<int>{};
}

std::string BpeTokenizer::id_to_piece(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->pieces.size() || !impl_->present[id]) {
    fail<Error>("token id {} is outside the vocabulary of {} (size {})", id, impl_->origin, impl_->pieces.size());
  }
  return impl_->pieces[id];
}

int BpeTokenizer::piece_to_id(const std::string& piece) const { return impl_->model_id(piece); }

const std::vector<AddedToken>& BpeTokenizer::added_tokens() const { return impl_->added; }

std::optional<int> BpeTokenizer::template_bos() const { return impl_->bos; }

std::optional<int> BpeTokenizer::template_eos() const { return impl_->eos; }

}  // namespace swiftcpp
