// The int8 GEMM tiles of the avx2 level: vpmaddubsw + vpmaddwd, or AVX-VNNI's vpdpbusd where
// the CPU has it. Both keep 16 columns in two ymm of int32 lanes per row of X, so a group's dot
// products need no horizontal sum, and fold each finished group into the fp32 accumulators with
// the same fma as every other level (gemm_int8.h).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/gemm_int8_kernels.h"

namespace sluice::cpu::int8 {
namespace {

// The 4 bytes of X at p, in every int32 lane: one k-quad against 8 rows of W per ymm.
SLUICE_AVX2 inline __m256i broadcast_quad(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The line kPrefetchAheadBytes past the one at p, into L1 (prefetches never fault: past the
// last block it points at the scales or beyond, harmlessly). Not _mm_prefetch: GCC 12 drops
// __builtin_prefetch from some loops (gemm_tiles.h).
inline void prefetch_ahead(const void* p) {
  __asm__ volatile("prefetcht0 (%0)" : : "r"(static_cast<const char*>(p) + kPrefetchAheadBytes));
}

// acc[i] (16 fp32 in memory, row stride ldacc) = fma(float(d[i]), sx[i] · sw, acc[i]) for the
// finished group at c.
template <int kRows>
SLUICE_AVX2 inline void fold_group(const GroupCursor& c, float* acc, int64_t ldacc,
                                   const __m256i (&d)[kRows][2]) {
  const __m256 sw0 = _mm256_loadu_ps(c.sw), sw1 = _mm256_loadu_ps(c.sw + 8);
  for (int i = 0; i < kRows; ++i, acc += ldacc) {
    const __m256 sx = _mm256_set1_ps(c.sx[i * c.groups]);
    _mm256_storeu_ps(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[i][0]), _mm256_mul_ps(sx, sw0),
                                          _mm256_loadu_ps(acc)));
    _mm256_storeu_ps(acc + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[i][1]), _mm256_mul_ps(sx, sw1),
                                              _mm256_loadu_ps(acc + 8)));
  }
}

// The group's int32 sums start at the row's offset (offset_sum or offset_sum4 at c).
template <int kRows>
SLUICE_AVX2 inline void start_group(const GroupCursor& c, __m256i (&d)[kRows][2]) {
  for (int i = 0; i < kRows; ++i) d[i][0] = d[i][1] = _mm256_set1_epi32(c.offset[i * c.groups]);
}

// vpmaddubsw multiplies unsigned by signed bytes, so the sign trick: |x| (unsigned) times
// w with x's sign applied (vpsignb), which is x·w. Both lie in [-127, 127] (the quantizers never
// produce -128 and pack_weights_int8 rejects it), so a pair sum is at most 2·127² = 32258 in
// magnitude and the int16 saturation of vpmaddubsw cannot occur; vpmaddwd with ones then adds
// the two pairs of a k-quad into the row's int32 lane. (The offset trick, (x + 128)·w, would
// reach 2·255·127 = 64770 and saturate.)
//
// Measured on 2 Zen 3 cores (AMD EPYC, 2.45 GHz VM), counting 2 ops per int8 multiply-add:
// vpmaddubsw alone ≈ 610 GOP/s, vpmaddubsw + vpmaddwd ≈ 340, and with vpsignb ≈ 220: the
// ceiling of this tile, which reaches ~175 GOP/s at m = 64. Two variants without vpsignb were
// measured and dropped: int16 operands through vpmaddwd alone (vpmovsxbw on W) ran ~20% slower,
// and xor-ing W with a precomputed sign mask of x (plus a per-group correction) ran the same.
template <int kRows>
SLUICE_AVX2 void tile_maddubs(const Tile& t) {
  const QuantView& w = *t.w;
  const __m256i ones = _mm256_set1_epi16(1);
  GroupCursor c(t, t.x->offset_sum, t.g0);
  for (int64_t g = t.g0; g < t.g1; ++g, c.next_group()) {
    const int8_t* wp = block_group(w, t.block, g);
    const int8_t* xq = t.x->q + t.row * w.k + g * w.group_size;
    const uint8_t* xa = t.x->abs + t.row * w.k + g * w.group_size;
    __m256i d[kRows][2];
    for (int i = 0; i < kRows; ++i) d[i][0] = d[i][1] = _mm256_setzero_si256();
    for (int64_t p = 0; p < w.group_size; p += 4, wp += 4 * kInt8BlockRows) {
      prefetch_ahead(wp);
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32));
      for (int i = 0; i < kRows; ++i) {
        const __m256i xs = broadcast_quad(xq + i * w.k + p);
        const __m256i xabs = broadcast_quad(xa + i * w.k + p);
        const __m256i p0 = _mm256_maddubs_epi16(xabs, _mm256_sign_epi8(w0, xs));
        const __m256i p1 = _mm256_maddubs_epi16(xabs, _mm256_sign_epi8(w1, xs));
        d[i][0] = _mm256_add_epi32(d[i][0], _mm256_madd_epi16(p0, ones));
        d[i][1] = _mm256_add_epi32(d[i][1], _mm256_madd_epi16(p1, ones));
      }
    }
    fold_group(c, t.acc, t.ldacc, d);
  }
}

// vpdpbusd also multiplies unsigned by signed bytes but sums four products straight into int32,
// so the offset trick is exact: w xor 0x80 is w + 128 as an unsigned byte, Σ(w + 128)·x =
// Σw·x + 128·Σx, and the accumulator starts at -128·Σx of the row's group (offset_sum). One
// instruction per 8 rows × 4 k, and the xor is shared by every row of the tile.
template <int kRows>
SLUICE_AVX2_VNNI void tile_avx_vnni(const Tile& t) {
  const QuantView& w = *t.w;
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  GroupCursor c(t, t.x->offset_sum, t.g0);
  for (int64_t g = t.g0; g < t.g1; ++g, c.next_group()) {
    const int8_t* wp = block_group(w, t.block, g);
    const int8_t* xq = t.x->q + t.row * w.k + g * w.group_size;
    __m256i d[kRows][2];
    start_group(c, d);
    for (int64_t p = 0; p < w.group_size; p += 4, wp += 4 * kInt8BlockRows) {
      const __m256i w0 =
          _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(wp)), bias);
      const __m256i w1 =
          _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32)), bias);
      for (int i = 0; i < kRows; ++i) {
        const __m256i xs = broadcast_quad(xq + i * w.k + p);
        d[i][0] = _mm256_dpbusd_avx_epi32(d[i][0], w0, xs);
        d[i][1] = _mm256_dpbusd_avx_epi32(d[i][1], w1, xs);
      }
    }
    fold_group(c, t.acc, t.ldacc, d);
  }
}

// int4 (gemm_int8.h): the nibbles u = q + 8 are the unsigned operand, so neither vpsignb nor the
// xor is needed, and the group's sum starts at -8·Σx (offset_sum4). One 64-byte line holds two
// k-quads of 16 rows; u & 15 is the quad at p, u >> 4 the quad at p + 4. With u ≤ 15 a
// vpmaddubsw pair sum is at most 2·15·127 = 3810, so the two quads' int16 sums add without
// overflow before one vpmaddwd.
template <int kRows>
SLUICE_AVX2 void tile4_maddubs(const Tile& t) {
  const QuantView& w = *t.w;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(15);
  GroupCursor c(t, t.x->offset_sum4, t.g0);
  for (int64_t g = t.g0; g < t.g1; ++g, c.next_group()) {
    const uint8_t* wp = block_group4(w, t.block, g);
    const int8_t* xq = t.x->q + t.row * w.k + g * w.group_size;
    __m256i d[kRows][2];
    start_group(c, d);
    for (int64_t p = 0; p < w.group_size; p += 8, wp += 4 * kInt8BlockRows) {
      prefetch_ahead(wp);
      const __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp));
      const __m256i v1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32));
      const __m256i lo0 = _mm256_and_si256(v0, low),
                    hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
      const __m256i lo1 = _mm256_and_si256(v1, low),
                    hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
      for (int i = 0; i < kRows; ++i) {
        const __m256i xl = broadcast_quad(xq + i * w.k + p);
        const __m256i xh = broadcast_quad(xq + i * w.k + p + 4);
        const __m256i p0 =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo0, xl), _mm256_maddubs_epi16(hi0, xh));
        const __m256i p1 =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo1, xl), _mm256_maddubs_epi16(hi1, xh));
        d[i][0] = _mm256_add_epi32(d[i][0], _mm256_madd_epi16(p0, ones));
        d[i][1] = _mm256_add_epi32(d[i][1], _mm256_madd_epi16(p1, ones));
      }
    }
    fold_group(c, t.acc, t.ldacc, d);
  }
}

// int4 with AVX-VNNI: vpdpbusd on the unpacked nibbles, two per 64-byte line and row half.
template <int kRows>
SLUICE_AVX2_VNNI void tile4_avx_vnni(const Tile& t) {
  const QuantView& w = *t.w;
  const __m256i low = _mm256_set1_epi8(15);
  GroupCursor c(t, t.x->offset_sum4, t.g0);
  for (int64_t g = t.g0; g < t.g1; ++g, c.next_group()) {
    const uint8_t* wp = block_group4(w, t.block, g);
    const int8_t* xq = t.x->q + t.row * w.k + g * w.group_size;
    __m256i d[kRows][2];
    start_group(c, d);
    for (int64_t p = 0; p < w.group_size; p += 8, wp += 4 * kInt8BlockRows) {
      const __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp));
      const __m256i v1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32));
      const __m256i lo0 = _mm256_and_si256(v0, low),
                    hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
      const __m256i lo1 = _mm256_and_si256(v1, low),
                    hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
      for (int i = 0; i < kRows; ++i) {
        const __m256i xl = broadcast_quad(xq + i * w.k + p);
        const __m256i xh = broadcast_quad(xq + i * w.k + p + 4);
        d[i][0] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(d[i][0], lo0, xl), hi0, xh);
        d[i][1] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(d[i][1], lo1, xl), hi1, xh);
      }
    }
    fold_group(c, t.acc, t.ldacc, d);
  }
}

SLUICE_AVX2 void store_avx2(const float* acc, int64_t ldacc, int64_t rows, int64_t cols, float* y,
                            int64_t ldy, float beta) {
  const __m256 b = _mm256_set1_ps(beta);
  for (int64_t i = 0; i < rows; ++i, acc += ldacc, y += ldy) {
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const __m256 v = _mm256_loadu_ps(acc + c);
      _mm256_storeu_ps(y + c, beta == 0.0f ? v : _mm256_fmadd_ps(b, _mm256_loadu_ps(y + c), v));
    }
    for (; c < cols; ++c) y[c] = beta == 0.0f ? acc[c] : std::fma(beta, y[c], acc[c]);
  }
}

}  // namespace

Kernels kernels_avx2_maddubs() {
  return {.tile = {tile_maddubs<1>, tile_maddubs<2>, tile_maddubs<3>, tile_maddubs<4>},
          .tile4 = {tile4_maddubs<1>, tile4_maddubs<2>, tile4_maddubs<3>, tile4_maddubs<4>},
          .store = store_avx2};
}

Kernels kernels_avx_vnni() {
  return {.tile = {tile_avx_vnni<1>, tile_avx_vnni<2>, tile_avx_vnni<3>, tile_avx_vnni<4>},
          .tile4 = {tile4_avx_vnni<1>, tile4_avx_vnni<2>, tile4_avx_vnni<3>, tile4_avx_vnni<4>},
          .store = store_avx2};
}

}  // namespace sluice::cpu::int8
