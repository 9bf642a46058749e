// The O_DIRECT read probes: of a temporary file (sluice profile) and of an existing one (the
// disk tier's expert files, when the profile has no disk figure).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/engine_plan.h"
#include "runtime/planner/profiler.h"
#include "test_util.h"

namespace sluice {
namespace {

// O_DIRECT is a file system's choice (tmpfs refuses it): either a positive rate, or that reason.
void expect_rate_or_refusal(const std::optional<double>& rate, const std::string& why) {
  if (rate) {
    EXPECT_GT(*rate, 0);
    EXPECT_TRUE(std::isfinite(*rate));
  } else {
    EXPECT_NE(why.find("refuses O_DIRECT"), std::string::npos) << why;
  }
}

TEST(DiskProbe, ReadsAnExistingFileInWhole4MiBReads) {
  testing::TempDir dir;
  testing::write_file(dir / "experts.bin", std::string((size_t(9) << 20) + 123, 'x'));
  std::string why;
  const auto rate = measure_file_read_bandwidth(dir / "experts.bin", size_t(256) << 20, &why);
  expect_rate_or_refusal(rate, why);
}

TEST(DiskProbe, AFileSmallerThanOneReadIsNotMeasuredAndSaysSo) {
  testing::TempDir dir;
  testing::write_file(dir / "tiny.bin", std::string(1000, 'x'));
  std::string why;
  EXPECT_FALSE(measure_file_read_bandwidth(dir / "tiny.bin", size_t(256) << 20, &why));
  EXPECT_NE(why.find("tiny.bin"), std::string::npos) << why;
  EXPECT_NE(why.find("smaller than one 4 MiB read"), std::string::npos) << why;
}

TEST(DiskProbe, TheTemporaryFileProbeLeavesNothingBehind) {
  testing::TempDir dir;
  std::string why;
  expect_rate_or_refusal(measure_disk_read_bandwidth(dir.path(), size_t(8) << 20, &why), why);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(DiskProbe, ExpertDiskReadsTheLargestOfTheExpertFiles) {
  testing::TempDir dir;
  testing::write_file(dir / "small.safetensors", std::string(1000, 'x'));
  testing::write_file(dir / "large.safetensors", std::string(size_t(8) << 20, 'x'));
  ExpertFiles files;
  files.files = {dir / "small.safetensors", dir / "large.safetensors"};
  std::string why;
  const auto rate = measure_expert_disk(files, &why);
  expect_rate_or_refusal(rate, why);
  if (!rate) {
    EXPECT_NE(why.find("large.safetensors"), std::string::npos) << why;
  }

  files.files = {dir / "missing.safetensors"};
  EXPECT_FALSE(measure_expert_disk(files, &why));
  EXPECT_EQ(why, "the experts' files cannot be read");
}

}  // namespace
}  // namespace sluice
