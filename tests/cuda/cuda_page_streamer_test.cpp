// The page streamer on a real GPU: many pages through few slots with tasks that snapshot their
// pages (device-to-device copies on the compute stream); every snapshot must equal its page's
// host bytes, so no slot was overwritten before its last user ran and no task ran early.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "runtime/gpu/cuda_device.h"
#include "runtime/gpu/pinned_host.h"
#include "runtime/offload/page_streamer.h"

namespace sluice {
namespace {

TEST(CudaPageStreamer, SnapshotsEqualPagesThroughFewSlots) {
  SKIP_WITHOUT_GPU("CUDA page streamer test");
  const size_t page = size_t(4) << 20;
  const int n_pages = 48, slots = 4;
  gpu::CudaDevice device(0, size_t(512) << 20);
  gpu::PinnedBuffer host(page * n_pages);
  auto* bytes = static_cast<uint8_t*>(host.data());
  for (size_t i = 0; i < page * n_pages; ++i) bytes[i] = uint8_t((i * 2654435761u) >> 13);
  std::vector<offload::WeightPage> pages;
  std::vector<std::vector<int>> uses;
  for (int p = 0; p < n_pages; ++p) {
    pages.push_back({bytes + page * p, page, fmt::format("p{}", p)});
    if (p % 2 == 1) uses.push_back({p - 1, p});  // two pages per task: double buffering
  }
  void* snapshots = device.allocate(page * n_pages, "snapshots");
  {
    offload::PageSlots pool(device, page, slots);
    offload::PageStreamer streamer(device, pool, pages, uses);
    for (int t = 0; t < int(uses.size()); ++t)
      streamer.run(
          t,
          [&, t](void* stream, std::span<void* const> ptrs) {
            for (size_t j = 0; j < ptrs.size(); ++j)
              SLUICE_CUDA_CHECK(cudaMemcpyAsync(
                  static_cast<uint8_t*>(snapshots) + page * size_t(uses[size_t(t)][j]), ptrs[j],
                  page, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
          },
          "snapshot");
    device.synchronize_all();
    EXPECT_EQ(streamer.pages_in_slots(), 0);
  }
  std::vector<uint8_t> got(page * n_pages);
  SLUICE_CUDA_CHECK(cudaMemcpy(got.data(), snapshots, got.size(), cudaMemcpyDeviceToHost));
  device.deallocate(snapshots, page * n_pages);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes));
  EXPECT_LE(device.budget().peak(), size_t(512) << 20);
}

}  // namespace
}  // namespace sluice
