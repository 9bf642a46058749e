// Inputs the fuzz targets (fuzz/, scripts/fuzz.sh) found to crash, hang or leak a parser before
// it was fixed, kept in tests/fuzz-regressions/<target>/: each must now end in success or
// sluice::Error, as the targets require (fuzz/parsers.h). In the sanitizer build
// (scripts/test.sh --sanitize) they also run under ASan and UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "parsers.h"

namespace sluice {
namespace {

const std::filesystem::path kRegressions = SLUICE_SOURCE_DIR "/tests/fuzz-regressions";

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FuzzRegression, EveryKeptInputIsRefusedOrAccepted) {
  int inputs = 0;
  for (const auto& target : fuzz::parser_targets()) {
    const auto dir = kRegressions / target.name;
    if (!std::filesystem::exists(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      SCOPED_TRACE(entry.path().string());
      const std::vector<uint8_t> bytes = read_bytes(entry.path());
      EXPECT_NO_THROW(target.parse(bytes.data(), bytes.size()));
      ++inputs;
    }
  }
  std::printf("%d kept inputs\n", inputs);
  std::filesystem::remove_all(fuzz::input_dir());
}

TEST(FuzzRegression, EveryFolderNamesATarget) {
  if (!std::filesystem::exists(kRegressions)) GTEST_SKIP() << "no inputs kept yet";
  for (const auto& entry : std::filesystem::directory_iterator(kRegressions)) {
    bool known = false;
    for (const auto& target : fuzz::parser_targets()) known |= entry.path().filename() == target.name;
    EXPECT_TRUE(known) << entry.path() << " is not a fuzz target's name";
  }
}

}  // namespace
}  // namespace sluice
