#include "runtime/gpu/cuda_device.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "runtime/gpu/cuda_check.h"

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
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
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
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(q)));
}

void CudaDevice::copy_to_host(offload::Queue q, void* dst, const void* src, size_t bytes,
                              std::string_view) {
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(q)));
}

void CudaDevice::enqueue(offload::Queue q, offload::QueueWork work, std::string_view) {
  work(stream(q));  // launches asynchronously on the stream
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

}  // namespace sluice::gpu
