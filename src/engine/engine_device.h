// Where the engine runs its steps: on the host CPU (the default), or through the offload
// executor on a Device with its DeviceMath (engine/offload_executor.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace sluice {

namespace offload {
class Device;
class DeviceMath;
}  // namespace offload

// Where the final norm and the lm_head run when the layers run on a device.
enum class LmHeadPlace {
  kAuto,    // on the device when the budget has room for it, else on the host
  kDevice,  // on the device (its bf16 weights resident); a budget without room is an error
  kHost,    // on the host: the sampled rows' hidden states come back instead of their logits
};

struct OffloadSettings {
  size_t page_bytes = 0;  // 0: one expert matrix; smaller is an error (matrices are not split)
  int page_slots = 0;     // 0: as many as the budget leaves room for, at most a layer's experts
  int cpu_expert_max_tokens = 0;  // experts with at most this many tokens may run on the CPU
  // Layers whose experts stay on the device, evenly spaced (layer_resident in
  // runtime/planner/offload_cost_model.h); the other layers' experts stream through the page
  // slots. -1: not set (none, unless the planner fills it).
  int resident_expert_layers = -1;
  LmHeadPlace lm_head = LmHeadPlace::kAuto;
  // ω: the fraction of sequences whose attention runs on the host CPU over the engine's
  // PagedKvCache; the others' runs on the device over a device KV pool. -1: not set (1, all on
  // the host, unless the planner fills it).
  double cpu_attention_share = -1;
  // Page slots beyond page_slots that only keep pages from step to step (the device half of the
  // expert cache; copies run ahead into page_slots at most). -1: what the budget leaves beyond a
  // margin, at most the pages that stream; 0: none.
  int cache_pages = -1;
};

// A device the caller owns, for the offload executor. A null device means the CPU engine.
struct EngineDevice {
  offload::Device* device = nullptr;
  offload::DeviceMath* math = nullptr;
  OffloadSettings settings;
};

// The command line's choice of device (`--device`, `--gpu-mem`, ...).
enum class DeviceKind {
  kAuto,     // cuda when this build has the CUDA backend and a GPU is usable, else cpu
  kCpu,      // the CPU engine
  kCuda,     // the offload executor on the first CUDA GPU
  kStandin,  // the offload executor on the CPU stand-in device: for testing the offload path
};
struct DeviceOptions {
  DeviceKind kind = DeviceKind::kAuto;
  std::string gpu_mem;  // device memory budget ("24GiB"); empty: CUDA 90% of the free memory,
                        // the stand-in unlimited
  OffloadSettings settings;
};

// A device and its math, owned; the math is destroyed first (it may hold device memory).
struct OffloadBackend {
  std::unique_ptr<offload::Device> device;
  std::unique_ptr<offload::DeviceMath> math;
  OffloadBackend();
  ~OffloadBackend();
};

// kAuto resolved on this machine; the other kinds as they are.
DeviceKind resolve_device_kind(DeviceKind kind);

// Null for DeviceKind::kCpu (and kAuto without a GPU). Fails when CUDA is asked for and this
// build or machine has none.
std::unique_ptr<OffloadBackend> open_offload_backend(const DeviceOptions& options);

}  // namespace sluice
