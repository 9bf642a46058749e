// Test-only GGUF helpers: a model's weights as a Q8_0 / Q4_0 file stores them, for comparing a
// loaded file's logits with the folder it was exported from (model/gguf_export.h).
#pragma once

#include "model/gguf_export.h"
#include "model/weights.h"

namespace sluice::testing {

// `m`'s weights as a kQ8_0 / kQ4_0 file stores them: each stored_quantized tensor quantised and
// dequantised, in BF16 (a tied lm_head follows the embedding).
void round_trip_quantized(Model& m, GgufWeights weights);

}  // namespace sluice::testing
