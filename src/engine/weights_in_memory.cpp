#include "engine/weights_in_memory.h"

#include <chrono>

#include "model/model_stats.h"
#include "runtime/memory_info.h"

namespace sluice {

WeightsRead read_weights_if_they_fit(const Model& model) {
  WeightsRead r;
  if (model.dir.empty()) return r;
  const size_t bytes = model_stats(model).total_bytes;
  if (double(bytes) > 0.9 * double(available_memory_bytes())) {
    r.skipped = true;
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  r.bytes = read_weights_into_memory(model);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace sluice
