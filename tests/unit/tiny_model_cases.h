// The tiny models the engine tests run on: tiny-mixtral as it is, and a variant with a sliding
// window, grouped-query attention (3 query heads per KV head), top-3 routing over 5 experts and
// an odd vocabulary. Shared by batch_engine_test (which adds more) and offload_executor_test.
#pragma once

#include <functional>

#include "model/config.h"

namespace sluice::testing {

struct TinyModelCase {
  const char* name;
  std::function<void(ModelConfig&)> edit;  // applied to preset_config("tiny-mixtral")
};

inline TinyModelCase tiny_mixtral_case() {
  return {"tiny_mixtral", [](ModelConfig&) {}};
}

inline TinyModelCase sliding_window_gqa_case() {
  return {"sliding_window_gqa3_top3_odd_vocab", [](ModelConfig& c) {
            c.sliding_window = 6;
            c.num_heads = 6;
            c.num_kv_heads = 2;
            c.head_dim = 16;
            c.experts_per_token = 3;
            c.num_experts = 5;
            c.vocab_size = 301;
            c.num_layers = 3;
          }};
}

}  // namespace sluice::testing
