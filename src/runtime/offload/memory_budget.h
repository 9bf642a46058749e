// A hard byte budget for device memory (`--gpu-mem`), so a large GPU can behave like a 16 or
// 24 GB one: every device allocation is charged here first, and a request past the budget is an
// error naming the request, what is already held and the budget.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>

namespace sluice::offload {

class MemoryBudget {
 public:
  explicit MemoryBudget(size_t budget_bytes) : budget_(budget_bytes) {}

  // Charges `bytes` for `what`; fails (sluice::Error) if that would exceed the budget.
  void charge(size_t bytes, std::string_view what);
  void refund(size_t bytes);

  size_t budget() const { return budget_; }
  size_t used() const;
  size_t peak() const;  // the most ever charged at once

 private:
  mutable std::mutex mutex_;
  size_t budget_ = 0, used_ = 0, peak_ = 0;
};

}  // namespace sluice::offload
