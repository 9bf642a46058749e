// How the engine commands plan: the planner's policy for the actual requests, and, for an offload
// device with a GPU in the profile, a GPU pipeline plan the offload executor can run, whose page
// slots and CPU-expert threshold reach the executor's settings.
#include "engine/engine_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "engine/offload_executor.h"
#include "model/presets.h"
#include "synthetic_profile.h"
#include "test_util.h"

#if SLUICE_HAS_CUDA
#include "runtime/gpu/cuda_backend.h"
#endif

namespace sluice {
namespace {

std::vector<Request> requests(int n, int prompt, int generate) {
  std::vector<Request> out{size_t(n)};
  for (int i = 0; i < n; ++i) {
    out[size_t(i)].id = i;
    out[size_t(i)].prompt.assign(size_t(prompt), 5);
    out[size_t(i)].max_new_tokens = generate;
  }
  return out;
}

// The CPU stand-in device with a `gpu_mem` budget, as `--device standin --gpu-mem` gives it.
DeviceOptions standin(const std::string& gpu_mem) {
  DeviceOptions device;
  device.kind = DeviceKind::kStandin;
  device.gpu_mem = gpu_mem;
  return device;
}

constexpr size_t kHost = size_t(256) << 30;

TEST(EnginePlan, CpuDevicePlansTheCpuEngineForTheRequests) {
  const ModelConfig c = preset_config("mixtral-8x7b", 2);
  DeviceOptions device;
  device.kind = DeviceKind::kCpu;
  const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                            requests(5, 40, 8), kHost);
  EXPECT_FALSE(plan.offload.gpu);
  EXPECT_LE(plan.policy.batch, 5);
  EXPECT_GT(plan.prediction.decode_tokens_per_s(), 0);
  EXPECT_EQ(device.settings.page_slots, 0);  // untouched
}

// --device auto (the default) is cuda exactly when this build has the CUDA backend and a GPU is
// usable; planning resolves it, so the engine and the reports see the kind that runs.
TEST(EnginePlan, AutoDeviceIsCudaWhenAGpuIsUsableElseCpu) {
#if SLUICE_HAS_CUDA
  const DeviceKind here = gpu::cuda_gpu_usable() ? DeviceKind::kCuda : DeviceKind::kCpu;
#else
  const DeviceKind here = DeviceKind::kCpu;
#endif
  EXPECT_EQ(resolve_device_kind(DeviceKind::kAuto), here);
  for (DeviceKind k : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kStandin})
    EXPECT_EQ(resolve_device_kind(k), k);
  DeviceOptions device;
  EXPECT_EQ(device.kind, DeviceKind::kAuto);
  if (here == DeviceKind::kCuda) return;  // planning for the GPU needs its profile
  plan_for_requests(testing::synthetic_gpu_profile(), preset_config("mixtral-8x7b", 2), Policy{},
                    device, requests(2, 16, 4), kHost);
  EXPECT_EQ(device.kind, DeviceKind::kCpu);
}

TEST(EnginePlan, OffloadDevicePlansWhatTheExecutorRunsAndFillsItsSettings) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  DeviceOptions device = standin("24GiB");
  const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                            requests(64, 128, 32), kHost);
  ASSERT_TRUE(plan.offload.gpu);
  EXPECT_GE(plan.offload.cpu_attention_share, 0.0);
  EXPECT_LE(plan.offload.cpu_attention_share, 1.0);
  EXPECT_EQ(device.settings.cpu_attention_share, plan.offload.cpu_attention_share);
  EXPECT_GE(plan.offload.resident_expert_layers, 0);
  EXPECT_LE(plan.offload.resident_expert_layers, c.num_layers);
  EXPECT_EQ(device.settings.resident_expert_layers, plan.offload.resident_expert_layers);
  EXPECT_EQ(plan.offload.page_bytes, size_t(2) * c.hidden_size * c.expert_intermediate_size);
  EXPECT_GE(plan.offload.prefetch_depth, 2);
  EXPECT_EQ(device.settings.page_slots, 3 * plan.offload.prefetch_depth);
  EXPECT_EQ(device.settings.cpu_expert_max_tokens, plan.offload.cpu_expert_max_tokens);
  EXPECT_NE(plan.describe().find(
                fmt::format(" offload omega={:.2f} resident=", plan.offload.cpu_attention_share)),
            std::string::npos)
      << plan.describe();
}

// The executor's device memory for the plan's settings (lm_head on the device, as the planner
// counts it), with the CUDA math's 32 MiB GEMM workspace.
size_t executor_bytes(const ModelConfig& c, const EnginePlan& plan, const OffloadSettings& s) {
  const OffloadFootprint f = offload_footprint(c, plan.policy, s);
  return f.with_slots(f.min_slots == 0 ? 0 : s.page_slots) + (size_t(32) << 20);
}

// The planner now chooses resident expert layers for the executor: with room for some layers'
// experts beside the page slots it keeps some resident (each one saves its pages' copies every
// step), and the count reaches the settings. What it chose fits the executor in --gpu-mem.
TEST(EnginePlan, PlannedResidentExpertLayersReachTheSettingsAndFit) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  for (const char* gpu_mem : {"8GiB", "24GiB"}) {
    SCOPED_TRACE(gpu_mem);
    DeviceOptions device = standin(gpu_mem);
    const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                              requests(64, 128, 32), kHost);
    ASSERT_TRUE(plan.offload.gpu);
    EXPECT_GT(plan.offload.resident_expert_layers, 0) << plan.describe();
    EXPECT_EQ(device.settings.resident_expert_layers, plan.offload.resident_expert_layers);
    EXPECT_LE(executor_bytes(c, plan, device.settings), parse_bytes(gpu_mem, "--gpu-mem"));
  }
}

TEST(EnginePlan, ResidentExpertLayersTheUserGaveAreKept) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  for (int resident : {0, 1, 4}) {
    DeviceOptions device = standin("24GiB");
    device.settings.resident_expert_layers = resident;
    const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                              requests(64, 128, 32), kHost);
    ASSERT_TRUE(plan.offload.gpu);
    EXPECT_EQ(plan.offload.resident_expert_layers, resident);
    EXPECT_EQ(device.settings.resident_expert_layers, resident);
  }
  DeviceOptions device = standin("24GiB");
  device.settings.resident_expert_layers = 5;
  EXPECT_ERROR_MENTIONS(plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                          requests(8, 64, 8), kHost),
                        "--resident-expert-layers", "at most the model's 4 layers", "got 5");
}

// The planner's ω reaches the executor's settings, and what it planned (a GPU KV pool with it)
// fits the executor in --gpu-mem. Across budgets it plans both a GPU share (ω < 1) and none.
TEST(EnginePlan, PlannedCpuAttentionShareReachesTheSettingsAndFits) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  bool gpu_share = false;
  for (const char* gpu_mem : {"8GiB", "24GiB", "64GiB", "120GiB"}) {
    SCOPED_TRACE(gpu_mem);
    DeviceOptions device = standin(gpu_mem);
    const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                              requests(64, 512, 256), kHost);
    ASSERT_TRUE(plan.offload.gpu);
    std::printf("%s: %s\n", gpu_mem, plan.describe().c_str());
    EXPECT_EQ(device.settings.cpu_attention_share, plan.offload.cpu_attention_share);
    gpu_share |= plan.offload.cpu_attention_share < 1;
    EXPECT_LE(executor_bytes(c, plan, device.settings), parse_bytes(gpu_mem, "--gpu-mem"));
  }
  EXPECT_TRUE(gpu_share) << "no budget made the planner choose a GPU share of attention";
}

// A share the user gave is the plan's and the executor's.
TEST(EnginePlan, CpuAttentionShareTheUserGaveIsKept) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  for (double omega : {0.0, 0.5, 1.0}) {
    DeviceOptions device = standin("64GiB");
    device.settings.cpu_attention_share = omega;
    const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                              requests(64, 128, 32), kHost);
    ASSERT_TRUE(plan.offload.gpu);
    EXPECT_EQ(plan.offload.cpu_attention_share, omega);
    EXPECT_EQ(device.settings.cpu_attention_share, omega);
  }
}

TEST(EnginePlan, SettingsTheUserGaveAreKept) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  DeviceOptions device = standin("24GiB");
  device.settings.page_slots = 9;
  device.settings.cpu_expert_max_tokens = 5;
  const EnginePlan plan = plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                            requests(64, 128, 32), kHost);
  ASSERT_TRUE(plan.offload.gpu);
  EXPECT_EQ(plan.offload.prefetch_depth, 3);
  EXPECT_EQ(plan.offload.cpu_expert_max_tokens, 5);
  EXPECT_EQ(device.settings.page_slots, 9);
  EXPECT_EQ(device.settings.cpu_expert_max_tokens, 5);
}

TEST(EnginePlan, TooLittleGpuMemoryNamesTheMinimum) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  DeviceOptions device = standin("1GiB");
  EXPECT_ERROR_MENTIONS(plan_for_requests(testing::synthetic_gpu_profile(), c, Policy{}, device,
                                          requests(8, 64, 8), kHost),
                        "planner: needs at least", "GPU memory", "got 1.00 GiB");
}

TEST(EnginePlan, OffloadDeviceWithoutAGpuProfilePlansTheCpuEngine) {
  HardwareProfile hw = testing::synthetic_gpu_profile();
  hw.gpu.reset();
  DeviceOptions device;
  device.kind = DeviceKind::kStandin;
  const EnginePlan plan = plan_for_requests(hw, preset_config("mixtral-8x7b", 1), Policy{}, device,
                                            requests(4, 16, 4), kHost);
  EXPECT_FALSE(plan.offload.gpu);
  EXPECT_EQ(device.settings.page_slots, 0);
}

}  // namespace
}  // namespace sluice
