// The host page pool's measure of whether compute waits on the disk (it reads fewer guesses then).
#include "runtime/disk/disk_wait_meter.h"

#include <gtest/gtest.h>

#include <chrono>

namespace sluice {
namespace {

using std::chrono::milliseconds;

// Acquires `n` experts, each after `compute` of work and then `wait` for its read.
Clock::time_point acquire_many(DiskWaitMeter& m, Clock::time_point t, int n, milliseconds compute,
                               milliseconds wait) {
  for (int i = 0; i < n; ++i) {
    const Clock::time_point began = t + compute;
    t = began + wait;
    m.acquired(began, t);
  }
  return t;
}

TEST(DiskWaitMeter, SaysComputeWaitsWhenMostOfTheTimeBetweenAcquiresIsWaiting) {
  DiskWaitMeter m;
  EXPECT_FALSE(m.compute_waits());  // nothing acquired yet
  Clock::time_point t{};
  t += std::chrono::hours(1);
  t = acquire_many(m, t, 30, milliseconds(1), milliseconds(26));  // a slow disk
  EXPECT_TRUE(m.compute_waits());
  t = acquire_many(m, t, 30, milliseconds(20), milliseconds(2));  // the disk ahead of compute
  EXPECT_FALSE(m.compute_waits());
  // It follows a change within about ten acquires, not at the first one.
  t = acquire_many(m, t, 1, milliseconds(1), milliseconds(26));
  EXPECT_FALSE(m.compute_waits());
  acquire_many(m, t, 15, milliseconds(1), milliseconds(26));
  EXPECT_TRUE(m.compute_waits());
}

TEST(DiskWaitMeter, TheFirstAcquireOnlyStartsTheClock) {
  DiskWaitMeter m;
  Clock::time_point t{};
  t += std::chrono::hours(1);
  m.acquired(t, t + std::chrono::seconds(5));  // a long first wait: no time between to set it in
  EXPECT_FALSE(m.compute_waits());
}

}  // namespace
}  // namespace sluice
