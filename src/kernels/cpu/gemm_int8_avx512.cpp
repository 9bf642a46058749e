// The int8 GEMM tiles of the avx512 levels (and of amx, which has no tile kernel yet):
// AVX512-VNNI vpdpbusd on one 64-byte line of the packed block, 4 k of all 16 rows, so each
// row of X keeps one zmm of int32 lanes, one per column. Same offset trick and same fp32 fold
// as the AVX-VNNI tile in gemm_int8_avx2.cpp.
#include <cmath>
#include <cstring>

#include "kernels/cpu/gemm_int8_kernels.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu::int8 {
namespace {

SLUICE_AVX512 inline __m512i broadcast_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// w xor 0x80 is w + 128 as an unsigned byte; the accumulator starts at -128·Σx of the row's
// group (offset_sum), so after the group it holds Σw·x exactly (|Σ| < 2²⁵, no overflow).
template <int kRows>
SLUICE_AVX512_VNNI void tile_avx512_vnni(const Tile& t) {
  const QuantView& w = *t.w;
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  __m512 acc[kRows];
  for (int i = 0; i < kRows; ++i) acc[i] = _mm512_loadu_ps(t.acc + i * kInt8BlockRows);
  for (int64_t g = t.g0; g < t.g1; ++g) {
    const int8_t* wp = block_group(w, t.block, g);
    const int8_t* xq = t.x->q + t.row * w.k + g * w.group_size;
    __m512i d[kRows];
    for (int i = 0; i < kRows; ++i)
      d[i] = _mm512_set1_epi32(t.x->offset_sum[(t.row + i) * t.x->groups + g]);
    for (int64_t p = 0; p < w.group_size; p += 4, wp += 4 * kInt8BlockRows) {
      const __m512i wv = _mm512_xor_si512(_mm512_load_si512(wp), bias);
      for (int i = 0; i < kRows; ++i)
        d[i] = _mm512_dpbusd_epi32(d[i], wv, broadcast_quad(xq + i * w.k + p));
    }
    const __m512 sw = _mm512_loadu_ps(block_scales(w, t.x->groups, t.block, g));
    for (int i = 0; i < kRows; ++i) {
      const __m512 sx = _mm512_set1_ps(t.x->scale[(t.row + i) * t.x->groups + g]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i]), _mm512_mul_ps(sx, sw), acc[i]);
    }
  }
  for (int i = 0; i < kRows; ++i) _mm512_storeu_ps(t.acc + i * kInt8BlockRows, acc[i]);
}

// int4 (gemm_int8.h): one 64-byte line holds two k-quads of the 16 rows as nibbles u = q + 8;
// u & 15 (the quad at p) and u >> 4 (the quad at p + 4) are vpdpbusd's unsigned operands, and
// the group's sum starts at -8·Σx (offset_sum4).
template <int kRows>
SLUICE_AVX512_VNNI void tile4_avx512_vnni(const Tile& t) {
  const QuantView& w = *t.w;
  const __m512i low = _mm512_set1_epi8(15);
  __m512 acc[kRows];
  for (int i = 0; i < kRows; ++i) acc[i] = _mm512_loadu_ps(t.acc + i * kInt8BlockRows);
  for (int64_t g = t.g0; g < t.g1; ++g) {
    const uint8_t* wp = block_group4(w, t.block, g);
    const int8_t* xq = t.x->q + t.row * w.k + g * w.group_size;
    __m512i d[kRows];
    for (int i = 0; i < kRows; ++i)
      d[i] = _mm512_set1_epi32(t.x->offset_sum4[(t.row + i) * t.x->groups + g]);
    for (int64_t p = 0; p < w.group_size; p += 8, wp += 4 * kInt8BlockRows) {
      const __m512i v = _mm512_load_si512(wp);
      const __m512i lo = _mm512_and_si512(v, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int i = 0; i < kRows; ++i) {
        d[i] = _mm512_dpbusd_epi32(d[i], lo, broadcast_quad(xq + i * w.k + p));
        d[i] = _mm512_dpbusd_epi32(d[i], hi, broadcast_quad(xq + i * w.k + p + 4));
      }
    }
    const __m512 sw = _mm512_loadu_ps(block_scales(w, t.x->groups, t.block, g));
    for (int i = 0; i < kRows; ++i) {
      const __m512 sx = _mm512_set1_ps(t.x->scale[(t.row + i) * t.x->groups + g]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i]), _mm512_mul_ps(sx, sw), acc[i]);
    }
  }
  for (int i = 0; i < kRows; ++i) _mm512_storeu_ps(t.acc + i * kInt8BlockRows, acc[i]);
}

SLUICE_AVX512 void store_avx512(const float* acc, int64_t rows, int64_t cols, float* y, int64_t ldy,
                                float beta) {
  const __m512 b = _mm512_set1_ps(beta);
  const __mmask16 mask = cols >= 16 ? __mmask16(0xffff) : avx512::tail_mask(int(cols));
  for (int64_t i = 0; i < rows; ++i, acc += kInt8BlockRows, y += ldy) {
    const __m512 v = _mm512_loadu_ps(acc);
    _mm512_mask_storeu_ps(y, mask,
                          beta == 0.0f ? v : _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(mask, y), v));
  }
}

}  // namespace

Kernels kernels_avx512_vnni() {
  return {
      .tile = {tile_avx512_vnni<1>, tile_avx512_vnni<2>, tile_avx512_vnni<3>, tile_avx512_vnni<4>},
      .tile4 = {tile4_avx512_vnni<1>, tile4_avx512_vnni<2>, tile4_avx512_vnni<3>,
                tile4_avx512_vnni<4>},
      .store = store_avx512};
}

}  // namespace sluice::cpu::int8
