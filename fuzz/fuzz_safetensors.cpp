// Fuzzes the safetensors reader (lib/io/safetensors.*): SafetensorsFile::open on arbitrary bytes (header length,
// JSON header, dtypes, shapes, offsets, metadata), then every tensor view it hands out.
#include <ATen/ATen.h>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  const auto path = fuzz::write_scratch("model.safetensors", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const auto file = SafetensorsFile::open(path);
    for (const auto& info : file->tensors()) {
      const at::Tensor t = file->tensor(info.name);
      if (t.numel() != info.numel()) std::abort();
      if (t.numel() > 0 && t.numel() <= 4096) (void)t.sum();
    }
  });
  return 0;
}
