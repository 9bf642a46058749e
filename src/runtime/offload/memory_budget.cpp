#include "runtime/offload/memory_budget.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"

namespace sluice::offload {

void MemoryBudget::charge(size_t bytes, std::string_view what) {
  std::lock_guard lock(mutex_);
  if (bytes > budget_ - std::min(used_, budget_))
    fail(
        "gpu memory: allocating {} ({} bytes) for {} would exceed the --gpu-mem budget of {} "
        "({} already in use); raise --gpu-mem or lower the batch",
        human_bytes(double(bytes)), bytes, what, human_bytes(double(budget_)),
        human_bytes(double(used_)));
  used_ += bytes;
  peak_ = std::max(peak_, used_);
}

void MemoryBudget::refund(size_t bytes) {
  std::lock_guard lock(mutex_);
  used_ -= std::min(bytes, used_);
}

size_t MemoryBudget::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

size_t MemoryBudget::peak() const {
  std::lock_guard lock(mutex_);
  return peak_;
}

}  // namespace sluice::offload
