// Fuzzes the compressed eval-data readers (lib/eval/archive.*): the bytes as a zip archive (first byte even:
// central directory, local headers, stored and deflated members, CRCs) or a bzip2 file (odd: single and
// concatenated streams), read in full.
#include "eval/archive.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_clean([&] {
    if (data[0] % 2 == 0) {
      const ZipArchive zip = ZipArchive::open(fuzz::write_scratch("data.zip", rest));
      for (const auto& name : zip.names()) {
        if (!zip.contains(name)) std::abort();
        fuzz::expect_clean([&] { (void)zip.read(name); });
      }
    } else {
      (void)read_maybe_compressed(fuzz::write_scratch("data.txt.bz2", rest));
    }
  });
  return 0;
}
