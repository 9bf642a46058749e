#include "runtime/gpu/cuda_device.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/units.h"
#include "kernels/cuda/cuda_check.h"
#include "runtime/gpu/pinned_host.h"

namespace sluice::gpu {

namespace {

class CudaEvent final : public offload::Event {
 public:
  CudaEvent() { SLUICE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CudaEvent() override { cudaEventDestroy(event); }  // no throw from a destructor
  cudaEvent_t event = nullptr;
};

cudaEvent_t as_cuda(const offload::EventPtr& e) {
  auto* c = dynamic_cast<CudaEvent*>(e.get());
  if (!c) fail("cuda device: field 'event': expected an event recorded on this device");
  return c->event;
}

}  // namespace

CudaDevice::CudaDevice(int ordinal, size_t budget_bytes)
    : ordinal_(ordinal), budget_(budget_bytes) {
  const int count = cuda_device_count();
  if (ordinal < 0 || ordinal >= count)
    fail("cuda device: field 'ordinal': expected a GPU in [0, {}), got {}", count, ordinal);
  SLUICE_CUDA_CHECK(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  SLUICE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  SLUICE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (budget_bytes > free_bytes)
    fail("cuda device: --gpu-mem {} is more than the {} free on {} ({} total)",
         human_bytes(double(budget_bytes)), human_bytes(double(free_bytes)), prop.name,
         human_bytes(double(total_bytes)));
  name_ = fmt::format("cuda:{} {}", ordinal, prop.name);
  for (cudaStream_t& s : streams_)
    SLUICE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
}

CudaDevice::~CudaDevice() {
  cudaDeviceSynchronize();
  for (auto& pending : pending_)
    for (const TimedPair& p : pending) event_pool_.insert(event_pool_.end(), {p.start, p.end});
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
}

cudaEvent_t CudaDevice::timing_event() {
  if (!event_pool_.empty()) {
    cudaEvent_t e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  SLUICE_CUDA_CHECK(cudaEventCreate(&e));  // with timing
  return e;
}

void CudaDevice::start_timing(offload::Queue q) {
  cudaEvent_t e = timing_event();
  SLUICE_CUDA_CHECK(cudaEventRecord(e, stream(q)));
  open_start_[int(q)] = e;
}

void CudaDevice::end_timing(offload::Queue q) {
  cudaEvent_t e = timing_event();
  SLUICE_CUDA_CHECK(cudaEventRecord(e, stream(q)));
  pending_[int(q)].push_back({open_start_[int(q)], e});
  open_start_[int(q)] = nullptr;
}

offload::QueueSeconds CudaDevice::take_busy_seconds() {
  for (int q = 0; q < offload::kQueueCount; ++q) {
    auto& pending = pending_[q];
    while (!pending.empty()) {
      const TimedPair p = pending.front();
      const cudaError_t status = cudaEventQuery(p.end);
      if (status == cudaErrorNotReady) {
        // Not an error, but clear it should the runtime have kept it as the last error, so the
        // next launch check does not report it.
        if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
        break;  // the stream is in order: later pairs are not done either
      }
      SLUICE_CUDA_CHECK(status);
      float ms = 0;
      SLUICE_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.end));
      busy_.seconds[q] += double(ms) * 1e-3;
      event_pool_.insert(event_pool_.end(), {p.start, p.end});
      pending.pop_front();
    }
  }
  return std::exchange(busy_, offload::QueueSeconds{});
}

void* CudaDevice::allocate(size_t bytes, std::string_view what) {
  budget_.charge(bytes, what);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status != cudaSuccess) {
    budget_.refund(bytes);
    cudaGetLastError();
    fail("CUDA error in cudaMalloc of {} for {}: {}: {}", human_bytes(double(bytes)), what,
         cudaGetErrorName(status), cudaGetErrorString(status));
  }
  return p;
}

void CudaDevice::deallocate(void* ptr, size_t bytes) {
  if (ptr) cudaFree(ptr);
  budget_.refund(bytes);
}

void CudaDevice::copy_to_device(offload::Queue q, void* dst, const void* src, size_t bytes,
                                std::string_view) {
  if (bytes == 0) return;
  start_timing(q);
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(q)));
  end_timing(q);
}

void CudaDevice::copy_to_host(offload::Queue q, void* dst, const void* src, size_t bytes,
                              std::string_view) {
  if (bytes == 0) return;
  start_timing(q);
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(q)));
  end_timing(q);
}

void CudaDevice::enqueue(offload::Queue q, offload::QueueWork work, std::string_view) {
  // The pair also spans gaps while the host is still launching the work's kernels: busy time is
  // an upper bound by those launch gaps (microseconds per kernel).
  start_timing(q);
  work(stream(q));  // launches asynchronously on the stream
  end_timing(q);
}

offload::EventPtr CudaDevice::record(offload::Queue q) {
  auto e = std::make_shared<CudaEvent>();
  SLUICE_CUDA_CHECK(cudaEventRecord(e->event, stream(q)));
  return e;
}

void CudaDevice::wait(offload::Queue q, const offload::EventPtr& event) {
  SLUICE_CUDA_CHECK(cudaStreamWaitEvent(stream(q), as_cuda(event), 0));
}

void CudaDevice::synchronize(const offload::EventPtr& event) {
  SLUICE_CUDA_CHECK(cudaEventSynchronize(as_cuda(event)));
}

void CudaDevice::synchronize_all() {
  for (cudaStream_t s : streams_) SLUICE_CUDA_CHECK(cudaStreamSynchronize(s));
}

void* CudaDevice::allocate_host(size_t bytes, std::string_view what) {
  void* p = nullptr;
  const cudaError_t status = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA error in cudaHostAlloc of {} of pinned host memory for {}: {}: {}",
         human_bytes(double(bytes)), what, cudaGetErrorName(status), cudaGetErrorString(status));
  }
  return p;
}

void CudaDevice::free_host(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}

bool CudaDevice::register_host(const void* ptr, size_t bytes) {
  const std::string error = try_pin_host_range(ptr, bytes);
  if (!error.empty()) spdlog::warn("cuda device: {}", error);
  return error.empty();
}

void CudaDevice::unregister_host(const void* ptr) {
  if (cudaHostUnregister(const_cast<void*>(ptr)) != cudaSuccess) cudaGetLastError();
}

double CudaDevice::measure_host_to_device(size_t bytes, int repeats) {
  // Outside the budget: the probe is freed before the executor takes its memory.
  PinnedBuffer src(bytes);
  std::memset(src.data(), 1, bytes);  // fault the pages in before timing
  void* dst = nullptr;
  SLUICE_CUDA_CHECK(cudaMalloc(&dst, bytes));
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  SLUICE_CUDA_CHECK(cudaEventCreate(&t0));
  SLUICE_CUDA_CHECK(cudaEventCreate(&t1));
  const cudaStream_t s = stream(offload::Queue::kWeights);
  double best = 0;
  cudaError_t status = cudaSuccess;
  for (int r = 0; r <= repeats && status == cudaSuccess; ++r) {  // r = 0 warms up
    status = cudaEventRecord(t0, s);
    if (status == cudaSuccess)
      status = cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyHostToDevice, s);
    if (status == cudaSuccess) status = cudaEventRecord(t1, s);
    if (status == cudaSuccess) status = cudaEventSynchronize(t1);
    float ms = 0;
    if (status == cudaSuccess) status = cudaEventElapsedTime(&ms, t0, t1);
    if (status == cudaSuccess && r > 0 && ms > 0)
      best = std::max(best, double(bytes) / (ms * 1e-3));
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(dst);
  SLUICE_CUDA_CHECK(status);
  return best;
}

}  // namespace sluice::gpu
