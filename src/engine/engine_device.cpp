#include "engine/engine_device.h"

#include <limits>

#include "core/error.h"
#include "core/units.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#if SLUICE_HAS_CUDA
#include "runtime/gpu/cuda_backend.h"
#endif

namespace sluice {

OffloadBackend::OffloadBackend() = default;
OffloadBackend::~OffloadBackend() {
  math.reset();
  device.reset();
}

DeviceKind resolve_device_kind(DeviceKind kind) {
  if (kind != DeviceKind::kAuto) return kind;
#if SLUICE_HAS_CUDA
  if (gpu::cuda_gpu_usable()) return DeviceKind::kCuda;
#endif
  return DeviceKind::kCpu;
}

std::unique_ptr<OffloadBackend> open_offload_backend(const DeviceOptions& o) {
  const DeviceKind kind = resolve_device_kind(o.kind);
  if (kind == DeviceKind::kCpu) return nullptr;
  const size_t budget = o.gpu_mem.empty() ? 0 : parse_bytes(o.gpu_mem, "--gpu-mem");
  auto b = std::make_unique<OffloadBackend>();
  if (kind == DeviceKind::kStandin) {
    b->device = std::make_unique<offload::CpuStandinDevice>(
        budget ? budget : std::numeric_limits<size_t>::max());
    b->math = std::make_unique<offload::HostMath>();
    return b;
  }
#if SLUICE_HAS_CUDA
  gpu::CudaBackend cuda = gpu::open_cuda_backend(budget);
  b->device = std::move(cuda.device);
  b->math = std::move(cuda.math);
  return b;
#else
  fail(
      "--device cuda: this build has no CUDA backend (nvcc was not found when it was built); "
      "use --device cpu, or rebuild with CUDA");
#endif
}

}  // namespace sluice
