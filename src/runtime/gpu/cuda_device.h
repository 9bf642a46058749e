// The offload Device on a CUDA GPU: one stream per queue (weights, transfers, compute), events
// without timing, and device memory from cudaMalloc charged to a hard budget (`--gpu-mem`)
// before it is asked of the driver.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/offload/device.h"

namespace sluice::gpu {

class CudaDevice final : public offload::Device {
 public:
  CudaDevice(int ordinal, size_t budget_bytes);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return name_; }
  void* allocate(size_t bytes, std::string_view what) override;
  void deallocate(void* ptr, size_t bytes) override;
  const offload::MemoryBudget& budget() const override { return budget_; }

  void copy_to_device(offload::Queue q, void* dst, const void* src, size_t bytes,
                      std::string_view label) override;
  void copy_to_host(offload::Queue q, void* dst, const void* src, size_t bytes,
                    std::string_view label) override;
  void enqueue(offload::Queue q, offload::QueueWork work, std::string_view label) override;
  offload::EventPtr record(offload::Queue q) override;
  void wait(offload::Queue q, const offload::EventPtr& event) override;
  void synchronize(const offload::EventPtr& event) override;
  void synchronize_all() override;

  cudaStream_t stream(offload::Queue q) const { return streams_[int(q)]; }

 private:
  int ordinal_;
  std::string name_;
  offload::MemoryBudget budget_;
  cudaStream_t streams_[offload::kQueueCount] = {};
};

}  // namespace sluice::gpu
