// Whether compute is waiting on the disk: of the time between one acquire of an expert returning
// and the next, the share the next spent waiting for its read, averaged over about ten acquires.
// The host page pool (expert_page_pool.h) reads fewer guesses while it is over half.
#pragma once

#include "core/clock.h"

namespace sluice {

class DiskWaitMeter {
 public:
  // An acquire that began at `began` returned at `returned`.
  void acquired(Clock::time_point began, Clock::time_point returned) {
    if (last_returned_ != Clock::time_point{}) {
      waited_ += kWeight * (seconds(returned - began) - waited_);
      between_ += kWeight * (seconds(returned - last_returned_) - between_);
    }
    last_returned_ = returned;
  }
  bool compute_waits() const { return waited_ > 0.5 * between_; }

 private:
  static constexpr double kWeight = 0.1;  // about the last ten acquires
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  double waited_ = 0, between_ = 0;
  Clock::time_point last_returned_{};
};

}  // namespace sluice
