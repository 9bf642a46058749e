// Gated activation of the expert / dense FFN: out = silu(gate) ⊙ up, silu(x) = x / (1 + e^-x).
// (torch: F.silu(self.w1(x)) * self.w3(x))
#pragma once

#include <cstdint>

namespace sluice::cpu {

// n elements; out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_reference(const float* gate, const float* up, float* out, int64_t n);

}  // namespace sluice::cpu
