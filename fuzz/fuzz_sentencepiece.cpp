// Fuzzes sentencepiece model loading through the shim (lib/tokenizer/sentencepiece.*, spm_shim.cpp): arbitrary
// bytes as tokenizer.model, then encode/decode of a fixed text and the id queries over the whole vocabulary.
#include "fuzz_util.h"
#include "tokenizer/sentencepiece.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  const auto path = fuzz::write_scratch("tokenizer.model", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const auto tok = SentencePieceTokenizer::load(path);
    const auto ids = tok->encode("Once upon a time, <s> there was 123 \xE2\x96\x81 caf\xC3\xA9.");
    (void)tok->decode(ids);
    const int n = std::min(tok->vocab_size(), 4096);
    for (int id = 0; id < n; ++id) (void)tok->piece_to_id(tok->id_to_piece(id));
    (void)tok->is_byte(-1);
    (void)tok->bos_id();
    (void)tok->eos_ids();
  });
  return 0;
}
