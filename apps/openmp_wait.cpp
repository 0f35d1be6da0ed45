// Linked into every executable of the project (CMakeLists.txt: swiftcpp_openmp_wait): before any shared library
// initialises, an executable whose environment leaves OpenMP's wait policy to libgomp's default starts itself
// again with a bounded spin added (core/runtime.h: kOpenmpSpinEntry), so that libgomp, which reads the setting
// once when it loads, makes waiting threads sleep after a short spin instead of spinning for milliseconds.
//
// It runs from the executable's .preinit_array: the libraries are loaded and relocated but none of their
// initialisers has run (the C library's included, so the environment is read from the envp argument and nothing
// of the C++ runtime is used). The cost is one more exec and relocation of the libraries, about 40 ms; no
// initialiser runs twice. Where the exec fails (no /proc) the process goes on with libgomp's default.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/runtime.h"

namespace {

void bound_openmp_spin(int /*argc*/, char** argv, char** envp) {
  if (envp == nullptr || argv == nullptr || swiftcpp::openmp_wait_chosen(envp)) return;
  size_t n = 0;
  while (envp[n] != nullptr) ++n;
  auto** env = static_cast<char**>(std::malloc((n + 2) * sizeof(char*)));
  if (env == nullptr) return;
  std::memcpy(env, envp, n * sizeof(char*));
  env[n] = const_cast<char*>(swiftcpp::kOpenmpSpinEntry);
  env[n + 1] = nullptr;
  execve("/proc/self/exe", argv, env);
  std::free(env);  // the exec failed: libgomp's default wait
}

}  // namespace

// NOLINTNEXTLINE: the loader calls the functions of .preinit_array with (argc, argv, envp).
__attribute__((section(".preinit_array"), used)) void (*const swiftcpp_preinit_openmp_wait)(int, char**, char**) =
    bound_openmp_spin;
