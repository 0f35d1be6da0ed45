// Fuzzes byte-level BPE (lib/tokenizer/bpe.*). First byte even: the rest is a tokenizer.json (normalizers,
// pre-tokenizers with their regexes, added tokens, merges, post-processor, decoder) loaded through
// BpeTokenizer::from_json and used on a fixed text. Odd: the rest is text encoded with a small fixed tokenizer and
// decoded back; valid UTF-8 must come back unchanged (that tokenizer has no normalizer).
#include "core/json.h"
#include "fuzz_util.h"
#include "tokenizer/bpe.h"

#ifndef SWIFTCPP_SOURCE_DIR
#define SWIFTCPP_SOURCE_DIR "."
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  static const auto fixed =
      BpeTokenizer::load(fs::path(SWIFTCPP_SOURCE_DIR) / "fuzz" / "data" / "tokenizer.json");
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    fuzz::expect_clean([&] {
      const auto tok = BpeTokenizer::from_json(parse_json(rest, "fuzz"), "fuzz");
      for (const char* text : {"Hello, world! 123 <|endoftext|>  \xC3\xA9t\xC3\xA9\n", ""}) {
        (void)tok->decode(tok->encode(text));
        (void)tok->decode_with_special_tokens(tok->encode_with_special_tokens(text));
      }
    });
  } else {
    fuzz::expect_clean([&] {
      const auto ids = fixed->encode(rest);
      const std::string back = fixed->decode(ids);
      if (valid_utf8(rest) && back != rest) std::abort();
      (void)fixed->decode_with_special_tokens(fixed->encode_with_special_tokens(rest));
    });
  }
  return 0;
}
