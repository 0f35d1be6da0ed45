// Fuzzes the Hugging Face configuration readers that build models: config.json through the architecture registry
// and the family specs (models/registry.cpp, models/decoder/config.cpp) and PEFT's adapter_config.json
// (lib/peft/lora.cpp). The first byte picks the file; the rest is its content.
#include "fuzz_util.h"
#include "models/registry.h"
#include "peft/lora.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_clean([&] {
    if (data[0] % 2 == 0) {
      fuzz::write_scratch("config.json", text);
      const DecoderConfig config = load_decoder_config(fuzz::scratch_dir());
      config.validate("fuzz");
    } else {
      fuzz::write_scratch("adapter_config.json", text);
      const LoraConfig config = read_adapter_config(fuzz::scratch_dir());
      (void)adapter_config_json(config).dump();
    }
  });
  return 0;
}
