#include "engine/planner_profile.h"

#include "engine/throughput_report.h"
#include "runtime/planner/profiler.h"

namespace sluice {

HardwareProfile planner_profile(int threads) {
  if (std::optional<HardwareProfile> cached = load_cached_profile(threads)) return *cached;
  const Ceilings c = measure_ceilings();
  return quick_profile(c.dram_bytes_per_s, c.gemm_flops);
}

}  // namespace sluice
