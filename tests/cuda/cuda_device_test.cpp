// The CUDA device's host-memory and timing services the offload executor relies on: pinned
// buffers, page-locking an existing allocation in place, per-queue busy time from timed events
// (collected without synchronising), and the pinned H2D bandwidth probe. Skipped without a GPU.
#include "runtime/gpu/cuda_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice {
namespace {

using offload::Queue;

TEST(CudaDeviceServices, PinnedCopiesAreTimedPerQueue) {
  SKIP_WITHOUT_GPU("CUDA device test");
  const size_t bytes = size_t(64) << 20;
  gpu::CudaDevice device(0, size_t(1) << 30);
  void* host = device.allocate_host(bytes, "test buffer");
  std::memset(host, 7, bytes);
  void* dev = device.allocate(bytes, "test slot");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) device.copy_to_device(Queue::kWeights, dev, host, bytes, "copy");
  device.copy_to_host(Queue::kTransfer, host, dev, bytes, "back");  // unordered: timing only
  device.synchronize_all();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const offload::QueueSeconds busy = device.take_busy_seconds();
  EXPECT_GT(busy[Queue::kWeights], 0);
  EXPECT_LE(busy[Queue::kWeights], wall);
  EXPECT_GT(busy[Queue::kTransfer], 0);
  EXPECT_EQ(busy[Queue::kCompute], 0);
  const double rate = 4.0 * double(bytes) / busy[Queue::kWeights];
  std::printf("pinned H2D while timed: %.1f GB/s\n", rate / 1e9);
  EXPECT_GT(rate, 1e9) << "pinned copies below 1 GB/s: not DMA from pinned memory?";
  // Taken once: a second call has nothing new.
  EXPECT_EQ(device.take_busy_seconds()[Queue::kWeights], 0);
  device.deallocate(dev, bytes);
  device.free_host(host);

  const double probe = device.measure_host_to_device(size_t(256) << 20, 3);
  std::printf("pinned H2D probe: %.1f GB/s\n", probe / 1e9);
  EXPECT_GT(probe, 1e9);
  EXPECT_EQ(device.budget().used(), 0u);  // the probe is outside the budget
}

TEST(CudaDeviceServices, RegistersAPlainAllocationInPlace) {
  SKIP_WITHOUT_GPU("CUDA device test");
  const size_t bytes = size_t(32) << 20;
  gpu::CudaDevice device(0, size_t(256) << 20);
  std::vector<char> weights(bytes + 4096);
  // Whole OS pages, as the executor registers them.
  char* begin = weights.data() + (4096 - reinterpret_cast<uintptr_t>(weights.data()) % 4096) % 4096;
  for (size_t i = 0; i < bytes; ++i) begin[i] = char(i * 31);
  ASSERT_TRUE(device.register_host(begin, bytes));
  void* dev = device.allocate(bytes, "slot");
  device.copy_to_device(Queue::kWeights, dev, begin, bytes, "registered");
  std::vector<char> back(bytes);
  device.copy_to_host(Queue::kWeights, back.data(), dev, bytes, "back");
  device.synchronize_all();
  EXPECT_EQ(std::memcmp(back.data(), begin, bytes), 0);
  device.unregister_host(begin);
  device.deallocate(dev, bytes);
}

}  // namespace
}  // namespace sluice
