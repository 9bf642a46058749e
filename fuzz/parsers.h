// The parsers of untrusted input, each as a function of raw bytes: the libFuzzer targets
// (fuzz_main.cpp, one binary per entry) and the regression suite (tests/unit/
// fuzz_regression_test.cpp, over the inputs kept in tests/fuzz-regressions/) call the same ones.
// The contract: given any bytes a parser either succeeds or throws sluice::Error (the clear
// message the user sees); anything else escapes, and libFuzzer reports it as a crash, as it does
// sanitizer reports, leaks and hangs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace sluice {
class Tokenizer;
}

namespace sluice::fuzz {

struct ParserTarget {
  const char* name;  // also the folder of its seeds, corpus and regression inputs
  void (*parse)(const uint8_t* data, size_t size);
};
std::span<const ParserTarget> parser_targets();
const ParserTarget& parser_target(std::string_view name);  // aborts on an unknown name

// Writes the input as `name` in a folder of this process's own and returns its path: most
// loaders read files by path (and choose the format by the file's name).
std::filesystem::path write_input(const uint8_t* data, size_t size, const std::string& name);
const std::filesystem::path& input_dir();

// Runs `parse`; sluice::Error is the expected way to refuse input, so it is swallowed.
template <typename F>
void expect_success_or_error(F&& parse);

// Encodes and decodes a few fixed texts with a tokenizer that loaded, so what the loader built
// (vocabulary, merges, pipeline) is used, not only parsed.
void exercise_tokenizer(const Tokenizer& tokenizer);

}  // namespace sluice::fuzz

#include "core/error.h"

template <typename F>
void sluice::fuzz::expect_success_or_error(F&& parse) {
  try {
    parse();
  } catch (const sluice::Error&) {
  }
}
