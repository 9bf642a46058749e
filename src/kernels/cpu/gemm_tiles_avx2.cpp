// The AVX2 tiles (256-bit FMA; AVX2 has no bf16 instruction, so weights are widened to fp32).
//
// Per group of 16 k-values a tile of MR × NR issues NR 256-bit weight loads, NR shifts and NR
// ANDs (the widening), 2·MR activation loads and 2·MR·NR FMAs. At 4 × 3 that is 24 FMAs to 14
// loads and 6 integer ops: with two FMA pipes and two 256-bit load ports the FMAs are the bound,
// and 12 accumulators cover the FMA latency.
#include <immintrin.h>

#include <array>

#include "kernels/cpu/gemm_tiles.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu::tiles {
namespace {

SLUICE_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One group: the even weights (low halves, shifted up) against the first 8 packed activations,
// then the odd ones (high halves, masked) against the next 8.
template <int MR, int NR>
SLUICE_AVX2 inline void group(__m256 (&acc)[MR][NR], const float* x, int64_t ldx,
                              const uint16_t* const (&w)[NR]) {
  const __m256i high_half = _mm256_set1_epi32(int(0xFFFF0000u));
  __m256 wide[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j)
    wide[j] = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j])), 16));
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = _mm256_load_ps(x + i * ldx);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wide[j], acc[i][j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j)
    wide[j] = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j])), high_half));
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = _mm256_load_ps(x + i * ldx + kGroup / 2);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wide[j], acc[i][j]);
  }
}

template <int MR, int NR>
SLUICE_AVX2 void tile(const TileJob& job) {
  __m256 acc[MR][NR];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  const int64_t full_end = job.k1 < job.k ? job.k1 : job.k - job.k % kGroup;
  int64_t p = job.k0;
  for (; p < full_end; p += kGroup) {
    const uint16_t* w[NR];
    for (int j = 0; j < NR; ++j) w[j] = job.w + j * job.ldw + p;
    group<MR, NR>(acc, job.x + p, job.ldx, w);
  }
  if (p < job.k1) {  // the last group runs past k
    alignas(32) uint16_t tail[NR][kGroup];
    const uint16_t* w[NR];
    for (int j = 0; j < NR; ++j) {
      copy_tail_group(job.w + j * job.ldw + p, job.k - p, tail[j]);
      w[j] = tail[j];
    }
    group<MR, NR>(acc, job.x + p, job.ldx, w);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) store_sum(job, i, j, horizontal_sum(acc[i][j]));
}

template <int MR, int... NR>
constexpr std::array<TileFn, sizeof...(NR)> row_of_tiles(std::integer_sequence<int, NR...>) {
  return {&tile<MR, NR + 1>...};
}

}  // namespace

TileFn avx2_tile(int rows, int cols) {
  using Cols = std::make_integer_sequence<int, kMaxCols>;
  static constexpr std::array<std::array<TileFn, kMaxCols>, kMaxRows> table = {
      row_of_tiles<1>(Cols{}), row_of_tiles<2>(Cols{}), row_of_tiles<3>(Cols{}),
      row_of_tiles<4>(Cols{})};
  return table[rows - 1][cols - 1];
}

}  // namespace sluice::cpu::tiles
