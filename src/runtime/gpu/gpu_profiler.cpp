#include "runtime/gpu/gpu_profiler.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "kernels/cuda/cuda_check.h"
#include "runtime/gpu/cuda_device.h"
#include "runtime/gpu/pinned_host.h"

namespace sluice::gpu {
namespace {

// A pair of timing events on one stream; seconds() of the work enqueued between them.
class Timer {
 public:
  explicit Timer(cudaStream_t s) : stream_(s) {
    SLUICE_CUDA_CHECK(cudaEventCreate(&start_));
    SLUICE_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  template <typename F>
  double seconds(F&& work) {
    SLUICE_CUDA_CHECK(cudaEventRecord(start_, stream_));
    work();
    SLUICE_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    SLUICE_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    SLUICE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms) * 1e-3;
  }
  // Best of `reps` timings after one untimed warm-up run.
  template <typename F>
  double best_seconds(F&& work, int reps) {
    seconds(work);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) best = std::min(best, seconds(work));
    return best;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Bandwidth of one direction of PCIe: `bytes` copied `reps` times, the best.
double copy_bandwidth(Timer& timer, cudaStream_t stream, void* dst, const void* src, size_t bytes,
                      cudaMemcpyKind kind) {
  const double s = timer.best_seconds(
      [&] { SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream)); }, 3);
  return double(bytes) / s;
}

// GEMM time versus m on cuBLASLt. Several copies of W, together far larger than the L2 cache,
// are used in turn so each call reads its weights from device memory, as the engine's do.
GemmCurve gemm_curve(CudaDevice& device, cuda::GemmContext& ctx, Timer& timer, cudaStream_t stream,
                     const char* name, int64_t n, int64_t k, const std::vector<int64_t>& ms) {
  const size_t w_bytes = size_t(n * k) * 2;
  const size_t copies = std::max<size_t>(2, (size_t(512) << 20) / w_bytes + 1);
  const int64_t max_m = ms.back();
  offload::DeviceBuffer w(device, w_bytes * copies, "profile GEMM weights");
  offload::DeviceBuffer x(device, size_t(max_m * k) * 2, "profile GEMM input");
  offload::DeviceBuffer y(device, size_t(max_m * n) * 4, "profile GEMM output");
  // bf16 0x3c3c ≈ 0.0115: small non-zero values (the time does not depend on them).
  SLUICE_CUDA_CHECK(cudaMemsetAsync(w.ptr, 0x3c, w.bytes, stream));
  SLUICE_CUDA_CHECK(cudaMemsetAsync(x.ptr, 0x3c, x.bytes, stream));
  GemmCurve curve{name, "bf16", n, k, {}};
  size_t call = 0;
  for (int64_t m : ms) {
    const double s = timer.best_seconds(
        [&] {
          const auto* wc = static_cast<const uint16_t*>(w.ptr) + (call++ % copies) * size_t(n * k);
          ctx.gemm({m, n, k}, static_cast<const uint16_t*>(x.ptr), wc, static_cast<float*>(y.ptr),
                   0.0f, stream);
        },
        5);
    curve.points.push_back({m, s});
  }
  // More rows never take less time: a point slower than a later one is noise (as on the CPU).
  for (size_t i = curve.points.size() - 1; i-- > 0;)
    curve.points[i].seconds = std::min(curve.points[i].seconds, curve.points[i + 1].seconds);
  return curve;
}

}  // namespace

std::optional<GpuProfile> measure_gpu_profile() {
  if (cuda_device_count() == 0) return std::nullopt;
  SLUICE_CUDA_CHECK(cudaSetDevice(0));
  size_t free_bytes = 0, total_bytes = 0;
  SLUICE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  GpuProfile g;
  g.memory_free_bytes = free_bytes;
  // The measurements need about 2 GiB; the budget only caps what they may take.
  CudaDevice device(0, free_bytes - free_bytes / 16);
  g.name = device.name();
  const cudaStream_t stream = device.stream(offload::Queue::kCompute);
  Timer timer(stream);

  const size_t bytes = size_t(256) << 20;
  offload::DeviceBuffer dev_a(device, bytes, "profile copy buffer"), dev_b(device, bytes, "profile copy");
  PinnedBuffer pinned(bytes);
  std::unique_ptr<char[]> pageable(new char[bytes]);
  std::memset(pinned.data(), 1, bytes);
  std::memset(pageable.get(), 1, bytes);  // fault every page in before timing
  g.h2d_pinned_bytes_per_s =
      copy_bandwidth(timer, stream, dev_a.ptr, pinned.data(), bytes, cudaMemcpyHostToDevice);
  g.d2h_pinned_bytes_per_s =
      copy_bandwidth(timer, stream, pinned.data(), dev_a.ptr, bytes, cudaMemcpyDeviceToHost);
  g.h2d_pageable_bytes_per_s =
      copy_bandwidth(timer, stream, dev_a.ptr, pageable.get(), bytes, cudaMemcpyHostToDevice);
  g.d2h_pageable_bytes_per_s =
      copy_bandwidth(timer, stream, pageable.get(), dev_a.ptr, bytes, cudaMemcpyDeviceToHost);
  // A device-to-device copy reads and writes every byte once.
  g.memory_bytes_per_s =
      2 * copy_bandwidth(timer, stream, dev_b.ptr, dev_a.ptr, bytes, cudaMemcpyDeviceToDevice);

  offload::DeviceBuffer workspace(device, cuda::GemmContext::kWorkspaceBytes, "cuBLASLt workspace");
  cuda::GemmContext ctx(workspace.ptr, workspace.bytes);
  const std::vector<int64_t> ms = {1, 16, 64, 256, 1024, 4096, 8192};
  g.gemm.push_back(gemm_curve(device, ctx, timer, stream, "expert", 14336, 4096, ms));
  g.gemm.push_back(gemm_curve(device, ctx, timer, stream, "expert_down", 4096, 14336, ms));
  g.gemm.push_back(gemm_curve(device, ctx, timer, stream, "attention", 4096, 4096, ms));
  SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return g;
}

}  // namespace sluice::gpu
