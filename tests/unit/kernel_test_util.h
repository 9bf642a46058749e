// Helpers shared by the CPU kernel tests: seeded random data and bf16 rounding.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace sluice::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<uint16_t> v(n);
  auto f = random_floats(n, seed, scale);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

}  // namespace sluice::test
