// A fixed-size host array the device copies to and from at full speed: its memory comes from
// Device::allocate_host (page-locked on CUDA, plain on the stand-in). The offload executor keeps
// every activation block that crosses the link in one of these.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include "runtime/offload/device.h"

namespace sluice::offload {

template <typename T>
class HostArray {
 public:
  HostArray() = default;
  HostArray(Device& device, size_t n, std::string_view what)
      : device_(&device), data_(static_cast<T*>(device.allocate_host(n * sizeof(T), what))), n_(n) {
    for (size_t i = 0; i < n; ++i) data_[i] = T{};
  }
  ~HostArray() {
    if (data_) device_->free_host(data_);
  }
  HostArray(HostArray&& o) noexcept { swap(o); }
  HostArray& operator=(HostArray&& o) noexcept {
    swap(o);
    return *this;
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  T* data() const { return data_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) const { return data_[i]; }
  T* begin() const { return data_; }

 private:
  void swap(HostArray& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
  }
  Device* device_ = nullptr;
  T* data_ = nullptr;
  size_t n_ = 0;
};

}  // namespace sluice::offload
