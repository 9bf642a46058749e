#include "io/gguf_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace sluice {

namespace {

void put_f16(uint8_t* out, float d) {
  const uint16_t h = f32_to_f16(d);
  std::memcpy(out, &h, 2);
}

}  // namespace

void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    put_f16(out, d);
    for (int j = 0; j < 32; ++j) out[2 + j] = uint8_t(int8_t(std::roundf(x[b + j] * id)));
  }
}

void quantize_q4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32, out += 18) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[b + j]) > amax) {
        amax = std::fabs(x[b + j]);
        max = x[b + j];
      }
    const float d = max / -8.f, id = d != 0 ? 1.f / d : 0.f;
    put_f16(out, d);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, int(int8_t(x[b + j] * id + 8.5f)));
      const int hi = std::min(15, int(int8_t(x[b + j + 16] * id + 8.5f)));
      out[2 + j] = uint8_t(lo | (hi << 4));
    }
  }
}

std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n) {
  std::vector<uint8_t> out(size_t(n / 32 * 34));
  quantize_q8_0(x, n, out.data());
  return out;
}

std::vector<uint8_t> quantize_q4_0(const float* x, int64_t n) {
  std::vector<uint8_t> out(size_t(n / 32 * 18));
  quantize_q4_0(x, n, out.data());
  return out;
}

}  // namespace sluice
