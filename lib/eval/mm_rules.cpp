#include "eval/mm_rules.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "eval/regex.h"

namespace swiftcpp::eval::mm {

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool has_token(const std::vector<std::string>& tokens, const std::string& t) {
  return std::find(tokens.begin(), tokens.end(), t) != tokens.end();
}

std::string letter(char c) { return std::string(1, c); }

bool has_letter(const Options& options, char c) {
  return std::any_of(options.begin(), options.end(), [&](const auto& o) { return o.first == c; });
}

// The one option whose lower-cased text occurs in the lower-cased text, or "" (none, or several).
std::string only_option_in(const std::string& lowered, const Options& options) {
  std::string found;
  int n = 0;
  for (const auto& o : options) {
    if (contains(lowered, py::lower(o.second))) {
      found = letter(o.first);
      ++n;
    }
  }
  return n == 1 ? found : "";
}

// The VQA punctuation step of both toolkits: `comma_digits` is each one's digit-comma-digit test, `period` its
// period pattern (at most 32 periods go: re.UNICODE is passed as sub's count).
std::string vqa_punctuation(const std::string& in, const Pattern& comma_digits, const Pattern& period) {
  static const char* kPunctuation[] = {";", "/", "[", "]", "\"", "{", "}", "(", ")", "=", "+",
                                       "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"};
  const bool comma_between_digits = !comma_digits.search(in).empty();
  std::string out = in;
  for (const char* p : kPunctuation) {
    const std::string s = p;
    if (contains(in, s + " ") || contains(in, " " + s) || comma_between_digits) {
      out = py::replace_all(out, s, "");
    } else {
      out = py::replace_all(out, s, " ");
    }
  }
  return period.replace_all(out, "", 32);
}

const std::map<std::string, std::string>& contractions() {
  static const std::map<std::string, std::string> kMap = [] {
    // key, value pairs of the VQA evaluation's contraction map (identical in both toolkits).
    static const char* kPairs[][2] = {
        {"aint", "ain't"}, {"arent", "aren't"}, {"cant", "can't"}, {"couldve", "could've"}, {"couldnt", "couldn't"},
        {"couldn'tve", "couldn't've"}, {"couldnt've", "couldn't've"}, {"didnt", "didn't"}, {"doesnt", "doesn't"},
        {"dont", "don't"}, {"hadnt", "hadn't"}, {"hadnt've", "hadn't've"}, {"hadn'tve", "hadn't've"},
        {"hasnt", "hasn't"}, {"havent", "haven't"}, {"hed", "he'd"}, {"hed've", "he'd've"}, {"he'dve", "he'd've"},
        {"hes", "he's"}, {"howd", "how'd"}, {"howll", "how'll"}, {"hows", "how's"}, {"Id've", "I'd've"},
        {"I'dve", "I'd've"}, {"Im", "I'm"}, {"Ive", "I've"}, {"isnt", "isn't"}, {"itd", "it'd"},
        {"itd've", "it'd've"}, {"it'dve", "it'd've"}, {"itll", "it'll"}, {"let's", "let's"}, {"maam", "ma'am"},
        {"mightnt", "mightn't"}, {"mightnt've", "mightn't've"}, {"mightn'tve", "mightn't've"},
        {"mightve", "might've"}, {"mustnt", "mustn't"}, {"mustve", "must've"}, {"neednt", "needn't"},
        {"notve", "not've"}, {"oclock", "o'clock"}, {"oughtnt", "oughtn't"}, {"ow's'at", "'ow's'at"},
        {"'ows'at", "'ow's'at"}, {"'ow'sat", "'ow's'at"}, {"shant", "shan't"}, {"shed've", "she'd've"},
        {"she'dve", "she'd've"}, {"she's", "she's"}, {"shouldve", "should've"}, {"shouldnt", "shouldn't"},
        {"shouldnt've", "shouldn't've"}, {"shouldn'tve", "shouldn't've"}, {"somebody'd", "somebodyd"},
        {"somebodyd've", "somebody'd've"}, {"somebody'dve", "somebody'd've"}, {"somebodyll", "somebody'll"},
        {"somebodys", "somebody's"}, {"someoned", "someone'd"}, {"someoned've", "someone'd've"},
        {"someone'dve", "someone'd've"}, {"someonell", "someone'll"}, {"someones", "someone's"},
        {"somethingd", "something'd"}, {"somethingd've", "something'd've"}, {"something'dve", "something'd've"},
        {"somethingll", "something'll"}, {"thats", "that's"}, {"thered", "there'd"}, {"thered've", "there'd've"},
        {"there'dve", "there'd've"}, {"therere", "there're"}, {"theres", "there's"}, {"theyd", "they'd"},
        {"theyd've", "they'd've"}, {"they'dve", "they'd've"}, {"theyll", "they'll"}, {"theyre", "they're"},
        {"theyve", "they've"}, {"twas", "'twas"}, {"wasnt", "wasn't"}, {"wed've", "we'd've"},
        {"we'dve", "we'd've"}, {"weve", "we've"}, {"werent", "weren't"}, {"whatll", "what'll"},
        {"whatre", "what're"}, {"whats", "what's"}, {"whatve", "what've"}, {"whens", "when's"},
        {"whered", "where'd"}, {"wheres", "where's"}, {"whereve", "where've"}, {"whod", "who'd"},
        {"whod've", "who'd've"}, {"who'dve", "who'd've"}, {"wholl", "who'll"}, {"whos", "who's"},
        {"whove", "who've"}, {"whyll", "why'll"}, {"whyre", "why're"}, {"whys", "why's"}, {"wont", "won't"},
        {"wouldve", "would've"}, {"wouldnt", "wouldn't"}, {"wouldnt've", "wouldn't've"},
        {"wouldn'tve", "wouldn't've"}, {"yall", "y'all"}, {"yall'll", "y'all'll"}, {"y'allll", "y'all'll"},
        {"yall'd've", "y'all'd've"}, {"y'alld've", "y'all'd've"}, {"y'all'dve", "y'all'd've"},
        {"youd", "you'd"}, {"youd've", "you'd've"}, {"you'dve", "you'd've"}, {"youll", "you'll"},
        {"youre", "you're"}, {"youve", "you've"}};
    std::map<std::string, std::string> m;
    for (const auto& p : kPairs) m.emplace(p[0], p[1]);
    return m;
  }();
  return kMap;
}

}  // namespace

// ---- VLMEvalKit ----

std::string vlmeval_can_infer_option(const std::string& prediction, const Options& options) {
  if (contains(prediction, "Failed to obtain answer via API")) return "";
  static const char* kRefusals[] = {"Sorry, I can't help with images of people yet.", "I can't process this file.",
                                    "I'm sorry, but without the image provided", "Cannot determine the answer"};
  for (const char* r : kRefusals) {
    if (contains(prediction, r)) return "Z";
  }
  std::string spaced = prediction;
  for (char& c : spaced) {
    if (std::string_view(".()[],:;!*#{}").find(c) != std::string_view::npos) c = ' ';
  }
  const std::vector<std::string> tokens = py::split(spaced);
  int count = 0;
  for (const auto& o : options) count += has_token(tokens, letter(o.first));
  if (count == 1) {
    for (const auto& o : options) {
      const auto it = std::find(tokens.begin(), tokens.end(), letter(o.first));
      if (it != tokens.end() &&
          static_cast<int64_t>(it - tokens.begin()) > static_cast<int64_t>(tokens.size()) - 5) {
        return letter(o.first);
      }
    }
  } else if (count == 0 && has_token(tokens, "Z")) {
    return "Z";
  }
  static const Pattern kAnswerIs(R"((?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**)", true);
  const auto m = kAnswerIs.search(prediction);
  if (!m.empty()) {
    const char c = py::upper_ascii(m[1])[0];
    if (has_letter(options, c)) return letter(c);
  }
  return "";
}

std::string vlmeval_can_infer_text(const std::string& prediction, const Options& options) {
  const std::string text = py::lower(prediction);
  size_t total = 0;
  for (const auto& o : options) total += py::len(o.second);
  if (py::len(text) > 2 * total) return "";
  return only_option_in(text, options);
}

std::string vlmeval_can_infer(const std::string& prediction, const Options& options) {
  std::string c = vlmeval_can_infer_option(prediction, options);
  return c.empty() ? vlmeval_can_infer_text(prediction, options) : c;
}

std::string vlmeval_process_punctuation(const std::string& text) {
  static const Pattern kCommaDigits(R"((\d)(,)(\d))", true);
  static const Pattern kPeriod(R"((?<!\d)\.(?!\d))", true);
  return vqa_punctuation(text, kCommaDigits, kPeriod);
}

std::string vlmeval_process_answer(const std::string& text) {
  std::string s = py::replace_all(py::replace_all(text, "\n", " "), "\t", " ");
  s = py::strip(s);
  return vqa_digit_article(vlmeval_process_punctuation(s));
}

std::string vlmeval_yes_no(const std::string& prediction) {
  const auto words = py::split(vlmeval_process_punctuation(py::lower(prediction)));
  const bool yes = has_token(words, "yes"), no = has_token(words, "no");
  if (yes && !no) return "Yes";
  if (no && !yes) return "No";
  return "Unknown";
}

// ---- lmms-eval ----

std::string lmms_strip_reasoning(const std::string& response) {
  std::string text = response;
  static const std::pair<const char*, const char*> kTags[] = {{"<think>", "</think>"}, {"<analysis>", "</analysis>"}};
  for (const auto& [open, close] : kTags) {
    const std::string o = open, c = close;
    // Every closed block, shortest first (re.sub of open.*?close with DOTALL).
    std::string out;
    size_t pos = 0;
    while (true) {
      const size_t b = text.find(o, pos);
      const size_t e = b == std::string::npos ? std::string::npos : text.find(c, b + o.size());
      if (e == std::string::npos) break;
      out += text.substr(pos, b - pos);
      pos = e + c.size();
    }
    text = out + text.substr(pos);
    const size_t last = text.rfind(c);
    if (last != std::string::npos) text = text.substr(last + c.size());
  }
  return py::strip(text);
}

std::string lmms_mmbench_prefetch(const std::string& prediction, const Options& options) {
  if (!contains(prediction, "Failed to obtain answer via API")) {
    const std::vector<std::string> tokens = py::split(prediction);
    static const std::string kLetters = "ABCDE";
    auto count = [&](const std::string& prefix, const std::string& suffix) {
      int n = 0;
      for (char c : kLetters) n += has_token(tokens, prefix + c + suffix);
      return n;
    };
    if (count("", "") == 1) {
      for (char c : kLetters) {
        if (has_token(tokens, "A") && tokens.size() > 3) break;  // "A might be a quantifier"
        if (has_token(tokens, letter(c))) return letter(c);
      }
    }
    static const std::pair<const char*, const char*> kAffixes[] = {
        {"", "."}, {"", ","}, {"", ":"}, {"", ")"}, {"", ")."}, {"(", ")"},
        {"(", ")."}, {":", ""}, {":", ","}, {":", "."}, {":", ")"}, {":", ")."}};
    for (const auto& [prefix, suffix] : kAffixes) {
      if (count(prefix, suffix) != 1) continue;
      for (char c : kLetters) {
        if (has_token(tokens, std::string(prefix) + c + suffix)) return letter(c);
      }
    }
  }
  return only_option_in(py::lower(prediction), options);  // can_infer_text without the length guard
}

std::string lmms_extract_mcq_answer(const std::string& response, const std::vector<char>& letters_in) {
  if (py::strip(response).empty()) return "";
  std::vector<char> letters = letters_in;
  if (letters.empty()) letters = {'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H'};
  std::string text = py::strip(response);
  for (char c : std::string(",.!?;:'\"")) text = py::strip_chars(text, std::string(1, c));
  text = " " + text + " ";
  struct Candidate {
    char letter;
    size_t position;
    int priority;
  };
  std::vector<Candidate> candidates;
  const std::pair<std::string, int> kForms[] = {{"(X)", 6}, {"X.", 5}, {"X:", 4}, {"X)", 3}, {"X ", 2}};
  for (const auto& [form, priority] : kForms) {
    for (char c : letters) {
      std::string f = form;
      f[f.find('X')] = c;
      const size_t at = text.rfind(f);
      if (at != std::string::npos) candidates.push_back({c, at, priority});
    }
  }
  static const char* kPhrases[] = {"the answer is", "answer is", "the correct answer is", "correct answer is",
                                   "the best answer is", "best answer is", "the correct option is",
                                   "correct option is", "the best option is", "best option is", "the choice is",
                                   "choice is", "the correct choice is", "correct choice is", "i choose",
                                   "i select", "i pick", "my answer is", "my choice is",
                                   "\xec\x98\xb5\xec\x85\x98",              // Korean "option"
                                   "\xec\xa0\x95\xeb\x8b\xb5\xec\x9d\x80",  // Korean "the answer is"
                                   "\xeb\x8b\xb5\xec\x9d\x80",              // Korean "answer is"
                                   "\xeb\x8b\xb5:",                         // Korean "answer:"
                                   "\xe7\xad\x94\xe6\xa1\x88\xe6\x98\xaf",  // Chinese "the answer is"
                                   "\xe7\xad\x94\xe6\xa1\x88\xe4\xb8\xba",  // Chinese "the answer is"
                                   "\xe9\x80\x89",                          // Chinese "choose"
                                   "\xe7\xad\x94\xe3\x81\x88\xe3\x81\xaf"};  // Japanese "the answer is"
  const std::string lowered = py::lower(text);
  for (const char* phrase : kPhrases) {
    const size_t at = lowered.find(phrase);
    if (at == std::string::npos) continue;
    const size_t after = at + std::string(phrase).size();
    for (char c : letters) {
      const size_t pos = text.find(c, after);
      if (pos != std::string::npos) candidates.push_back({c, pos, 7});
    }
  }
  const std::u32string stripped = py::decode(py::strip(text));
  for (char c : letters) {
    if (!stripped.empty() && stripped.front() == static_cast<char32_t>(c) &&
        (stripped.size() == 1 || !py::is_alpha(stripped[1]))) {
      candidates.push_back({c, 0, 10});
    }
  }
  for (char c : letters) {
    if (!stripped.empty() && stripped.back() == static_cast<char32_t>(c) &&
        (stripped.size() == 1 || !py::is_alpha(stripped[stripped.size() - 2]))) {
      candidates.push_back({c, text.size() - 1, 9});
    }
  }
  if (candidates.empty()) {
    for (char c : letters) {
      const size_t at = text.rfind(c);
      if (at != std::string::npos) candidates.push_back({c, at, 0});
    }
  }
  if (candidates.empty()) return "";
  // sort(key=(priority, position), reverse=True) is stable: the first of equal keys wins.
  const Candidate* best = &candidates.front();
  for (const auto& c : candidates) {
    if (c.priority > best->priority || (c.priority == best->priority && c.position > best->position)) best = &c;
  }
  return letter(best->letter);
}

std::string lmms_vqa_normalize(const std::string& text) {
  std::string s = py::lower(text);
  s = py::replace_all(py::replace_all(s, ",", ""), "?", "");
  s = py::replace_all(s, "'s", " 's");
  s = py::strip(s);
  s = py::strip(py::replace_all(py::replace_all(s, "\n", " "), "\t", " "));
  static const Pattern kCommaDigits(R"((?<=\d)(\,)+(?=\d))", true);
  static const Pattern kPeriod(R"((?!<=\d)(\.)(?!\d))", true);
  return vqa_digit_article(vqa_punctuation(s, kCommaDigits, kPeriod));
}

MmmuChoice lmms_mmmu_choice(const std::string& response_in, const Options& options, py::Random& rng) {
  std::string response = response_in;
  for (char c : std::string(",.!?;:'")) response = py::strip_chars(response, std::string(1, c));
  response = " " + response + " ";
  std::vector<char> candidates;
  bool with_brackets = false, by_index = true;
  for (const auto& o : options) {
    if (contains(response, "(" + letter(o.first) + ")")) {
      candidates.push_back(o.first);
      with_brackets = true;
    }
  }
  if (candidates.empty()) {
    for (const auto& o : options) {
      if (contains(response, letter(o.first) + " ")) candidates.push_back(o.first);
    }
  }
  if (candidates.empty()) {
    for (const auto& o : options) {
      if (contains(response, letter(o.first) + ".")) candidates.push_back(o.first);
    }
  }
  const std::string lowered = py::lower(response);
  if (candidates.empty() && py::split(response).size() > 5) {
    for (const auto& o : options) {
      if (contains(lowered, py::lower(o.second))) {
        candidates.push_back(o.first);
        by_index = false;
      }
    }
  }
  MmmuChoice out;
  if (candidates.empty()) {
    out.letter = letter(options[rng.randbelow(options.size())].first);
    out.random_fallback = true;
    return out;
  }
  if (candidates.size() == 1) {
    out.letter = letter(candidates[0]);
    return out;
  }
  // The candidate found furthest right; np.argmax takes the first of equal positions (rfind's -1 included).
  int64_t best_position = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const char c = candidates[i];
    size_t at;
    if (!by_index) {
      const auto it = std::find_if(options.begin(), options.end(), [&](const auto& o) { return o.first == c; });
      at = lowered.rfind(py::lower(it->second));
    } else {
      at = response.rfind(with_brackets ? "(" + letter(c) + ")" : " " + letter(c) + " ");
    }
    const int64_t position = at == std::string::npos ? -1 : static_cast<int64_t>(at);
    if (i == 0 || position > best_position) {
      best_position = position;
      out.letter = letter(c);
    }
  }
  return out;
}

std::string OpenValue::repr() const { return is_number ? py::float_repr(number) : text; }

std::vector<OpenValue> mmmu_normalize(const std::string& text_in) {
  const std::string text = py::strip(text_in);
  if (const auto v = py::to_float(py::replace_all(text, ",", ""))) {
    OpenValue o;
    o.is_number = true;
    o.number = py::round_to(*v, 2);
    return {o};
  }
  const std::string lowered = py::lower(text);
  if (py::len(lowered) == 1) {
    OpenValue a, b;
    a.text = " " + lowered;
    b.text = lowered + " ";
    return {a, b};
  }
  OpenValue o;
  o.text = lowered;
  return {o};
}

std::vector<OpenValue> mmmu_parse_open(const std::string& response) {
  // Key sub-responses.
  std::string text = py::lower(py::strip_chars(py::strip(response), "."));
  std::vector<std::string> pieces;
  // re.split(r"\.\s(?=[A-Z])|\n") after lower-casing: [A-Z] cannot follow any more, so only newlines split.
  size_t start = 0;
  while (true) {
    const size_t nl = text.find('\n', start);
    pieces.push_back(text.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  std::vector<std::string> indicators = {"could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result "};
  std::vector<std::string> keys;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i + 1 == pieces.size()) indicators.push_back("=");
    std::string shortest;
    bool have = false;
    for (const auto& indicator : indicators) {
      if (!contains(pieces[i], indicator)) continue;
      const std::string tail = py::strip(py::after_last(pieces[i], indicator));
      if (!have || shortest.empty() || py::len(tail) < py::len(shortest)) shortest = tail;
      have = true;
    }
    if (!shortest.empty()) {
      const std::string s = py::strip(shortest);
      if (s != ":" && s != "," && s != "." && s != "!" && s != "?" && s != ";" && s != "'") keys.push_back(shortest);
    }
  }
  if (keys.empty()) keys.push_back(text);
  std::vector<std::string> candidates = keys;
  static const Pattern kCommas(R"(-?\b\d{1,3}(?:,\d{3})+\b)", true);
  static const Pattern kScientific(R"(-?\d+(?:\.\d+)?[eE][+-]?\d+)", true);
  static const Pattern kSimple(R"(-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d]))", true);
  for (const auto& k : keys) {
    for (const Pattern* p : {&kCommas, &kScientific, &kSimple}) {
      for (const auto& m : p->find_all(k)) candidates.push_back(m[0]);
    }
  }
  std::vector<OpenValue> out;
  for (const auto& c : candidates) {
    for (auto& v : mmmu_normalize(c)) {
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(std::move(v));
    }
  }
  return out;
}

bool mmmu_eval_open(const std::string& gold, const std::vector<OpenValue>& predictions) {
  const std::vector<OpenValue> answers = mmmu_normalize(gold);
  for (const auto& p : predictions) {
    for (const auto& a : answers) {
      if (p.is_number) {
        if (a.is_number && a.number == p.number) return true;
      } else if (!a.is_number && contains(p.text, a.text)) {
        return true;
      }
    }
  }
  return false;
}

// ---- shared ----

std::string vqa_digit_article(const std::string& text) {
  static const std::map<std::string, std::string> kNumbers = {
      {"none", "0"}, {"zero", "0"}, {"one", "1"}, {"two", "2"}, {"three", "3"}, {"four", "4"},
      {"five", "5"}, {"six", "6"}, {"seven", "7"}, {"eight", "8"}, {"nine", "9"}, {"ten", "10"}};
  std::vector<std::string> words;
  for (auto& w : py::split(py::lower(text))) {
    const auto n = kNumbers.find(w);
    if (n != kNumbers.end()) w = n->second;
    if (w != "a" && w != "an" && w != "the") words.push_back(w);
  }
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    const auto c = contractions().find(words[i]);
    out += (i ? " " : "") + (c == contractions().end() ? words[i] : c->second);
  }
  return out;
}

std::vector<double> vqa_matches(const std::string& prediction, const std::vector<std::string>& references) {
  std::vector<double> out;
  for (size_t i = 0; i < references.size(); ++i) {
    int matching = 0;
    for (size_t j = 0; j < references.size(); ++j) matching += (j != i && references[j] == prediction);
    out.push_back(std::min(1.0, static_cast<double>(matching) / 3));
  }
  return out;
}

bool relaxed_correctness(const std::string& target, const std::string& prediction) {
  auto to_float = [](const std::string& s) -> std::optional<double> {
    if (!s.empty() && s.back() == '%') {  // float(text.rstrip("%")) / 100
      const auto v = py::to_float(s.substr(0, s.find_last_not_of('%') + 1));
      return v ? std::optional<double>(*v / 100.0) : std::nullopt;
    }
    return py::to_float(s);
  };
  const auto p = to_float(prediction);
  const auto t = to_float(target);
  if (p && t && *t != 0.0) return std::fabs(*p - *t) / std::fabs(*t) <= 0.05;
  return py::lower(prediction) == py::lower(target);
}

}  // namespace swiftcpp::eval::mm
