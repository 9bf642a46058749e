// Helpers shared by the tests: a temporary folder removed at the end, small file writers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>

#include "io/safetensors.h"
#include "model/expert_quant.h"

// Whether this build runs under AddressSanitizer: GCC defines __SANITIZE_ADDRESS__, clang before
// 15 only answers __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define SLUICE_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLUICE_UNDER_ASAN 1
#endif
#endif

namespace sluice::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "sluice-test-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// `name` as a parameterised test's name: gtest takes letters, digits and '_' only.
inline std::string test_name(std::string name) {
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

// The name of a case of a preset and an expert dtype ("tiny_mixtral_int8"), and a suffix.
inline std::string preset_dtype_name(std::string_view preset, ExpertDtype dtype,
                                     std::string_view suffix = "") {
  return test_name(std::string(preset) + "_" + std::string(expert_dtype_name(dtype)) +
                   std::string(suffix));
}

// Whether two tensors have the same dtype, shape and bytes.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Rewrites dir/model.safetensors with `edit` applied to each tensor's spec (return false to drop
// the tensor); data of an edited size is zero-filled.
void rewrite_checkpoint(const std::filesystem::path& dir,
                        const std::function<bool(TensorSpec&)>& edit);
// Rewrites dir/config.json with `edit` applied.
void edit_config(const std::filesystem::path& dir,
                 const std::function<void(nlohmann::json&)>& edit);

// Runs a shell command, returning its exit status and capturing stdout, and stderr too unless
// `with_stderr` is false (then stderr goes where the test's stderr goes).
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult run_command(const std::string& command, bool with_stderr = true);

// max |a - b| / max |b|: the error of `a` relative to the scale of the reference `b`.
inline double relative_max_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

// The sluice binary under test: the build's, or $SLUICE_BINARY where the tests run elsewhere
// than they were built (the prebuilt device bundle, scripts/device-bundle.sh).
inline std::string sluice_binary() {
  const char* env = std::getenv("SLUICE_BINARY");
  return env && *env ? env : SLUICE_BINARY;
}

// The command line of the sluice binary under test with `args`.
inline std::string sluice_command(const std::string& args) {
  return sluice_binary() + " " + args;
}

// Expects `statement` to throw sluice::Error whose message contains every one of `parts`.
#define EXPECT_ERROR_MENTIONS(statement, ...)                                    \
  do {                                                                           \
    try {                                                                        \
      statement;                                                                 \
      ADD_FAILURE() << "expected an error from " #statement;                     \
    } catch (const sluice::Error& e) {                                           \
      for (const char* part : {__VA_ARGS__})                                     \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)           \
            << "message '" << e.what() << "' does not mention '" << part << "'"; \
    }                                                                            \
  } while (0)

}  // namespace sluice::testing
