// The roofline picture of a plan: the machine's ceilings (DRAM bandwidth slope, GEMM peak) on
// log-log axes of arithmetic intensity (FLOP/byte) and rate (FLOP/s), with each task group of
// the representative prefill and decode steps placed at its intensity and predicted rate.
#pragma once

#include <string>
#include <vector>

#include "runtime/planner/cost_model.h"
#include "runtime/planner/planner.h"

namespace sluice {

struct RooflinePoint {
  std::string label;     // "decode: expert GEMMs"
  double intensity = 0;  // FLOP per byte
  double flops_per_s = 0;
  bool decode = false;
};

std::vector<RooflinePoint> roofline_points(const CpuCostModel& model,
                                           const std::vector<PhaseBottleneck>& phases);
std::string roofline_svg(const HardwareProfile& hw, const std::vector<RooflinePoint>& points,
                         const std::string& title);

}  // namespace sluice
