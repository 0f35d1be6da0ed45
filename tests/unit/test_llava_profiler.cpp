// The LLaVA vision encoder marks its parts as named profiler ranges, which bench/bench_mm_train.cpp splits a
// training step by: one "vision_tower" range per encode, holding every image, then one "multi_modal_projector".
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "models/decoder/decoder.h"
#include "tests/tensor_util.h"

namespace swiftcpp {
namespace {

struct SeenRanges {
  std::vector<std::string> names;
  std::vector<int64_t> images;  // size(0) of each range's first input (-1: none)
};
thread_local SeenRanges* g_seen = nullptr;

std::unique_ptr<at::ObserverContext> on_user_scope(const at::RecordFunction& fn) {
  if (g_seen != nullptr) {
    g_seen->names.emplace_back(fn.name());
    const auto inputs = fn.inputs();
    g_seen->images.push_back(!inputs.empty() && inputs[0].isTensor() ? inputs[0].toTensor().size(0) : -1);
  }
  return nullptr;
}

// The user-scope ranges one encode of `images` images opens, with their inputs.
SeenRanges ranges_of_encode(CausalLM& model, int64_t images) {
  const int64_t size = model->config().multimodal->image_size;
  const at::Tensor pixel_values = at::randn({images, 3, size, size}).to(test::test_device());  // [N, C, H, W]
  SeenRanges seen;
  g_seen = &seen;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&on_user_scope).needsInputs(true).scopes({at::RecordScope::USER_SCOPE}));
  {
    at::NoGradGuard no_grad;
    model->vision()->encode(pixel_values);
  }
  at::removeCallback(handle);
  g_seen = nullptr;
  return seen;
}

TEST(LlavaProfilerRanges, EncodeMarksTheTowerOnceWithEveryImageThenTheProjector) {
  const fs::path dir = test::assets() / "reference/llava/tiny-llava";
  SWIFTCPP_REQUIRE_SHARED(dir / "config.json");
  CausalLM model = load_causal_lm(dir, {test::test_device(), at::kFloat});
  for (int64_t images : {1, 3}) {
    const SeenRanges seen = ranges_of_encode(model, images);
    ASSERT_EQ(seen.names, (std::vector<std::string>{"vision_tower", "multi_modal_projector"})) << images;
    EXPECT_EQ(seen.images[0], images);
  }
}

}  // namespace
}  // namespace swiftcpp
