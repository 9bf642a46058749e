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
  size_t expert_bytes = 0;             // all experts of all layers (FP8 block scales too)
  size_t bytes_touched_per_token = 0;  // weights one decode token reads (batch of one)
};

// The weights the model holds: with its routed experts left in their files (the disk tier), those
// are not counted.
ModelStats model_stats(const Model& model);
// The same with routed experts left in their files counted as the engine holds them in memory
// (bf16, int8/int4 packed, or FP8 with block scales): the whole model, as `inspect` describes it.
ModelStats whole_model_stats(const Model& model);

}  // namespace sluice
