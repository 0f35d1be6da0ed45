// Fuzzes training recipes (lib/train/config.*, lib/config/schema.*): the bytes before the first "\n%%\n" are a
// YAML recipe file, each line after it a `key=value` override, all through load_train_config.
#include "fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  const auto [recipe, rest] = fuzz::split_once({reinterpret_cast<const char*>(data), size}, "\n%%\n");
  const auto path = fuzz::write_scratch("recipe.yaml", recipe);
  std::vector<std::string> overrides;
  std::string_view r = rest;
  while (!r.empty()) {
    const size_t nl = r.find('\n');
    overrides.emplace_back(r.substr(0, nl));
    if (nl == std::string_view::npos) break;
    r.remove_prefix(nl + 1);
  }
  fuzz::expect_clean([&] {
    const TrainConfig config = load_train_config(path.string(), overrides);
    (void)train_config_schema().dump(config).dump();
  });
  fuzz::expect_clean([&] { (void)load_train_config("", overrides); });
  return 0;
}
