// The disk's bound on each phase of a run (engine/disk_report.h), from a run's books: the steps
// with no prompt tokens, and the steps with some, each bounded by its expert bytes over the disk
// bandwidth.
#include <gtest/gtest.h>

#include "engine/disk_report.h"

namespace sluice {
namespace {

TEST(DiskReport, EachPhaseIsBoundByTheBytesItsStepsRead) {
  EngineStats s;
  // 3 steps with prompt tokens (40 prompt and 6 decode tokens, 2 s, 3 GB read), then 10
  // decode-only steps (40 tokens, 5 s, 2 GB read).
  s.steps = 13;
  s.prefill_tokens = 40;
  s.decode_tokens = 46;
  s.prefill_seconds = 1.5;
  s.decode_seconds = 5.5;
  s.decode_only_steps = 10;
  s.decode_only_tokens = 40;
  s.decode_only_seconds = 5;
  s.decode_only_disk_bytes = 2e9;
  s.disk.bytes_read = 5e9;
  s.disk.wait_seconds = 3.5;
  s.disk.read_seconds = 6.3;
  const DiskReport r = disk_report(s, 7.0, 1e9);  // a disk of 1 GB/s

  // Decode: 2 GB at 1 GB/s bounds 40 tokens to 2 s, 20 tokens/s; they took 5 s, 8 tokens/s.
  EXPECT_DOUBLE_EQ(r.decode.bytes_per_step, 2e8);
  EXPECT_DOUBLE_EQ(r.decode.bound_tokens_per_s, 20);
  EXPECT_DOUBLE_EQ(r.decode.tokens_per_s, 8);
  EXPECT_DOUBLE_EQ(r.decode.bound_fraction, 0.4);
  // Prompt steps: 3 GB bounds their 46 tokens to 3 s; they took 2 s (faster than the bound
  // says: the pool held some, read earlier).
  EXPECT_DOUBLE_EQ(r.prompt.bytes_per_step, 1e9);
  EXPECT_NEAR(r.prompt.bound_tokens_per_s, 46.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(r.prompt.tokens_per_s, 23);
  EXPECT_NEAR(r.prompt.bound_fraction, 1.5, 1e-12);
  EXPECT_DOUBLE_EQ(r.wait_fraction, 0.5);
  // Reads were in flight 6.3 s of the 7: at the rate they ran, the run reached 90% of the bound.
  EXPECT_DOUBLE_EQ(r.busy_fraction, 0.9);

  // With no disk rate measured there is no bound to compare with.
  const DiskReport unmeasured = disk_report(s, 7.0, 0);
  EXPECT_EQ(unmeasured.decode.bound_tokens_per_s, 0);
  EXPECT_EQ(unmeasured.prompt.bound_fraction, 0);
  EXPECT_DOUBLE_EQ(unmeasured.decode.tokens_per_s, 8);
}

}  // namespace
}  // namespace sluice
