// `sluice plan` end to end with a GPU: a synthetic GPU machine's profile given with --profile,
// the offload plan in the JSON, and the clear errors for too little GPU memory or no GPU.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/planner/hardware_profile.h"
#include "synthetic_profile.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::run_command;
using testing::sluice_command;
using testing::TempDir;

// A GPU machine in round numbers: 100 GB/s DRAM and 1 TFLOP/s on the CPU; 25 GB/s PCIe,
// 2.5 TB/s device memory and 600 TFLOP/s on the GPU.
std::string write_profile(const TempDir& dir, bool with_gpu) {
  HardwareProfile p =
      testing::synthetic_gpu_profile({2.5e10, 2.5e10, 2.5e12, 6e14, size_t(80) << 30});
  if (!with_gpu) p.gpu.reset();
  const std::string path = (dir / (with_gpu ? "gpu.json" : "cpu.json")).string();
  std::ofstream(path) << to_json(p).dump();
  return path;
}

const char* kWorkload = " --preset mixtral-8x7b --host-mem 256GiB --requests 64 --gen-len 32";

TEST(PlanCli, GpuPlanFromAProfileFile) {
  TempDir dir;
  const std::string profile = write_profile(dir, true);
  auto r = run_command(
      sluice_command("plan --profile " + profile + " --gpu-mem 24GiB --json" + kWorkload), false);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["profile_source"], "synthetic");
  EXPECT_EQ(j["gpu_name"], "synthetic GPU");
  const auto& o = j["offload"];
  EXPECT_TRUE(o["gpu"].get<bool>());
  const int resident = o["resident_expert_layers"];
  EXPECT_GE(resident, 0);
  EXPECT_LE(resident, 32);
  const double omega = o["cpu_attention_share"];
  EXPECT_TRUE(omega >= 0 && omega <= 1);
  const size_t page = o["page_bytes"];
  EXPECT_TRUE(page == size_t(14336) * 4096 * 2 || page == size_t(16) << 20 ||
              page == size_t(32) << 20 || page == size_t(64) << 20)
      << page;
  const int depth = o["prefetch_depth"];
  EXPECT_TRUE(depth >= 2 && depth <= 4) << depth;
  // GPU memory: the parts add up and fit the limit.
  const auto& m = j["gpu_memory_bytes"];
  size_t parts = 0;
  for (const char* k : {"attention_weights", "router_norms_head", "resident_experts", "kv_cache",
                        "page_slots", "step_buffers"})
    parts += m[k].get<size_t>();
  EXPECT_EQ(parts, m["total"].get<size_t>());
  EXPECT_LE(parts, size_t(24) << 30);
  EXPECT_EQ(m["resident_experts"].get<size_t>(),
            size_t(resident) * 8 * 3 * size_t(14336) * 4096 * 2);
  // Predicted link use never exceeds the measured bandwidth; both phases are explained.
  ASSERT_EQ(j["phases"].size(), 2u);
  for (const auto& ph : j["phases"]) {
    EXPECT_GT(ph["h2d_fraction_of_measured"].get<double>(), 0);
    EXPECT_LE(ph["h2d_fraction_of_measured"].get<double>(), 1.0 + 1e-9);
    for (const char* k : {"gpu_busy", "cpu_busy", "h2d_busy"})
      EXPECT_LE(ph[k].get<double>(), 1.0 + 1e-9) << k;
  }
  ASSERT_EQ(j["bottlenecks"].size(), 2u);
  EXPECT_NE(j["bottlenecks"][1]["text"].get<std::string>().find("decode is bound by"),
            std::string::npos);
  EXPECT_GT(j["predicted_total_tokens_per_s"].get<double>(), 0);

  // The text report has the offload section and no leftover "not in the cost model" note.
  r = run_command(sluice_command("plan --profile " + profile + " --gpu-mem 24GiB" + kWorkload),
                  false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("offload    GPU pipeline on synthetic GPU"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("gpu memory "), std::string::npos);
  EXPECT_EQ(r.output.find("not in the cost model"), std::string::npos);
}

TEST(PlanCli, TooLittleGpuMemoryOrNoGpuIsOneClearError) {
  TempDir dir;
  auto r = run_command(
      sluice_command("plan --profile " + write_profile(dir, true) + " --gpu-mem 1GiB" + kWorkload));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("GPU memory for resident attention weights"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("got 1.00 GiB"), std::string::npos) << r.output;
  r = run_command(sluice_command("plan --profile " + write_profile(dir, false) +
                                 " --gpu-mem 24GiB" + kWorkload));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("has no GPU section"), std::string::npos) << r.output;
  r = run_command(sluice_command("plan --profile " + (dir / "missing.json").string() + kWorkload));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("missing.json: cannot open"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sluice
