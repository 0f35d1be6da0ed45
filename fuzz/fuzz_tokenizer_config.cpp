// Fuzzes the special-token files of a tokenizer folder (lib/tokenizer/tokenizer.cpp load_tokenizer):
// generation_config.json, tokenizer_config.json (bos/eos/pad tokens, added_tokens_decoder, add_bos_token) and
// config.json, beside the sentencepiece model of stories260K. The first byte picks the file; the rest is its content.
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

#ifndef SWIFTCPP_SOURCE_DIR
#define SWIFTCPP_SOURCE_DIR "."
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  static const fs::path dir = [] {
    const fs::path d = fuzz::scratch_dir() / "tokenizer";
    fs::create_directories(d);
    const fs::path model = fs::path(SWIFTCPP_SOURCE_DIR) / "fuzz" / "data" / "tokenizer.model";
    fs::copy_file(model, d / "tokenizer.model", fs::copy_options::overwrite_existing);
    return d;
  }();
  if (size == 0) return 0;
  static const char* const kFiles[] = {"generation_config.json", "tokenizer_config.json", "config.json"};
  for (const char* f : kFiles) fs::remove(dir / f);
  const char* file = kFiles[data[0] % 3];
  std::ofstream(dir / file, std::ios::binary).write(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_clean([&] {
    const auto tok = load_tokenizer(dir);
    const auto ids = tok->encode_with_specials("Once upon a time <s></s>", true);
    (void)tok->decode_with_special_tokens(ids);
  });
  return 0;
}
