// Comparing against another implementation's numbers (the golden parity tests): a tolerance as
// |ours - theirs| <= atol + rtol |theirs|, the worst errors seen per kind of value, and the one-line report the
// tests print ("[parity] name: kind abs A rel R; ...").
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>

namespace swiftcpp::test {

struct Tol {
  double rtol, atol;
};

/// The largest absolute and relative (where the reference is not 0) errors of one kind of value.
struct Worst {
  double abs = 0, rel = 0;
  void add(double actual, double expected) {
    const double d = std::abs(actual - expected);
    abs = std::max(abs, d);
    if (expected != 0) rel = std::max(rel, d / std::abs(expected));
  }
};

inline void expect_close(double actual, double expected, Tol tol, const std::string& what, Worst& worst) {
  EXPECT_LE(std::abs(actual - expected), tol.atol + tol.rtol * std::abs(expected))
      << what << ": ours " << actual << ", reference " << expected;
  worst.add(actual, expected);
}

inline void print_parity(const std::string& name, const std::map<std::string, Worst>& worst) {
  std::cout << "[parity] " << name << ":";
  for (const auto& [kind, w] : worst) std::cout << " " << kind << " abs " << w.abs << " rel " << w.rel << ";";
  std::cout << std::endl;
}

}  // namespace swiftcpp::test
