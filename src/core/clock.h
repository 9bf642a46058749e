// The one clock that timings use: monotonic, and seconds as a double.
#pragma once

#include <chrono>

namespace sluice {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace sluice
