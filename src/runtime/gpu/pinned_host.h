// Host memory the GPU's copy engines can read directly (DMA) at full link speed: either an
// existing range (a mapped checkpoint) registered with cudaHostRegister, or a fresh pinned
// buffer. Unpinned memory would be staged through a driver bounce buffer at a fraction of the
// bandwidth, and cudaMemcpyAsync from it would not overlap with compute.
#pragma once

#include <cstddef>

namespace sluice::gpu {

class PinnedRegistration {
 public:
  PinnedRegistration(const void* data, size_t bytes, bool read_only = true);
  ~PinnedRegistration();
  PinnedRegistration(const PinnedRegistration&) = delete;
  PinnedRegistration& operator=(const PinnedRegistration&) = delete;

 private:
  void* data_ = nullptr;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace sluice::gpu
