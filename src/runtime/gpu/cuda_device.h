// The offload Device on a CUDA GPU: one stream per queue (weights, transfers, compute), events
// without timing for ordering, and device memory from cudaMalloc charged to a hard budget
// (`--gpu-mem`) before it is asked of the driver. Every copy and every piece of work is bracketed
// by a pair of timed events on its stream, so each queue's busy time is measured on the GPU
// without synchronising: pairs are read once their end event has completed.
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <vector>

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
  void* allocate_host(size_t bytes, std::string_view what) override;
  void free_host(void* ptr) override;
  bool register_host(const void* ptr, size_t bytes) override;
  void unregister_host(const void* ptr) override;
  offload::QueueSeconds take_busy_seconds() override;
  double measure_host_to_device(size_t bytes, int repeats) override;

  cudaStream_t stream(offload::Queue q) const { return streams_[int(q)]; }

 private:
  int ordinal_;
  std::string name_;
  offload::MemoryBudget budget_;
  struct TimedPair {
    cudaEvent_t start, end;
  };
  cudaEvent_t timing_event();  // from the pool, or a new one
  void start_timing(offload::Queue q);
  void end_timing(offload::Queue q);

  cudaStream_t streams_[offload::kQueueCount] = {};
  std::vector<cudaEvent_t> event_pool_;  // timed events free for reuse
  cudaEvent_t open_start_[offload::kQueueCount] = {};
  std::deque<TimedPair> pending_[offload::kQueueCount];  // in stream order
  offload::QueueSeconds busy_;
};

}  // namespace sluice::gpu
