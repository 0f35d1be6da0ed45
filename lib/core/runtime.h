// Process-wide runtime set-up: thread count and BLAS detection.
#pragma once

#include <string>

namespace swiftcpp {

/// Number of CPU cores this process may run on (its affinity mask, at least 1).
int usable_cores();

/// Sets LibTorch's intra-op thread count; `threads <= 0` means usable_cores(). Returns the count set.
int configure_threads(int threads);

/// Which BLAS library is loaded into the process: "openblas", "mkl", "blis", "reference" or "unknown".
std::string loaded_blas();

/// A warning to print when only the slow reference BLAS is loaded; empty when the BLAS is fine.
std::string blas_warning();

}  // namespace swiftcpp
