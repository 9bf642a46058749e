// Parameter and byte counts of a loaded model, for `inspect` and for bandwidth accounting.
#pragma once

#include <map>
#include <string>

#include "model/weights.h"

namespace sluice {

struct ModelStats {
  int64_t total_params = 0;
  int64_t active_params_per_token = 0;  // one embedding row, attention, top-k experts, the
                                        // dense MLP (shared expert), lm_head
  std::map<std::string, size_t> bytes_per_dtype;
  size_t total_bytes = 0;
  size_t expert_bytes = 0;             // all experts of all layers
  size_t bytes_touched_per_token = 0;  // weights one decode token reads (batch of one)
};

ModelStats model_stats(const Model& model);

}  // namespace sluice
