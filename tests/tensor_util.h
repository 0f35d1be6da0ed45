// Shared tensor helpers of the test suite: the device under test, rounding tolerances, reference JSON as tensors.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace swiftcpp::test {

/// The device the device-aware tests run on: SWIFTCPP_TEST_DEVICE (cpu, cuda, cuda:N), default cpu.
/// scripts/gpu_check.sh sets it to cuda.
inline c10::Device test_device() {
  const char* name = std::getenv("SWIFTCPP_TEST_DEVICE");
  return c10::Device(name != nullptr && *name != '\0' ? name : "cpu");
}

/// The absolute tolerance for two float computations of the same quantity that may differ only in rounding
/// (for instance a reduction split differently across threads): `ulps` units of the dtype's machine epsilon
/// times `magnitude` (the largest magnitude among the terms involved, or of the result).
inline double rounding_tolerance(at::ScalarType dtype, double magnitude, double ulps) {
  double eps = 0;
  switch (dtype) {
    case at::kDouble: eps = 0x1p-52; break;
    case at::kFloat: eps = 0x1p-23; break;
    case at::kBFloat16: eps = 0x1p-7; break;
    case at::kHalf: eps = 0x1p-10; break;
    default: ADD_FAILURE() << "rounding_tolerance: not a floating dtype"; return 0;
  }
  return ulps * eps * magnitude;
}

/// Expects `actual` to equal `expected` up to rounding: every element within rounding_tolerance(dtype,
/// max |expected|, ulps). For results whose operation order is not fixed (thread-split reductions).
inline void expect_equal_up_to_rounding(const at::Tensor& actual, const at::Tensor& expected, double ulps,
                                        const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  const double magnitude = e.abs().max().item<double>();
  const double tolerance = rounding_tolerance(expected.scalar_type(), magnitude, ulps);
  const double gap = (a - e).abs().max().item<double>();
  EXPECT_LE(gap, tolerance) << what << ": largest difference " << gap << " over a tolerance of " << ulps
                            << " ulps of " << magnitude;
}

/// Nested JSON lists of numbers -> a float64 tensor of the same shape.
inline at::Tensor json_to_tensor(const Json& j) {
  std::vector<int64_t> shape;
  const Json* cur = &j;
  while (cur->is_array()) {
    shape.push_back(static_cast<int64_t>(cur->size()));
    if (cur->empty()) break;
    cur = &(*cur)[0];
  }
  std::vector<double> flat;
  std::function<void(const Json&)> walk = [&](const Json& x) {
    if (x.is_array()) {
      for (const auto& e : x) walk(e);
    } else {
      flat.push_back(x.get<double>());
    }
  };
  walk(j);
  return at::tensor(flat, at::kDouble).view(shape);
}

}  // namespace swiftcpp::test
