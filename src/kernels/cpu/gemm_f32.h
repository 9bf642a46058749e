// GEMM with fp32 activations against bf16 weights: Y[m, n] = X[m, k] · Wᵀ + beta · Y, with W in
// the nn.Linear [n, k] layout. Unlike cpu::gemm, X is not rounded to bf16, so the result differs
// from an fp32 matmul of the same (bf16-valued) weights only in the order of additions.
// It runs on the tiles of gemm_tiled.h at the level in force.
// Used where that precision matters more than speed: the router (whose top-k choice is
// discontinuous in its input) and the engine's fp32 precision mode.
#pragma once

#include <cstdint>

namespace sluice::cpu {

struct GemmF32Args {
  int64_t m = 0, n = 0, k = 0;
  const float* x = nullptr;     // [m, k] dense
  const uint16_t* w = nullptr;  // bf16 [n, k] dense
  float* y = nullptr;           // [m, n] dense
  float beta = 0.0f;
};

void gemm_f32(const GemmF32Args& args);
void gemm_f32_reference(const GemmF32Args& args);  // sequential sums, for tests

}  // namespace sluice::cpu
