// Fuzzes the GGUF reader (lib/io/gguf.*): GgufFile::open on arbitrary bytes (magic, version, tensor and metadata
// counts, typed key/values, string and array lengths, tensor infos, alignment), then decodes every tensor.
#include <ATen/ATen.h>

#include "fuzz_util.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  const auto path = fuzz::write_scratch("model.gguf", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const auto file = GgufFile::open(path);
    for (const auto& [key, value] : file->metadata()) (void)value.value.dump();
    for (const auto& info : file->tensors()) {
      const at::Tensor t = file->tensor(info.name);
      if (t.numel() != info.numel()) std::abort();
    }
  });
  return 0;
}
