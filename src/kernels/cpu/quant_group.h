// Symmetric quantization of one group of values, shared by the weights (quant_weights.cpp) and
// the activations (gemm_int8.cpp) so both round the same way. Internal to the int8 GEMM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace sluice::cpu::quant {

// scale = max|v| / qmax and q = round-to-nearest-even(v · (qmax / max|v|)), which cannot exceed
// qmax in magnitude (v ≤ max|v| and the two roundings add at most 2⁻²² to qmax). Returns the
// scale. A group holding an inf or NaN gets q = 0 and scale NaN, so the outputs it feeds are NaN,
// as they would be (or inf) in a float GEMM.
inline float quantize_group(const float* v, int64_t count, int qmax, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t p = 0; p < count; ++p) {
    amax = std::max(amax, std::fabs(v[p]));
    finite = finite && std::isfinite(v[p]);
  }
  if (!finite) {
    std::fill(q, q + count, int8_t(0));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = amax > 0.0f ? float(qmax) / amax : 0.0f;
  for (int64_t p = 0; p < count; ++p) q[p] = int8_t(std::nearbyint(v[p] * inv));
  return amax / float(qmax);
}

}  // namespace sluice::cpu::quant
