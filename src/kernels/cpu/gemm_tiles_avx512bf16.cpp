// The AVX512-BF16 tiles: `vdpbf16ps` multiplies 16 pairs of bf16 and adds each pair's two products
// to an fp32 lane, so neither the weights nor the activations are widened. X is packed as bf16 in
// its natural order (gemm_tiles.h, kBf16Group values per group), W is read where it lies.
//
// Per group of 32 k-values a 4 × 3 tile issues 3 weight loads, 4 activation loads and 12
// `vdpbf16ps` (6 cycles on two pipes), and 12 accumulators cover the instruction's latency.
// Tried and not kept (2 Zen 4 cores, n = 14336, k = 4096, 2026-12-07): tiles of up to 8 rows × 3
// (24 accumulators, W reused by twice the rows): m = 6 and 8 slower (3.2–3.7 → 4.7–5.2 ms), m = 12
// and 16 the same. From m = 13 the token lanes of gemm_lanes.h take over, and up to m = 4 their
// leftover tiles, which stream W from DRAM faster than these did with prefetches spread through
// the loop (73–78% of the paired read at m = 4 on 2 Zen 4 cores, against 79–88%): these tiles see
// 5 to 12 rows, and a block of W in L2.
#include <immintrin.h>

#include "kernels/cpu/gemm_tiles.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx512.h"  // also silences GCC 12's false warning in the intrinsics

namespace sluice::cpu::tiles {
namespace {

template <int MR, int NR>
SLUICE_AVX512_BF16 inline void group(__m512 (&acc)[MR][NR], const uint16_t* x, int64_t ldx,
                                     const uint16_t* const (&w)[NR]) {
  __m512i wv[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_si512(w[j]);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m512i xv = _mm512_load_si512(x + i * ldx);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
  }
}

template <int MR, int NR>
SLUICE_AVX512_BF16 void tile(const TileJob& job) {
  __m512 acc[MR][NR];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const int64_t full_end = job.k1 < job.k ? job.k1 : job.k - job.k % kBf16Group;
  int64_t p = job.k0;
  for (; p < full_end; p += kBf16Group) {
    const uint16_t* w[NR];
    for (int j = 0; j < NR; ++j) w[j] = job.w + j * job.ldw + p;
    group<MR, NR>(acc, job.xb + p, job.ldx, w);
  }
  if (p < job.k1) {  // the last group runs past k
    alignas(64) uint16_t tail[NR][kBf16Group];
    const uint16_t* w[NR];
    for (int j = 0; j < NR; ++j) {
      copy_tail_group(job.w + j * job.ldw + p, job.k - p, tail[j], kBf16Group);
      w[j] = tail[j];
    }
    group<MR, NR>(acc, job.xb + p, job.ldx, w);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) store_sum(job, i, j, _mm512_reduce_add_ps(acc[i][j]));
}

template <int MR, int NR>
struct Tile {
  static constexpr TileFn fn = &tile<MR, NR>;
};

}  // namespace

TileFn avx512bf16_tile(int rows, int cols) {
  static constexpr auto table = make_tile_table<Tile>();
  return table[rows - 1][cols - 1];
}

}  // namespace sluice::cpu::tiles
