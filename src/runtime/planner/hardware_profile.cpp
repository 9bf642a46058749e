#include "runtime/planner/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"

namespace sluice {

double GemmCurve::seconds_at(double m) const {
  if (points.empty())
    fail("gemm curve '{}': field 'points': expected measurements, got none", name);
  const Point& first = points.front();
  if (m <= double(first.m)) return first.seconds;  // a GEMM never gets cheaper than one row
  for (size_t i = 1; i < points.size(); ++i) {
    const Point &a = points[i - 1], &b = points[i];
    if (m <= double(b.m))
      return a.seconds + (b.seconds - a.seconds) * (m - double(a.m)) / double(b.m - a.m);
  }
  const Point& last = points.back();
  return last.seconds * m / double(last.m);
}

const GemmCurve& nearest_curve(const std::vector<GemmCurve>& curves, int64_t n, int64_t k,
                               const std::string& act, const char* what) {
  const GemmCurve* best = nullptr;
  double best_distance = 0;
  for (const GemmCurve& c : curves) {
    if (c.activations != act) continue;
    // Size first; of equal sizes, the same aspect (an exact shape match gives 0).
    const double d = std::abs(std::log(double(n * k) / double(c.n * c.k))) +
                     1e-3 * std::abs(std::log(double(n) / double(c.n)));
    if (!best || d < best_distance) best = &c, best_distance = d;
  }
  if (!best)
    fail("hardware profile: field '{}': expected a curve with {} activations, got none", what, act);
  return *best;
}

const GemmCurve& HardwareProfile::curve_for(int64_t n, int64_t k, const std::string& act) const {
  return nearest_curve(cpu_gemm, n, k, act, "cpu_gemm");
}

double GpuProfile::gemm_seconds(double m, int64_t n, int64_t k) const {
  const GemmCurve& c = nearest_curve(gemm, n, k, "bf16", "gpu.gemm");
  return c.seconds_at(m) * double(n * k) / double(c.n * c.k);
}

double GpuProfile::gemm_peak_flops() const {
  double best = 0;
  for (const GemmCurve& c : gemm)
    for (const auto& pt : c.points)
      best = std::max(best, 2.0 * double(pt.m) * double(c.n) * double(c.k) / pt.seconds);
  return best;
}

double HardwareProfile::gemm_seconds(double m, int64_t n, int64_t k, const std::string& act) const {
  const GemmCurve& c = curve_for(n, k, act);
  return c.seconds_at(m) * double(n * k) / double(c.n * c.k);
}

double HardwareProfile::gemm_seconds(int64_t m, int64_t n, int64_t k,
                                     const std::string& act) const {
  return gemm_seconds(double(m), n, k, act);
}

double HardwareProfile::compute_ceiling_flops(const std::string& activations) const {
  if (!instructions.measured()) return gemm_peak_flops;
  if (activations == "int8") return instructions.int8_ops;
  return activations == "f32" ? instructions.fp32_fma_flops : instructions.bf16_flops;
}

nlohmann::json to_json(const GemmCurve& c) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : c.points)
    pts.push_back({{"m", p.m},
                   {"seconds", p.seconds},
                   {"gflops", 2.0 * double(p.m) * double(c.n) * double(c.k) / p.seconds / 1e9}});
  return {
      {"name", c.name}, {"activations", c.activations}, {"n", c.n}, {"k", c.k}, {"points", pts}};
}

GemmCurve gemm_curve_from_json(const nlohmann::json& j, const std::string& source) {
  GemmCurve c;
  try {
    c.name = j.at("name").get<std::string>();
    c.activations = j.at("activations").get<std::string>();
    c.n = j.at("n").get<int64_t>();
    c.k = j.at("k").get<int64_t>();
    for (const auto& p : j.at("points")) c.points.push_back({p.at("m"), p.at("seconds")});
  } catch (const nlohmann::json::exception& e) {
    fail("{}: field 'cpu_gemm': expected {{name, activations, n, k, points}}, got error: {}",
         source, e.what());
  }
  if (c.points.empty() || c.n <= 0 || c.k <= 0)
    fail("{}: field 'cpu_gemm.{}': expected positive n, k and at least one point", source, c.name);
  for (size_t i = 0; i < c.points.size(); ++i)
    if (c.points[i].seconds <= 0 || (i > 0 && c.points[i].m <= c.points[i - 1].m))
      fail("{}: field 'cpu_gemm.{}.points': expected increasing m and positive seconds", source,
           c.name);
  return c;
}

nlohmann::json to_json(const InstructionCeilings& c) {
  return {{"fp32_fma_flops", c.fp32_fma_flops},
          {"fp32_instruction", c.fp32_instruction},
          {"bf16_flops", c.bf16_flops},
          {"bf16_instruction", c.bf16_instruction},
          {"int8_ops", c.int8_ops},
          {"int8_instruction", c.int8_instruction}};
}

InstructionCeilings instruction_ceilings_from_json(const nlohmann::json& o,
                                                   const std::string& source) {
  InstructionCeilings c;
  try {
    c.fp32_fma_flops = o.at("fp32_fma_flops").get<double>();
    c.bf16_flops = o.at("bf16_flops").get<double>();
    c.int8_ops = o.at("int8_ops").get<double>();
    c.fp32_instruction = o.at("fp32_instruction").get<std::string>();
    c.bf16_instruction = o.at("bf16_instruction").get<std::string>();
    c.int8_instruction = o.at("int8_instruction").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    fail(
        "{}: field 'instruction_ceilings': expected {{fp32_fma_flops, bf16_flops, int8_ops}} and "
        "their instructions, got error: {}",
        source, e.what());
  }
  if (c.fp32_fma_flops < 0 || c.bf16_flops < 0 || c.int8_ops < 0)
    fail("{}: field 'instruction_ceilings': expected rates >= 0, got {}", source, o.dump());
  return c;
}

nlohmann::json to_json(const HardwareProfile& p) {
  nlohmann::json j = {{"machine_key", p.machine_key},
                      {"cpu_model", p.cpu_model},
                      {"isa_level", p.isa_level},
                      {"instruction_ceilings", to_json(p.instructions)},
                      {"cores", p.cores},
                      {"threads", p.threads},
                      {"memory_bytes", p.memory_bytes},
                      {"source", p.source},
                      {"kernels_revision", p.kernels_revision},
                      {"dram_bytes_per_s", p.dram_bytes_per_s},
                      {"gemm_peak_flops", p.gemm_peak_flops},
                      {"disk_bytes_per_s", p.disk_bytes_per_s},
                      {"attention_bytes_per_s", p.attention_bytes_per_s},
                      {"attention_flops", p.attention_flops},
                      {"elementwise_bytes_per_s", p.elementwise_bytes_per_s},
                      {"call_overhead_seconds", p.call_overhead_seconds},
                      {"quant_gemm_speedups", to_json(p.quant_gemm)}};
  j["cpu_gemm"] = nlohmann::json::array();
  for (const auto& c : p.cpu_gemm) j["cpu_gemm"].push_back(to_json(c));
  if (!p.gpu) {
    j["gpu"] = nullptr;
  } else {
    const GpuProfile& g = *p.gpu;
    nlohmann::json gemm = nlohmann::json::array();
    for (const auto& c : g.gemm) gemm.push_back(to_json(c));
    j["gpu"] = {{"name", g.name},
                {"h2d_pinned_bytes_per_s", g.h2d_pinned_bytes_per_s},
                {"h2d_pageable_bytes_per_s", g.h2d_pageable_bytes_per_s},
                {"d2h_pinned_bytes_per_s", g.d2h_pinned_bytes_per_s},
                {"d2h_pageable_bytes_per_s", g.d2h_pageable_bytes_per_s},
                {"memory_bytes_per_s", g.memory_bytes_per_s},
                {"memory_free_bytes", g.memory_free_bytes},
                {"gemm", gemm}};
  }
  return j;
}

double QuantGemmSpeedups::at(bool int4_weights, double m) const {
  auto value = [&](const Point& p) { return int4_weights ? p.int4 : p.int8; };
  if (points.empty()) return 0;
  if (m <= double(points.front().m)) return value(points.front());
  for (size_t i = 1; i < points.size(); ++i) {
    const Point &a = points[i - 1], &b = points[i];
    if (m <= double(b.m)) {
      const double t = std::log(m / double(a.m)) / std::log(double(b.m) / double(a.m));
      return value(a) + t * (value(b) - value(a));
    }
  }
  return value(points.back());
}

nlohmann::json to_json(const QuantGemmSpeedups& s) {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : s.points) points.push_back({{"m", p.m}, {"int8", p.int8}, {"int4", p.int4}});
  return points;
}

QuantGemmSpeedups quant_gemm_speedups_from_json(const nlohmann::json& j, const std::string& source) {
  QuantGemmSpeedups s;
  if (j.is_null()) return s;
  if (!j.is_array())
    fail("{}: field 'quant_gemm_speedups': expected an array of {{m, int8, int4}}, got {}", source,
         j.dump());
  for (const auto& p : j) {
    if (!p.is_object() || !p.contains("m") || !p["m"].is_number_integer() ||
        !p.contains("int8") || !p["int8"].is_number() || !p.contains("int4") ||
        !p["int4"].is_number())
      fail("{}: field 'quant_gemm_speedups': expected {{\"m\": integer, \"int8\": number, "
           "\"int4\": number}}, got {}",
           source, p.dump());
    const QuantGemmSpeedups::Point point{p["m"].get<int64_t>(), p["int8"].get<double>(),
                                         p["int4"].get<double>()};
    if (point.m <= 0 || (!s.points.empty() && point.m <= s.points.back().m))
      fail("{}: field 'quant_gemm_speedups': expected m > 0 and increasing, got {}", source,
           j.dump());
    s.points.push_back(point);
  }
  return s;
}

HardwareProfile profile_from_json(const nlohmann::json& j, const std::string& source) {
  HardwareProfile p;
  auto number = [&](const char* field) {
    if (!j.contains(field) || !j[field].is_number())
      fail("{}: field '{}': expected a number, got {}", source, field,
           j.contains(field) ? j[field].dump() : "nothing");
    return j[field].get<double>();
  };
  if (!j.is_object()) fail("{}: expected a JSON object, got {}", source, j.type_name());
  p.machine_key = j.value("machine_key", "");
  p.cpu_model = j.value("cpu_model", "");
  p.isa_level = j.value("isa_level", "");  // absent in older profiles
  if (j.contains("instruction_ceilings"))  // absent in older profiles: all 0
    p.instructions = instruction_ceilings_from_json(j["instruction_ceilings"], source);
  p.cores = j.value("cores", 0);
  p.threads = j.value("threads", p.cores);
  p.memory_bytes = j.value("memory_bytes", size_t(0));
  p.source = j.value("source", "measured");
  p.kernels_revision = j.value("kernels_revision", 0);  // absent in older profiles
  p.dram_bytes_per_s = number("dram_bytes_per_s");
  p.gemm_peak_flops = number("gemm_peak_flops");
  p.disk_bytes_per_s = number("disk_bytes_per_s");
  p.attention_bytes_per_s = number("attention_bytes_per_s");
  p.attention_flops = number("attention_flops");
  p.elementwise_bytes_per_s = number("elementwise_bytes_per_s");
  p.call_overhead_seconds = j.value("call_overhead_seconds", 0.0);  // absent in older profiles
  p.quant_gemm =
      quant_gemm_speedups_from_json(j.value("quant_gemm_speedups", nlohmann::json()), source);
  if (!j.contains("cpu_gemm") || !j["cpu_gemm"].is_array())
    fail("{}: field 'cpu_gemm': expected an array of GEMM curves", source);
  for (const auto& c : j["cpu_gemm"]) p.cpu_gemm.push_back(gemm_curve_from_json(c, source));
  if (j.contains("gpu") && !j["gpu"].is_null()) {
    const auto& g = j["gpu"];
    GpuProfile gp;
    gp.name = g.value("name", "");
    gp.h2d_pinned_bytes_per_s = g.value("h2d_pinned_bytes_per_s", 0.0);
    gp.h2d_pageable_bytes_per_s = g.value("h2d_pageable_bytes_per_s", 0.0);
    gp.d2h_pinned_bytes_per_s = g.value("d2h_pinned_bytes_per_s", 0.0);
    gp.d2h_pageable_bytes_per_s = g.value("d2h_pageable_bytes_per_s", 0.0);
    gp.memory_bytes_per_s = g.value("memory_bytes_per_s", 0.0);
    gp.memory_free_bytes = g.value("memory_free_bytes", size_t(0));
    if (g.contains("gemm"))
      for (const auto& c : g["gemm"]) gp.gemm.push_back(gemm_curve_from_json(c, source));
    p.gpu = gp;
  }
  return p;
}

namespace {

// A quick curve for one shape: the roofline max(weight bytes / DRAM, FLOPs / rate) at m = 1, at
// its corner (so linear interpolation follows both ceilings) and at 4096; where `small_m` has a
// measured point, that time scaled by the weight size replaces the roofline's when slower (a
// small-m GEMM reads its weights well below DRAM bandwidth). Seconds never fall as m grows.
GemmCurve quick_curve(const std::string& name, const std::string& act, int64_t n, int64_t k,
                      double dram, double rate, const std::optional<GemmCurve>& small_m) {
  const double nk = double(n) * double(k);
  auto roofline = [&](double m) { return std::max(2.0 * nk / dram, 2.0 * m * nk / rate); };
  std::vector<int64_t> ms = {1, std::clamp<int64_t>(int64_t(rate / dram), 2, 4095), 4096};
  if (small_m)
    for (const auto& pt : small_m->points) ms.push_back(pt.m);
  std::sort(ms.begin(), ms.end());
  ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
  GemmCurve c{name, act, n, k, {}};
  for (int64_t m : ms) {
    double seconds = roofline(double(m));
    if (small_m)
      for (const auto& pt : small_m->points)
        if (pt.m == m)
          seconds = std::max(seconds, pt.seconds * nk / (double(small_m->n) * double(small_m->k)));
    if (!c.points.empty()) seconds = std::max(seconds, c.points.back().seconds);
    c.points.push_back({m, seconds});
  }
  return c;
}

}  // namespace

HardwareProfile quick_profile(double dram, double peak, double call_overhead_seconds,
                              const std::optional<GemmCurve>& small_m) {
  HardwareProfile p;
  p.source = "quick";
  p.call_overhead_seconds = call_overhead_seconds;
  p.dram_bytes_per_s = dram;
  p.gemm_peak_flops = peak;
  p.attention_bytes_per_s = dram;
  p.attention_flops = peak / 4;  // the attention kernel is not a tuned GEMM; a rough guess
  p.elementwise_bytes_per_s = dram;
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  for (Shape s : {Shape{"expert", 14336, 4096}, Shape{"attention", 4096, 4096}}) {
    for (const char* act : {"bf16", "f32"}) {
      // cpu::gemm_f32 measured at about a quarter of the bf16 rate on AVX512-BF16 machines
      // (fp32 FMAs instead of vdpbf16ps, and no oneDNN blocking). At small m both stream the
      // same bf16 weights, so the small-m samples stand for both.
      const double rate = std::string(act) == "bf16" ? peak : peak / 4;
      p.cpu_gemm.push_back(quick_curve(s.name, act, s.n, s.k, dram, rate, small_m));
    }
  }
  return p;
}

}  // namespace sluice
