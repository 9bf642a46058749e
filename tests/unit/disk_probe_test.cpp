// The O_DIRECT read probes: of a temporary file (sluice profile), of an existing one, and of the
// disk tier's experts in their files (bench, beside a run with experts on disk).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/engine_plan.h"
#include "io/direct_reader.h"
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

// The expert probe reads whole experts as the tier does, from every file they are in.
TEST(DiskProbe, ExpertDiskReadsTheExpertsFromTheirFiles) {
  testing::TempDir dir;
  testing::write_file(dir / "a.safetensors", std::string(size_t(20) << 20, 'x'));
  testing::write_file(dir / "b.safetensors", std::string(size_t(3) << 20, 'y'));
  ExpertFiles files;
  files.files = {dir / "a.safetensors", dir / "b.safetensors"};
  // Two layers of two experts: misaligned ranges, one larger than a 4 MiB read, in both files.
  auto expert = [](int file, uint64_t offset, size_t bytes) {
    ExpertSource e;
    for (size_t j = 0; j < 3; ++j) e.weights[j] = {file, offset + j * bytes, bytes};
    return e;
  };
  files.layers = {{expert(0, 17, size_t(5) << 20), expert(1, 4096, 1000)},
                  {expert(1, 100, 2000), expert(0, 3, 1 << 20)}};
  std::string why;
  expect_rate_or_refusal(measure_expert_disk(files, &why), why);

  files.layers = {{}, {}};
  EXPECT_FALSE(measure_expert_disk(files, &why));
  EXPECT_EQ(why, "the model has no routed experts on disk");

  files.layers = {{expert(0, 0, 4096)}};
  files.files = {dir / "missing.safetensors"};
  EXPECT_FALSE(measure_expert_disk(files, &why));
  EXPECT_NE(why.find("missing.safetensors"), std::string::npos) << why;
}

// A disk's first pass can run slower than its sustained rate (a VM's host caching what was read)
// or faster (a burst let through after idling): passes are read until two agree.
TEST(DiskProbe, PassesAreReadUntilTwoAgree) {
  auto rates = [](std::vector<double> seq, int max_passes, int* taken) {
    *taken = 0;
    return settled_rate([&] { return seq.at(size_t((*taken)++)); }, max_passes);
  };
  int taken = 0;
  EXPECT_EQ(rates({720, 600, 610, 999}, 4, &taken), 610);  // a burst first
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(rates({500, 1000, 950, 1}, 4, &taken), 1000);  // a cold host cache first
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(rates({600, 650}, 4, &taken), 650);  // within 10% at once
  EXPECT_EQ(taken, 2);
  EXPECT_EQ(rates({100, 300, 900, 2700}, 4, &taken), 2700);  // never settles: the last two
  EXPECT_EQ(taken, 4);
  EXPECT_EQ(rates({100, 300}, 1, &taken), 100);  // one pass
  EXPECT_EQ(taken, 1);
}

}  // namespace
}  // namespace sluice
