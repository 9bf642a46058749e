// The AVX2 tiles (256-bit FMA; AVX2 has no bf16 instruction, so weights are widened to fp32).
//
// Per group of 16 k-values a tile of MR × NR issues NR 256-bit weight loads, NR shifts and NR
// blends (the widening), 2·MR activation loads and 2·MR·NR FMAs. At 4 × 3 that is 24 FMAs to 14
// loads and 6 integer ops: with two FMA pipes and two 256-bit load ports the FMAs are the bound,
// and 12 accumulators, each updated twice per group, cover the FMA latency.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/gemm_tiles.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"

namespace sluice::cpu::tiles {
namespace {

// Keeps an activation in a register for the NR FMAs that use it. Left alone, GCC folds the load
// into each FMA as a memory operand, which issues NR loads where one will do, and the tile
// becomes bound by the load ports instead of the FMA pipes.
SLUICE_AVX2 inline __m256 in_register(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

// One group: the even weights (low halves, shifted up) against the first 8 packed activations,
// then the odd ones against the next 8. The odd ones are the raw weights with their low halves
// replaced by the zeros of the shifted even ones (a blend, which needs no mask register: with
// MR × NR accumulators, NR widened weights and one activation, 4 × 3 uses all 16 registers).
template <int MR, int NR>
SLUICE_AVX2 inline void group(__m256 (&acc)[MR][NR], const float* x, int64_t ldx,
                              const uint16_t* const (&w)[NR]) {
  __m256i wide[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j)
    wide[j] = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j])), 16);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = in_register(_mm256_load_ps(x + i * ldx));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      acc[i][j] = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(wide[j]), acc[i][j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j)
    wide[j] = _mm256_blend_epi16(wide[j],
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j])), 0xAA);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = in_register(_mm256_load_ps(x + i * ldx + kGroup / 2));
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      acc[i][j] = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(wide[j]), acc[i][j]);
  }
}

// The full 4 × 3 tile's loop over whole groups, with the registers laid out by hand
// (accumulators in ymm0-11, widened weights in ymm12-14, the activation in ymm15). GCC, given the
// same loop as intrinsics, spills accumulators once the 12 of them, 3 weights and the activation
// need all 16 registers, and the stack round trips lengthen every accumulator's chain: on an EPYC
// (AVX2 only) the intrinsics tile ran at ≈ 40% of the FMA rate of the same core, this one at
// ≈ 55% (both in L1, measured in CPU time on a busy machine; bench/RESULTS.md has the figures on
// a quiet one). Per group: 3 loads and shifts, 3 blends with a memory operand, 8 activation
// loads, 24 FMAs, and one prefetch per W row at `pf` (see prefetch_from). Spread one per group
// through the loop instead of issued in rounds of 24 lines every 16 groups (prefetch_w), they
// took m = 4 (n = 14336, k = 4096, 2 Milan cores at the avx2 level) from 4.08–4.22 ms to
// 3.63–3.84 ms, three interleaved runs of each on 2026-12-05 (bench/RESULTS.md).
SLUICE_AVX2 void groups_4x3(__m256 (&acc)[4][3], const float* x, int64_t ldx, const uint16_t* w,
                            int64_t ldw, int64_t groups, const uint16_t* pf) {
  const int64_t ldx_bytes = ldx * int64_t(sizeof(float));
  const int64_t ldw_bytes = ldw * int64_t(sizeof(uint16_t));
  const int64_t ldx3_bytes = 3 * ldx_bytes;
  __asm__ volatile(
      "vmovaps 0(%[acc]), %%ymm0\n\t"
      "vmovaps 32(%[acc]), %%ymm1\n\t"
      "vmovaps 64(%[acc]), %%ymm2\n\t"
      "vmovaps 96(%[acc]), %%ymm3\n\t"
      "vmovaps 128(%[acc]), %%ymm4\n\t"
      "vmovaps 160(%[acc]), %%ymm5\n\t"
      "vmovaps 192(%[acc]), %%ymm6\n\t"
      "vmovaps 224(%[acc]), %%ymm7\n\t"
      "vmovaps 256(%[acc]), %%ymm8\n\t"
      "vmovaps 288(%[acc]), %%ymm9\n\t"
      "vmovaps 320(%[acc]), %%ymm10\n\t"
      "vmovaps 352(%[acc]), %%ymm11\n\t"
      "1:\n\t"
      "prefetcht0 (%[pf])\n\t"
      "prefetcht0 (%[pf],%[ldw],1)\n\t"
      "prefetcht0 (%[pf],%[ldw],2)\n\t"
      "vmovdqu (%[w]), %%ymm12\n\t"
      "vmovdqu (%[w],%[ldw],1), %%ymm13\n\t"
      "vmovdqu (%[w],%[ldw],2), %%ymm14\n\t"
      "vpslld $16, %%ymm12, %%ymm12\n\t"
      "vpslld $16, %%ymm13, %%ymm13\n\t"
      "vpslld $16, %%ymm14, %%ymm14\n\t"
      "vmovaps (%[x]), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm0\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm1\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
      "vmovaps (%[x],%[ldx],1), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm3\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm4\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
      "vmovaps (%[x],%[ldx],2), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
      "vmovaps (%[x],%[ldx3],1), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm9\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm10\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"
      "vpblendw $0xaa, (%[w]), %%ymm12, %%ymm12\n\t"
      "vpblendw $0xaa, (%[w],%[ldw],1), %%ymm13, %%ymm13\n\t"
      "vpblendw $0xaa, (%[w],%[ldw],2), %%ymm14, %%ymm14\n\t"
      "vmovaps 32(%[x]), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm0\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm1\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
      "vmovaps 32(%[x],%[ldx],1), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm3\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm4\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
      "vmovaps 32(%[x],%[ldx],2), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
      "vmovaps 32(%[x],%[ldx3],1), %%ymm15\n\t"
      "vfmadd231ps %%ymm12, %%ymm15, %%ymm9\n\t"
      "vfmadd231ps %%ymm13, %%ymm15, %%ymm10\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"
      "add $32, %[w]\n\t"
      "add $32, %[pf]\n\t"
      "add $64, %[x]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vmovaps %%ymm0, 0(%[acc])\n\t"
      "vmovaps %%ymm1, 32(%[acc])\n\t"
      "vmovaps %%ymm2, 64(%[acc])\n\t"
      "vmovaps %%ymm3, 96(%[acc])\n\t"
      "vmovaps %%ymm4, 128(%[acc])\n\t"
      "vmovaps %%ymm5, 160(%[acc])\n\t"
      "vmovaps %%ymm6, 192(%[acc])\n\t"
      "vmovaps %%ymm7, 224(%[acc])\n\t"
      "vmovaps %%ymm8, 256(%[acc])\n\t"
      "vmovaps %%ymm9, 288(%[acc])\n\t"
      "vmovaps %%ymm10, 320(%[acc])\n\t"
      "vmovaps %%ymm11, 352(%[acc])\n\t"
      : [w] "+r"(w), [x] "+r"(x), [n] "+r"(groups), [pf] "+r"(pf)
      : [acc] "r"(&acc[0][0]), [ldw] "r"(ldw_bytes), [ldx] "r"(ldx_bytes), [ldx3] "r"(ldx3_bytes)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
}

// How far ahead of its loads a tile that neither streams nor fetches the next block prefetches
// its own W rows, which the block before brought into L2: 4 lines.
constexpr int64_t kFromL2Ahead = 128;

// Where the 4 × 3 loop prefetches W from, for groups starting at `p`: a streaming tile
// kPrefetchAhead values ahead on its rows, or, past their end, on the next tile's (the rows after
// them); the others the next block (TileJob::next_block) or their own rows just ahead.
inline const uint16_t* prefetch_from(const TileJob& job, int64_t p) {
  if (!job.stream) return job.next_block ? job.next_block + (p - job.k0) : job.w + p + kFromL2Ahead;
  const int64_t at = p + kPrefetchAhead;
  return at < job.k ? job.w + at : job.w + 3 * job.ldw + (at - job.k);
}

// The tiles whose group loop issues its own prefetches (groups_4x3).
template <int MR, int NR>
constexpr bool kPrefetchesInLoop = MR == 4 && NR == 3;

// Whole groups [p, end) of the tile.
template <int MR, int NR>
SLUICE_AVX2 inline void groups(__m256 (&acc)[MR][NR], const TileJob& job, int64_t p, int64_t end) {
  if constexpr (kPrefetchesInLoop<MR, NR>) {
    groups_4x3(acc, job.x + p, job.ldx, job.w + p, job.ldw, (end - p) / kGroup,
               prefetch_from(job, p));
  } else {
    for (; p < end; p += kGroup) {
      if (job.next_block) {  // one line per W row per group, as groups_4x3 does
        const uint16_t* pf = prefetch_from(job, p);
        for (int j = 0; j < NR; ++j) __asm__ volatile("prefetcht0 (%0)" : : "r"(pf + j * job.ldw));
      }
      const uint16_t* w[NR];
      for (int j = 0; j < NR; ++j) w[j] = job.w + j * job.ldw + p;
      group<MR, NR>(acc, job.x + p, job.ldx, w);
    }
  }
}

template <int MR, int NR>
SLUICE_AVX2 void tile(const TileJob& job) {
  __m256 acc[MR][NR];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  const int64_t full_end = job.k1 < job.k ? job.k1 : job.k - job.k % kGroup;
  int64_t p = job.k0;
  while (p < full_end) {
    const int64_t end = job.stream ? std::min(full_end, p + kPrefetchChunk) : full_end;
    if (job.stream && !kPrefetchesInLoop<MR, NR>) prefetch_w(job, NR, p + kPrefetchAhead);
    groups<MR, NR>(acc, job, p, end);
    p = end;
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
    for (int j = 0; j < NR; ++j) store_sum(job, i, j, avx2::reduce_add(acc[i][j]));
}

template <int MR, int NR>
struct Tile {
  static constexpr TileFn fn = &tile<MR, NR>;
};

}  // namespace

TileFn avx2_tile(int rows, int cols) {
  static constexpr auto table = make_tile_table<Tile>();
  return table[rows - 1][cols - 1];
}

}  // namespace sluice::cpu::tiles
