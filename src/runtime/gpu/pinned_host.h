// Host memory the GPU's copy engines can read directly (DMA) at full link speed: either an
// existing range (a mapped checkpoint) registered with cudaHostRegister, or a fresh pinned
// buffer. Unpinned memory would be staged through a driver bounce buffer at a fraction of the
// bandwidth, and cudaMemcpyAsync from it would not overlap with compute.
#pragma once

#include <cstddef>
#include <string>

namespace sluice::gpu {

// Page-locks [data, data + bytes) in place: read-only where the GPU supports it (a mapping of a
// file opened read-only can only be pinned so), else read-write. Returns "" on success, else
// CUDA's reason; never throws (the caller decides whether unpinned memory is an error).
std::string try_pin_host_range(const void* data, size_t bytes);

class PinnedRegistration {
 public:
  PinnedRegistration(const void* data, size_t bytes);  // fails with CUDA's reason
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
