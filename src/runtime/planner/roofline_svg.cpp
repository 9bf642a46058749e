#include "runtime/planner/roofline_svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/planner/offload_cost_model.h"

namespace sluice {

std::vector<RooflinePoint> roofline_points(const CpuCostModel& model,
                                           const std::vector<PhaseBottleneck>& phases) {
  return roofline_points([&](const StepShape& s) { return model.step_graph(s); }, phases);
}

std::vector<RooflinePoint> roofline_points(
    const std::function<TaskGraph(const StepShape&)>& step_graph,
    const std::vector<PhaseBottleneck>& phases) {
  std::vector<RooflinePoint> out;
  for (const PhaseBottleneck& ph : phases) {
    struct Sum {
      double flops = 0, bytes = 0, seconds = 0;
    };
    std::map<std::string, Sum> groups;
    const TaskGraph graph = step_graph(ph.step);
    for (const Task& t : graph.tasks()) {
      Sum& s = groups[t.group];
      s.flops += t.flops, s.bytes += t.bytes, s.seconds += t.seconds;
    }
    for (const auto& [group, s] : groups)
      if (s.flops > 0 && s.bytes > 0 && s.seconds > 0)
        out.push_back({ph.phase + ": " + group, s.flops / s.bytes, s.flops / s.seconds,
                       ph.phase == "decode"});
  }
  return out;
}

namespace {
std::string escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<')
      o += "&lt;";
    else if (ch == '>')
      o += "&gt;";
    else if (ch == '&')
      o += "&amp;";
    else
      o += ch;
  }
  return o;
}
}  // namespace

std::string roofline_svg(const HardwareProfile& hw, const std::vector<RooflinePoint>& points,
                         const std::string& title, bool gpu_ceilings) {
  gpu_ceilings = gpu_ceilings && hw.gpu && hw.gpu->gemm_peak_flops() > 0;
  // The roof is the machine's bf16 compute ceiling (the ISA level's instruction peak); sluice's
  // own GEMM peak is drawn dashed below it. Profiles without instruction peaks: the GEMM peak.
  const double roof = hw.compute_ceiling_flops("bf16");
  const bool machine_roof = hw.instructions.measured();
  const double top_rate = gpu_ceilings ? std::max(roof, hw.gpu->gemm_peak_flops()) : roof;
  // The legend on the right holds lines of up to ~85 characters at 12 px.
  const double W = 1150, Hgt = 600, left = 80, right = 580, top = 50, bottom = 60;
  const double pw = W - left - right, ph = Hgt - top - bottom;
  double x_lo = -2, x_hi = 4;
  const double y_hi = std::ceil(std::log10(top_rate * 2));
  const double y_lo = y_hi - 6;
  auto X = [&](double ai) { return left + (std::log10(ai) - x_lo) / (x_hi - x_lo) * pw; };
  auto Y = [&](double r) {
    const double v = std::clamp(std::log10(r), y_lo, y_hi);
    return top + (y_hi - v) / (y_hi - y_lo) * ph;
  };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"{}\" y=\"25\" font-size=\"14\">{}</text>\n",
      W, Hgt, left, escape(title));
  // Grid and axes, one line per decade.
  for (int d = int(x_lo); d <= int(x_hi); ++d)
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">1e{4}</text>\n",
        X(std::pow(10, d)), top, top + ph, top + ph + 18, d);
  for (int d = int(y_lo); d <= int(y_hi); ++d)
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">1e{5}</text>\n",
        left, Y(std::pow(10, d)), left + pw, left - 6, Y(std::pow(10, d)) + 4, d);
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arithmetic intensity "
      "(FLOP/byte)</text>\n",
      left + pw / 2, Hgt - 15);
  s += fmt::format(
      "<text x=\"20\" y=\"{0}\" transform=\"rotate(-90 20 {0})\" "
      "text-anchor=\"middle\">FLOP/s</text>\n",
      top + ph / 2);
  // Ceilings: min(roof, intensity × DRAM bandwidth), as a polyline through the ridge point.
  const double ridge = roof / hw.dram_bytes_per_s;
  const double ai0 = std::pow(10, x_lo), ai1 = std::pow(10, x_hi);
  s += fmt::format(
      "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"2\" "
      "points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\"/>\n",
      X(ai0), Y(ai0 * hw.dram_bytes_per_s), X(ridge), Y(roof), X(ai1), Y(roof));
  if (machine_roof) {
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">bf16 ceiling {:.0f} GFLOP/s ({})</text>\n",
                     X(ridge) + 8, Y(roof) - 6, roof / 1e9,
                     escape(hw.instructions.bf16_instruction));
    const double gemm = hw.gemm_peak_flops;
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#888\" "
        "stroke-dasharray=\"6 3\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#888\">sluice "
        "GEMM peak {:.0f} GFLOP/s</text>\n",
        X(gemm / hw.dram_bytes_per_s), Y(gemm), X(ai1), Y(gemm), X(ai1) - 200, Y(gemm) + 14,
        gemm / 1e9);
  } else {
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">GEMM peak {:.0f} GFLOP/s</text>\n",
                     X(ridge) + 8, Y(roof) - 6, roof / 1e9);
  }
  s += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" transform=\"rotate(-{:.1f} {:.1f} {:.1f})\">"
      "DRAM {:.1f} GB/s</text>\n",
      X(ai0 * 10) + 4, Y(ai0 * 10 * hw.dram_bytes_per_s) - 6,
      std::atan2(Y(ai0) - Y(ai0 * 10), X(ai0 * 10) - X(ai0)) * 180 / M_PI, X(ai0 * 10) + 4,
      Y(ai0 * 10 * hw.dram_bytes_per_s) - 6, hw.dram_bytes_per_s / 1e9);
  if (gpu_ceilings) {
    // GPU: min(GEMM peak, intensity × device memory bandwidth), and the PCIe slope that bounds
    // work on weights streamed from the host.
    const GpuProfile& g = *hw.gpu;
    const double peak = g.gemm_peak_flops();
    const double mem = g.memory_bytes_per_s > 0 ? g.memory_bytes_per_s : kAssumedGpuMemoryBytesPerS;
    const double gpu_ridge = peak / mem;
    s += fmt::format(
        "<polyline fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\" stroke-dasharray=\"6 3\" "
        "points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\"/>\n",
        X(ai0), Y(ai0 * mem), X(gpu_ridge), Y(peak), X(ai1), Y(peak));
    s += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#2ca02c\">GPU GEMM {:.0f} TFLOP/s, memory "
        "{:.0f} GB/s</text>\n",
        X(std::min(gpu_ridge, ai1)) - 260, Y(peak) - 6, peak / 1e12, mem / 1e9);
    const double h2d = g.h2d_pinned_bytes_per_s;
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#9467bd\" "
        "stroke-width=\"2\" stroke-dasharray=\"2 3\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\" "
        "fill=\"#9467bd\">PCIe H2D {:.1f} GB/s</text>\n",
        X(ai0), Y(ai0 * h2d), X(ai1), Y(std::min(ai1 * h2d, peak)), X(ai0 * 100),
        Y(ai0 * 100 * h2d) + 14, h2d / 1e9);
  }
  // Points, numbered, with a legend on the right. Numbers of points that fall on the same spot
  // are set side by side instead of on top of each other.
  std::map<std::pair<int, int>, double> label_width_at;  // pixels of numbers already there
  for (size_t i = 0; i < points.size(); ++i) {
    const RooflinePoint& p = points[i];
    const char* colour = p.decode ? "#d62728" : "#1f77b4";
    const double x = X(std::clamp(p.intensity, ai0, ai1)), y = Y(p.flops_per_s);
    double& before = label_width_at[{int(x / 8), int(y / 8)}];
    const double shift = before;
    before += 6.5 * double(std::to_string(i + 1).size()) + 4;
    s += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\"/><text x=\"{:.1f}\" "
        "y=\"{:.1f}\" font-size=\"10\">{}</text>\n",
        x, y, colour, x + 7 + shift, y - 4, i + 1);
    s += fmt::format(
        "<text x=\"{}\" y=\"{}\" fill=\"{}\">{}. {} ({:.2g} FLOP/B, {:.1f} GFLOP/s)</text>\n",
        left + pw + 15, top + 16 * double(i), colour, i + 1, escape(p.label), p.intensity,
        p.flops_per_s / 1e9);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace sluice
