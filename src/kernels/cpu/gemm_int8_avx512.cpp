// The int8 GEMM tiles of the avx512 levels (and of amx, which has no tile kernel yet):
// AVX512-VNNI vpdpbusd on one 64-byte line of a packed block, 4 k of all 16 rows, so each
// row of X keeps one zmm of int32 lanes per block, one per column; a tile takes up to 4 blocks.
// Same offset trick and same fp32 fold as the AVX-VNNI tile in gemm_int8_avx2.cpp.
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

// acc (fp32 in memory, row stride ldacc) = fma(float(d), sx · sw, acc) for each row and block
// of the finished group at c: once per group, so the int32 sums stay in registers through it.
template <int kRows, int kBlocks>
SLUICE_AVX512 inline void fold_group(const GroupCursor& c, float* acc, int64_t ldacc,
                                     const __m512i (&d)[kRows][kBlocks]) {
  for (int b = 0; b < kBlocks; ++b) {
    const __m512 sw = _mm512_loadu_ps(c.sw + b * c.sw_stride);
    for (int i = 0; i < kRows; ++i) {
      const __m512 sx = _mm512_set1_ps(c.sx[i * c.groups]);
      float* a = acc + i * ldacc + b * kInt8BlockRows;
      _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i][b]), _mm512_mul_ps(sx, sw),
                                          _mm512_loadu_ps(a)));
    }
  }
}

// The group's int32 sums start at the row's offset (the correction of the unsigned operand below).
template <int kRows, int kBlocks>
SLUICE_AVX512 inline void start_group(const GroupCursor& c, __m512i (&d)[kRows][kBlocks]) {
  for (int i = 0; i < kRows; ++i) {
    const __m512i o = _mm512_set1_epi32(c.offset[i * c.groups]);
    for (int b = 0; b < kBlocks; ++b) d[i][b] = o;
  }
}

// The hand-laid tiles' 16 int32 sums: loaded from the array `d` into zmm0-15 before the loop,
// stored back after it.
#define SLUICE_LOAD_SUMS \
  "vmovdqa64 0(%[d]), %%zmm0\n\t" \
  "vmovdqa64 64(%[d]), %%zmm1\n\t" \
  "vmovdqa64 128(%[d]), %%zmm2\n\t" \
  "vmovdqa64 192(%[d]), %%zmm3\n\t" \
  "vmovdqa64 256(%[d]), %%zmm4\n\t" \
  "vmovdqa64 320(%[d]), %%zmm5\n\t" \
  "vmovdqa64 384(%[d]), %%zmm6\n\t" \
  "vmovdqa64 448(%[d]), %%zmm7\n\t" \
  "vmovdqa64 512(%[d]), %%zmm8\n\t" \
  "vmovdqa64 576(%[d]), %%zmm9\n\t" \
  "vmovdqa64 640(%[d]), %%zmm10\n\t" \
  "vmovdqa64 704(%[d]), %%zmm11\n\t" \
  "vmovdqa64 768(%[d]), %%zmm12\n\t" \
  "vmovdqa64 832(%[d]), %%zmm13\n\t" \
  "vmovdqa64 896(%[d]), %%zmm14\n\t" \
  "vmovdqa64 960(%[d]), %%zmm15\n\t"
#define SLUICE_STORE_SUMS \
  "vmovdqa64 %%zmm0, 0(%[d])\n\t" \
  "vmovdqa64 %%zmm1, 64(%[d])\n\t" \
  "vmovdqa64 %%zmm2, 128(%[d])\n\t" \
  "vmovdqa64 %%zmm3, 192(%[d])\n\t" \
  "vmovdqa64 %%zmm4, 256(%[d])\n\t" \
  "vmovdqa64 %%zmm5, 320(%[d])\n\t" \
  "vmovdqa64 %%zmm6, 384(%[d])\n\t" \
  "vmovdqa64 %%zmm7, 448(%[d])\n\t" \
  "vmovdqa64 %%zmm8, 512(%[d])\n\t" \
  "vmovdqa64 %%zmm9, 576(%[d])\n\t" \
  "vmovdqa64 %%zmm10, 640(%[d])\n\t" \
  "vmovdqa64 %%zmm11, 704(%[d])\n\t" \
  "vmovdqa64 %%zmm12, 768(%[d])\n\t" \
  "vmovdqa64 %%zmm13, 832(%[d])\n\t" \
  "vmovdqa64 %%zmm14, 896(%[d])\n\t" \
  "vmovdqa64 %%zmm15, 960(%[d])\n\t"

// One group's k-quads for the full 4 × 4 tile, registers laid out by hand: the 16 int32 sums in
// zmm0-15 (loaded from and stored back to `d`), W's 4 lines in zmm16-19, the broadcast of X in
// zmm20, the xor bias in zmm21. GCC, given the same loop as intrinsics, keeps the 4 × 4 array of
// sums partly on the stack and copies the rest between registers on every step, and the tile ran
// at 35% of the vpdpbusd peak on 2 Zen 5 cores.
SLUICE_AVX512_VNNI void quads_4x4(__m512i (&d)[4][4], const int8_t* w, int64_t block_bytes,
                                  const int8_t* x, int64_t ldx, int64_t quads) {
  const int64_t block3 = 3 * block_bytes, ldx3 = 3 * ldx;
  __asm__ volatile(
      SLUICE_LOAD_SUMS
      "mov $0x80808080, %%eax\n\t"
      "vpbroadcastd %%eax, %%zmm21\n\t"
      "1:\n\t"
      "vpxord (%[w]), %%zmm21, %%zmm16\n\t"
      "vpxord (%[w],%[bb],1), %%zmm21, %%zmm17\n\t"
      "vpxord (%[w],%[bb],2), %%zmm21, %%zmm18\n\t"
      "vpxord (%[w],%[bb3],1), %%zmm21, %%zmm19\n\t"
      "vpbroadcastd (%[x]), %%zmm20\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm0\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm1\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm2\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm3\n\t"
      "vpbroadcastd (%[x],%[ldx],1), %%zmm20\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm4\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm5\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm6\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm7\n\t"
      "vpbroadcastd (%[x],%[ldx],2), %%zmm20\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm8\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm9\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm10\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm11\n\t"
      "vpbroadcastd (%[x],%[ldx3],1), %%zmm20\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm12\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm13\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm14\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm15\n\t"
      "add $64, %[w]\n\t"
      "add $4, %[x]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      SLUICE_STORE_SUMS
      : [w] "+r"(w), [x] "+r"(x), [n] "+r"(quads)
      : [d] "r"(&d[0][0]), [bb] "r"(block_bytes), [bb3] "r"(block3), [ldx] "r"(ldx),
        [ldx3] "r"(ldx3)
      : "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19",
        "xmm20", "xmm21", "memory", "cc");
}

// The same for int4 octets: each W line unpacked into its low nibbles (zmm16-19) and high
// nibbles (zmm22-25), two broadcasts of X (zmm20 at p, zmm21 at p + 4), the nibble mask in
// zmm26.
SLUICE_AVX512_VNNI void octets_4x4(__m512i (&d)[4][4], const uint8_t* w, int64_t block_bytes,
                                   const int8_t* x, int64_t ldx, int64_t octets) {
  const int64_t block3 = 3 * block_bytes, ldx3 = 3 * ldx;
  __asm__ volatile(
      SLUICE_LOAD_SUMS
      "mov $0x0f0f0f0f, %%eax\n\t"
      "vpbroadcastd %%eax, %%zmm26\n\t"
      "1:\n\t"
      "vmovdqa64 (%[w]), %%zmm16\n\t"
      "vmovdqa64 (%[w],%[bb],1), %%zmm17\n\t"
      "vmovdqa64 (%[w],%[bb],2), %%zmm18\n\t"
      "vmovdqa64 (%[w],%[bb3],1), %%zmm19\n\t"
      "vpsrlw $4, %%zmm16, %%zmm22\n\t"
      "vpsrlw $4, %%zmm17, %%zmm23\n\t"
      "vpsrlw $4, %%zmm18, %%zmm24\n\t"
      "vpsrlw $4, %%zmm19, %%zmm25\n\t"
      "vpandd %%zmm26, %%zmm16, %%zmm16\n\t"
      "vpandd %%zmm26, %%zmm17, %%zmm17\n\t"
      "vpandd %%zmm26, %%zmm18, %%zmm18\n\t"
      "vpandd %%zmm26, %%zmm19, %%zmm19\n\t"
      "vpandd %%zmm26, %%zmm22, %%zmm22\n\t"
      "vpandd %%zmm26, %%zmm23, %%zmm23\n\t"
      "vpandd %%zmm26, %%zmm24, %%zmm24\n\t"
      "vpandd %%zmm26, %%zmm25, %%zmm25\n\t"
      "vpbroadcastd (%[x]), %%zmm20\n\t"
      "vpbroadcastd 4(%[x]), %%zmm21\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm0\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm1\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm2\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm3\n\t"
      "vpdpbusd %%zmm21, %%zmm22, %%zmm0\n\t"
      "vpdpbusd %%zmm21, %%zmm23, %%zmm1\n\t"
      "vpdpbusd %%zmm21, %%zmm24, %%zmm2\n\t"
      "vpdpbusd %%zmm21, %%zmm25, %%zmm3\n\t"
      "vpbroadcastd (%[x],%[ldx],1), %%zmm20\n\t"
      "vpbroadcastd 4(%[x],%[ldx],1), %%zmm21\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm4\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm5\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm6\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm7\n\t"
      "vpdpbusd %%zmm21, %%zmm22, %%zmm4\n\t"
      "vpdpbusd %%zmm21, %%zmm23, %%zmm5\n\t"
      "vpdpbusd %%zmm21, %%zmm24, %%zmm6\n\t"
      "vpdpbusd %%zmm21, %%zmm25, %%zmm7\n\t"
      "vpbroadcastd (%[x],%[ldx],2), %%zmm20\n\t"
      "vpbroadcastd 4(%[x],%[ldx],2), %%zmm21\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm8\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm9\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm10\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm11\n\t"
      "vpdpbusd %%zmm21, %%zmm22, %%zmm8\n\t"
      "vpdpbusd %%zmm21, %%zmm23, %%zmm9\n\t"
      "vpdpbusd %%zmm21, %%zmm24, %%zmm10\n\t"
      "vpdpbusd %%zmm21, %%zmm25, %%zmm11\n\t"
      "vpbroadcastd (%[x],%[ldx3],1), %%zmm20\n\t"
      "vpbroadcastd 4(%[x],%[ldx3],1), %%zmm21\n\t"
      "vpdpbusd %%zmm20, %%zmm16, %%zmm12\n\t"
      "vpdpbusd %%zmm20, %%zmm17, %%zmm13\n\t"
      "vpdpbusd %%zmm20, %%zmm18, %%zmm14\n\t"
      "vpdpbusd %%zmm20, %%zmm19, %%zmm15\n\t"
      "vpdpbusd %%zmm21, %%zmm22, %%zmm12\n\t"
      "vpdpbusd %%zmm21, %%zmm23, %%zmm13\n\t"
      "vpdpbusd %%zmm21, %%zmm24, %%zmm14\n\t"
      "vpdpbusd %%zmm21, %%zmm25, %%zmm15\n\t"
      "add $64, %[w]\n\t"
      "add $8, %[x]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      SLUICE_STORE_SUMS
      : [w] "+r"(w), [x] "+r"(x), [n] "+r"(octets)
      : [d] "r"(&d[0][0]), [bb] "r"(block_bytes), [bb3] "r"(block3), [ldx] "r"(ldx),
        [ldx3] "r"(ldx3)
      : "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19",
        "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "memory", "cc");
}

// w xor 0x80 is w + 128 as an unsigned byte; the accumulator starts at -128·Σx of the row's
// group (offset_sum), so after the group it holds Σw·x exactly (|Σ| < 2²⁵, no overflow).
//
// vpdpbusd has a latency of several cycles and two pipes: one int32 accumulator per row (4 at
// 4 rows) keeps a fraction of them busy; kBlocks blocks side by side give kRows × kBlocks
// independent sums (16 at 4 × 4), and each broadcast of X feeds kBlocks instructions. Per k-quad
// at 4 × 4: 4 loads and xors of W, 4 broadcasts, 16 vpdpbusd, in 22 of the 32 zmm registers.
template <int kRows, int kBlocks>
SLUICE_AVX512_VNNI void tile_avx512_vnni(const Tile& t) {
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const int64_t k = t.w->k, group_size = t.w->group_size, block_stride = k * kInt8BlockRows;
  const int8_t* wg = block_group(*t.w, t.block, t.g0);
  const int8_t* xg = t.x->q + t.row * k + t.g0 * group_size;
  GroupCursor c(t, t.x->offset_sum, t.g0);
  for (int64_t g = t.g0; g < t.g1;
       ++g, wg += group_size * kInt8BlockRows, xg += group_size, c.next_group()) {
    alignas(64) __m512i d[kRows][kBlocks];
    start_group(c, d);
    if constexpr (kRows == 4 && kBlocks == 4) {
      quads_4x4(d, wg, block_stride, xg, k, group_size / 4);
    } else {
      const int8_t* wp = wg;
      for (int64_t p = 0; p < group_size; p += 4, wp += 4 * kInt8BlockRows) {
        __m512i wv[kBlocks];
        for (int b = 0; b < kBlocks; ++b)
          wv[b] = _mm512_xor_si512(_mm512_load_si512(wp + b * block_stride), bias);
        for (int i = 0; i < kRows; ++i) {
          const __m512i xv = broadcast_quad(xg + i * k + p);
          for (int b = 0; b < kBlocks; ++b) d[i][b] = _mm512_dpbusd_epi32(d[i][b], wv[b], xv);
        }
      }
    }
    fold_group(c, t.acc, t.ldacc, d);
  }
}

// int4 (gemm_int8.h): one 64-byte line holds two k-quads of the 16 rows as nibbles u = q + 8;
// u & 15 (the quad at p) and u >> 4 (the quad at p + 4) are vpdpbusd's unsigned operands, and
// the group's sum starts at -8·Σx (offset_sum4). At 4 × 4: 8 unpacked lines, 16 sums, 2
// broadcasts and the mask, 27 registers.
template <int kRows, int kBlocks>
SLUICE_AVX512_VNNI void tile4_avx512_vnni(const Tile& t) {
  const __m512i low = _mm512_set1_epi8(15);
  const int64_t k = t.w->k, group_size = t.w->group_size, block_stride = k * kInt8BlockRows / 2;
  const uint8_t* wg = block_group4(*t.w, t.block, t.g0);
  const int8_t* xg = t.x->q + t.row * k + t.g0 * group_size;
  GroupCursor c(t, t.x->offset_sum4, t.g0);
  for (int64_t g = t.g0; g < t.g1;
       ++g, wg += group_size * kInt8BlockRows / 2, xg += group_size, c.next_group()) {
    alignas(64) __m512i d[kRows][kBlocks];
    start_group(c, d);
    if constexpr (kRows == 4 && kBlocks == 4) {
      octets_4x4(d, wg, block_stride, xg, k, group_size / 8);
    } else {
      const uint8_t* wp = wg;
      for (int64_t p = 0; p < group_size; p += 8, wp += 4 * kInt8BlockRows) {
        __m512i lo[kBlocks], hi[kBlocks];
        for (int b = 0; b < kBlocks; ++b) {
          const __m512i v = _mm512_load_si512(wp + b * block_stride);
          lo[b] = _mm512_and_si512(v, low);
          hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        for (int i = 0; i < kRows; ++i) {
          const __m512i x0 = broadcast_quad(xg + i * k + p);
          const __m512i x1 = broadcast_quad(xg + i * k + p + 4);
          for (int b = 0; b < kBlocks; ++b) {
            d[i][b] = _mm512_dpbusd_epi32(d[i][b], lo[b], x0);
            d[i][b] = _mm512_dpbusd_epi32(d[i][b], hi[b], x1);
          }
        }
      }
    }
    fold_group(c, t.acc, t.ldacc, d);
  }
}

// The tile of kRows rows for the call's number of blocks.
template <int kRows, template <int, int> class Fn>
SLUICE_AVX512 void tile_for_blocks(const Tile& t) {
  switch (t.blocks) {
    case 1:
      return Fn<kRows, 1>::run(t);
    case 2:
      return Fn<kRows, 2>::run(t);
    case 3:
      return Fn<kRows, 3>::run(t);
    default:
      return Fn<kRows, 4>::run(t);
  }
}
template <int kRows, int kBlocks>
struct Int8Tile {
  static void run(const Tile& t) { tile_avx512_vnni<kRows, kBlocks>(t); }
};
template <int kRows, int kBlocks>
struct Int4Tile {
  static void run(const Tile& t) { tile4_avx512_vnni<kRows, kBlocks>(t); }
};

SLUICE_AVX512 void store_avx512(const float* acc, int64_t ldacc, int64_t rows, int64_t cols,
                                float* y, int64_t ldy, float beta) {
  const __m512 b = _mm512_set1_ps(beta);
  const __mmask16 mask = cols >= 16 ? __mmask16(0xffff) : avx512::tail_mask(int(cols));
  for (int64_t i = 0; i < rows; ++i, acc += ldacc, y += ldy) {
    const __m512 v = _mm512_loadu_ps(acc);
    _mm512_mask_storeu_ps(y, mask,
                          beta == 0.0f ? v : _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(mask, y), v));
  }
}

}  // namespace

Kernels kernels_avx512_vnni() {
  return {.tile = {tile_for_blocks<1, Int8Tile>, tile_for_blocks<2, Int8Tile>,
                   tile_for_blocks<3, Int8Tile>, tile_for_blocks<4, Int8Tile>},
          .tile4 = {tile_for_blocks<1, Int4Tile>, tile_for_blocks<2, Int4Tile>,
                    tile_for_blocks<3, Int4Tile>, tile_for_blocks<4, Int4Tile>},
          .store = store_avx512,
          .max_blocks = kMaxTileBlocks};
}

}  // namespace sluice::cpu::int8
