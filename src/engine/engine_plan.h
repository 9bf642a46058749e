// How the commands that run the engine choose its policy: the planner (runtime/planner) over the
// actual requests, with the hardware profile of this machine.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/engine_device.h"
#include "model/config.h"
#include "model/expert_files.h"
#include "model/weights.h"
#include "runtime/planner/hardware_profile.h"
#include "runtime/planner/planner.h"
#include "runtime/planner/workload_sim.h"
#include "runtime/policy.h"
#include "runtime/request.h"

namespace sluice {

// The profile the planner uses, for `threads` OpenMP threads (0: all cores): the cached `sluice
// profile` of this machine when there is one; else a quick profile (DRAM bandwidth, bf16 GEMM
// peak, the instruction peaks, and the expert GEMM at a few m up to 32 (engine_plan.cpp's
// kQuickSmallM), where GEMMs fall furthest below the roofline), measured once per machine, ISA
// level and thread count and cached beside it, so that every later run plans with the same numbers
// (and so picks the same policy for the same input). On a machine with a usable GPU, a profile
// without a GPU half gets one the same way (measured once, cached), so the default device plans the
// GPU pipeline from the first run.
HardwareProfile planner_profile(int threads);
// The disk tier's read rate, measured as it reads: O_DIRECT through io_uring, 32 reads in flight,
// of whole experts spread over the model (512 MiB of them, or all), from the files the run reads,
// read until two passes agree (measure_read_rate).
// On a VM the disk's rate moves with what the host has cached, so a run is compared with this,
// taken beside it, rather than with the profile's probe of a fresh temporary file. nullopt,
// with `why`, where it cannot be measured.
std::optional<double> measure_expert_disk(const ExpertFiles& files, std::string* why);
// measure_expert_disk's rate; 0 when it cannot be measured, with a note why on stderr.
double probe_expert_disk(const ExpertFiles& files);
// planner_profile(threads) for a model whose routed experts stay in their files (`on_disk` not
// null): its disk read rate is theirs, probed (probe_expert_disk) once per process and files, so
// that the plan and its prediction count the disk. A profile of a temporary file, or none (the
// quick profile measures no disk), would leave the disk out.
HardwareProfile planner_profile(int threads, const ExpertFiles* on_disk);

struct EnginePlan {
  Policy policy;        // every field resolved
  OffloadPlan offload;  // offload.gpu: planned for the GPU pipeline
  Prediction prediction;
  std::string profile_source;    // HardwareProfile::source: "measured", "quick", ...
  std::string describe() const;  // "B=… (planned with the … profile: predicted … tokens/s)"
};

// What the offload executor (engine/offload_executor.h) can run, as planner constraints:
// attention all on the CPU (ω = 1) and pages of one expert matrix; and the page slots, the
// CPU-expert threshold and the resident expert layers when the user set them.
OffloadConstraints executor_constraints(const OffloadSettings& settings);

// The planner's policy for exactly these requests (their prompt lengths and generation limits),
// within `host_memory_bytes` for weights, KV cache and activations; the non-zero fields of
// `requested` are kept. Fails, saying what would fit, when nothing does. Requests that can never
// run (never_runs: prompt fills the context, or more KV blocks than a fixed `kv_blocks`) are
// left out: the engine fails them alone.
//
// With an offload device and a GPU in the profile, the plan is for the GPU pipeline within
// --gpu-mem (default: 90% of the GPU's free memory, as the CUDA backend takes), and the
// executor's settings the user left unset (page slots, CPU-expert threshold, resident expert
// layers) are filled from it.
// Without a GPU profile the policy is planned for the CPU engine (for CUDA, with a warning).
EnginePlan plan_for_requests(const HardwareProfile& hw, const ModelConfig& c,
                             const Policy& requested, DeviceOptions& device,
                             const std::vector<Request>& requests, size_t host_memory_bytes);
EnginePlan plan_for_workload(const HardwareProfile& hw, const ModelConfig& c,
                             const Policy& requested, DeviceOptions& device,
                             const std::vector<WorkloadRequest>& work, size_t host_memory_bytes);
// The same for `m` with planner_profile(requested.threads, its experts on disk).
EnginePlan plan_for_requests(const Model& m, const Policy& requested, DeviceOptions& device,
                             const std::vector<Request>& requests, size_t host_memory_bytes);

}  // namespace sluice
