#include "io/gguf_dequant.h"

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "io/gguf.h"

namespace sluice {

namespace {

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// The 6-bit scale and min of sub-block j (0..7) packed in a K-quant's 12 scale bytes
// (ggml's get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j+4; j >= 4 in the nibbles
// of byte j+4 with their top 2 bits in the top bits of bytes j-4 and j.
void scale_min_k4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += 32, b += 34) {
    const float d = half_at(b);
    for (int j = 0; j < 32; ++j) dst[i + j] = d * float(int8_t(b[2 + j]));
  }
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += 32, b += 18) {
    const float d = half_at(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      dst[i + j] = d * float((qs[j] & 0xF) - 8);
      dst[i + j + 16] = d * float((qs[j] >> 4) - 8);
    }
  }
}

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += 256, b += 144) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    float* y = dst + i;
    // Four groups of 64: 32 low nibbles (sub-block 2g), then 32 high ones (2g + 1).
    for (int g = 0; g < 4; ++g, q += 32, y += 64) {
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * g, scales, &sc0, &m0);
      scale_min_k4(2 * g + 1, scales, &sc1, &m1);
      for (int l = 0; l < 32; ++l) {
        y[l] = d * float(sc0) * float(q[l] & 0xF) - dmin * float(m0);
        y[l + 32] = d * float(sc1) * float(q[l] >> 4) - dmin * float(m1);
      }
    }
  }
}

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += 256, b += 176) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    float* y = dst + i;
    // As Q4_K; value l of group g takes its fifth bit from bit 2g (low half) or 2g+1 of qh[l].
    for (int g = 0; g < 4; ++g, ql += 32, y += 64) {
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * g, scales, &sc0, &m0);
      scale_min_k4(2 * g + 1, scales, &sc1, &m1);
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[l] & 0xF) + (((qh[l] >> (2 * g)) & 1) << 4);
        const int hi = (ql[l] >> 4) + (((qh[l] >> (2 * g + 1)) & 1) << 4);
        y[l] = d * float(sc0) * float(lo) - dmin * float(m0);
        y[l + 32] = d * float(sc1) * float(hi) - dmin * float(m1);
      }
    }
  }
}

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += 256, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    float* y = dst + i;
    // Two halves of 128; in each, value l (< 32) of the four quarters takes the low nibble of
    // ql[l], of ql[l+32], the high nibble of ql[l], of ql[l+32], and 2 bits each of qh[l].
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * float(sc[s + 0]) * float(q1);
        y[l + 32] = d * float(sc[s + 2]) * float(q2);
        y[l + 64] = d * float(sc[s + 4]) * float(q3);
        y[l + 96] = d * float(sc[s + 6]) * float(q4);
      }
    }
  }
}

bool dequantize(uint32_t type, const void* src, float* dst, int64_t n) {
  switch (GgmlType(type)) {
    case GgmlType::Q8_0:
      dequantize_q8_0(src, dst, n);
      return true;
    case GgmlType::Q4_0:
      dequantize_q4_0(src, dst, n);
      return true;
    case GgmlType::Q4_K:
      dequantize_q4_k(src, dst, n);
      return true;
    case GgmlType::Q5_K:
      dequantize_q5_k(src, dst, n);
      return true;
    case GgmlType::Q6_K:
      dequantize_q6_k(src, dst, n);
      return true;
    default:
      return false;
  }
}

bool dequantize_to_bf16(uint32_t type, const void* src, uint16_t* dst, int64_t rows, int64_t row) {
  const auto info = ggml_type_info(type);
  if (!info) return false;
  const size_t row_bytes = size_t(row / info->block_elements) * info->block_bytes;
  std::vector<float> values(static_cast<size_t>(row));
  for (int64_t r = 0; r < rows; ++r) {
    if (!dequantize(type, static_cast<const std::byte*>(src) + size_t(r) * row_bytes, values.data(),
                    row))
      return false;
    for (int64_t i = 0; i < row; ++i) dst[r * row + i] = f32_to_bf16(values[size_t(i)]);
  }
  return true;
}

}  // namespace sluice
