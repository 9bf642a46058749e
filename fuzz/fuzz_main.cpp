// The libFuzzer entry point of one target; SLUICE_FUZZ_TARGET names it (fuzz/CMakeLists.txt).
#include "parsers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto& target = sluice::fuzz::parser_target(SLUICE_FUZZ_TARGET);
  target.parse(data, size);
  return 0;
}
