// The hardware profile the commands plan with: the cached `sluice profile` of this machine when
// there is one, else a quick one from the two ceilings every bench measures anyway.
#pragma once

#include "runtime/planner/hardware_profile.h"

namespace sluice {

// For `threads` OpenMP threads (0: all cores).
HardwareProfile planner_profile(int threads);

}  // namespace sluice
