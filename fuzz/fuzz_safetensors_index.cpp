// Fuzzes the sharded-checkpoint index (lib/io/safetensors.*): Checkpoint::open on a model.safetensors.index.json of
// arbitrary bytes, beside one valid shard "model-00001-of-00001.safetensors" holding tensors "a" and "b".
#include <ATen/ATen.h>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  static const bool shard_written = [] {
    save_safetensors(fuzz::scratch_dir() / "model-00001-of-00001.safetensors",
                     {{"a", at::arange(6, at::kFloat).reshape({2, 3})}, {"b", at::ones({4}, at::kLong)}});
    return true;
  }();
  (void)shard_written;
  const auto index = fuzz::write_scratch("model.safetensors.index.json", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const Checkpoint ckpt = Checkpoint::open(index);
    for (const auto& name : ckpt.names()) {
      (void)ckpt.tensor(name);
      (void)ckpt.file_of(name);
    }
  });
  return 0;
}
