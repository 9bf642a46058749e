// The roofline picture of a plan: the machine's ceilings (DRAM bandwidth slope, the ISA level's
// bf16 instruction peak, and sluice's measured GEMM peak below it) on
// log-log axes of arithmetic intensity (FLOP/byte) and rate (FLOP/s), with each task group of
// the representative prefill and decode steps placed at its intensity and predicted rate.
#pragma once

#include <functional>
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
// The same from any model's step graphs (the GPU pipeline's: its points mix GPU and CPU tasks).
std::vector<RooflinePoint> roofline_points(
    const std::function<TaskGraph(const StepShape&)>& step_graph,
    const std::vector<PhaseBottleneck>& phases);
// With `gpu_ceilings` (and a GPU in the profile), the GPU's GEMM peak, device memory and PCIe
// host-to-device slopes are drawn too, dashed.
std::string roofline_svg(const HardwareProfile& hw, const std::vector<RooflinePoint>& points,
                         const std::string& title, bool gpu_ceilings = false);

}  // namespace sluice
