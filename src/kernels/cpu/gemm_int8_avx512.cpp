// The int8 GEMM tiles of the avx512 levels (and of amx, which has no tile kernel yet):
// AVX512-VNNI vpdpbusd on one 64-byte line of a packed block, 4 k of all 16 rows, so each
// row of X keeps one zmm of int32 lanes per block, one per column; a tile takes up to 4 blocks.
// Same offset trick and same fp32 fold as the AVX-VNNI tile in gemm_int8_avx2.cpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
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

// The hand-laid 4 × 4 tiles below keep their 16 int32 sums in zmm0-15 (row i, block b in
// zmm(4i + b)) from the start of a group to its fold, so they never leave the registers. GCC,
// given the same loops as intrinsics, keeps the 4 × 4 array of sums partly on the stack and
// copies the rest between registers on every step (the tile ran at 35% of the vpdpbusd peak on
// 2 Zen 5 cores); with the sums stored after each group and folded in C++, the fold took ~25% of
// the tile's time on 2 Zen 4 cores.

// What the fused loops read for one group besides W and X, side by side: W's scales of the 4
// blocks, and X's scales and offset sums of the 4 rows.
struct alignas(64) GroupParams {
  float sw[4][kInt8BlockRows];
  float sx[4];
  int32_t offset[4];
};
// The loops address its fields by these offsets.
static_assert(offsetof(GroupParams, sx) == 256 && offsetof(GroupParams, offset) == 272 &&
              sizeof(GroupParams) == 320);
// Groups one call of a fused loop takes at most (a sweep is 1024 / (group · 4) groups of a
// 4-block tile: 2 at group 128).
constexpr int64_t kFusedGroups = 8;

// The hand-laid loops keep one instruction a line.
// clang-format off
// Starts the group's sums at its rows' offsets (GroupParams at %[p]).
#define SLUICE_START_SUMS              \
  "vpbroadcastd 272(%[p]), %%zmm0\n\t" \
  "vpbroadcastd 276(%[p]), %%zmm4\n\t" \
  "vpbroadcastd 280(%[p]), %%zmm8\n\t" \
  "vpbroadcastd 284(%[p]), %%zmm12\n\t"\
  "vmovdqa64 %%zmm0, %%zmm1\n\t"       \
  "vmovdqa64 %%zmm0, %%zmm2\n\t"       \
  "vmovdqa64 %%zmm0, %%zmm3\n\t"       \
  "vmovdqa64 %%zmm4, %%zmm5\n\t"       \
  "vmovdqa64 %%zmm4, %%zmm6\n\t"       \
  "vmovdqa64 %%zmm4, %%zmm7\n\t"       \
  "vmovdqa64 %%zmm8, %%zmm9\n\t"       \
  "vmovdqa64 %%zmm8, %%zmm10\n\t"      \
  "vmovdqa64 %%zmm8, %%zmm11\n\t"      \
  "vmovdqa64 %%zmm12, %%zmm13\n\t"     \
  "vmovdqa64 %%zmm12, %%zmm14\n\t"     \
  "vmovdqa64 %%zmm12, %%zmm15\n\t"

// acc = fma(float(d), sx · sw, acc) for the sum in zmm`n`, its row's sx in zmm`sx`, its block's
// sw in zmm`sw`, and acc at byte `off` of %[acc].
#define SLUICE_FOLD_SUM(n, sx, sw, off)                  \
  "vmulps %%zmm" sx ", %%zmm" sw ", %%zmm21\n\t"         \
  "vcvtdq2ps %%zmm" n ", %%zmm" n "\n\t"                 \
  "vfmadd213ps " off "(%[acc]), %%zmm21, %%zmm" n "\n\t" \
  "vmovups %%zmm" n ", " off "(%[acc])\n\t"

// Folds the finished group into acc (rows 256 bytes apart: 4 blocks of 16 fp32) with W's scales
// (GroupParams at %[p]) in zmm16-19 and the rows' sx in zmm20, 22-24, then steps %[p] to the next
// group. zmm21 is scratch.
#define SLUICE_FOLD_SUMS                                                             \
  "vmovaps 0(%[p]), %%zmm16\n\t"                                                    \
  "vmovaps 64(%[p]), %%zmm17\n\t"                                                   \
  "vmovaps 128(%[p]), %%zmm18\n\t"                                                  \
  "vmovaps 192(%[p]), %%zmm19\n\t"                                                  \
  "vbroadcastss 256(%[p]), %%zmm20\n\t"                                             \
  "vbroadcastss 260(%[p]), %%zmm22\n\t"                                             \
  "vbroadcastss 264(%[p]), %%zmm23\n\t"                                             \
  "vbroadcastss 268(%[p]), %%zmm24\n\t"                                             \
  SLUICE_FOLD_SUM("0", "20", "16", "0") SLUICE_FOLD_SUM("1", "20", "17", "64")      \
  SLUICE_FOLD_SUM("2", "20", "18", "128") SLUICE_FOLD_SUM("3", "20", "19", "192")   \
  SLUICE_FOLD_SUM("4", "22", "16", "256") SLUICE_FOLD_SUM("5", "22", "17", "320")   \
  SLUICE_FOLD_SUM("6", "22", "18", "384") SLUICE_FOLD_SUM("7", "22", "19", "448")   \
  SLUICE_FOLD_SUM("8", "23", "16", "512") SLUICE_FOLD_SUM("9", "23", "17", "576")   \
  SLUICE_FOLD_SUM("10", "23", "18", "640") SLUICE_FOLD_SUM("11", "23", "19", "704") \
  SLUICE_FOLD_SUM("12", "24", "16", "768") SLUICE_FOLD_SUM("13", "24", "17", "832") \
  SLUICE_FOLD_SUM("14", "24", "18", "896") SLUICE_FOLD_SUM("15", "24", "19", "960") \
  "add $320, %[p]\n\t"

// The lines of the 4 blocks at %[pf] into L2, and %[pf] one line on: the same place in the next
// sweep, while this one's W is read from L1.
#define SLUICE_PREFETCH_NEXT_SWEEP          \
  "prefetcht1 (%[pf])\n\t"                \
  "prefetcht1 (%[pf],%[bb],1)\n\t"        \
  "prefetcht1 (%[pf],%[bb],2)\n\t"        \
  "prefetcht1 (%[pf],%[bb3],1)\n\t"       \
  "add $64, %[pf]\n\t"

// One group's k-quads (%[n] of them) of int8 W: W's 4 lines xor-biased into zmm16-19 (bias in
// zmm25), each broadcast of X (zmm20) against all 4.
#define SLUICE_INT8_QUADS                          \
  "1:\n\t"                                         \
  SLUICE_PREFETCH_NEXT_SWEEP                       \
  "vpxord (%[w]), %%zmm25, %%zmm16\n\t"            \
  "vpxord (%[w],%[bb],1), %%zmm25, %%zmm17\n\t"    \
  "vpxord (%[w],%[bb],2), %%zmm25, %%zmm18\n\t"    \
  "vpxord (%[w],%[bb3],1), %%zmm25, %%zmm19\n\t"   \
  "vpbroadcastd (%[x]), %%zmm20\n\t"               \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm0\n\t"          \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm1\n\t"          \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm2\n\t"          \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm3\n\t"          \
  "vpbroadcastd (%[x],%[ldx],1), %%zmm20\n\t"      \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm4\n\t"          \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm5\n\t"          \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm6\n\t"          \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm7\n\t"          \
  "vpbroadcastd (%[x],%[ldx],2), %%zmm20\n\t"      \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm8\n\t"          \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm9\n\t"          \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm10\n\t"         \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm11\n\t"         \
  "vpbroadcastd (%[x],%[ldx3],1), %%zmm20\n\t"     \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm12\n\t"         \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm13\n\t"         \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm14\n\t"         \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm15\n\t"         \
  "add $64, %[w]\n\t"                              \
  "add $4, %[x]\n\t"                               \
  "dec %[n]\n\t"                                   \
  "jnz 1b\n\t"

// One group's k-octets (%[n] of them) of int4 W: each line unpacked into its low nibbles
// (zmm16-19) and high nibbles (zmm22-25, mask in zmm26), two broadcasts of X (zmm20 at p, zmm21
// at p + 4).
#define SLUICE_INT4_OCTETS                           \
  "1:\n\t"                                           \
  SLUICE_PREFETCH_NEXT_SWEEP                         \
  "vmovdqa64 (%[w]), %%zmm16\n\t"                    \
  "vmovdqa64 (%[w],%[bb],1), %%zmm17\n\t"            \
  "vmovdqa64 (%[w],%[bb],2), %%zmm18\n\t"            \
  "vmovdqa64 (%[w],%[bb3],1), %%zmm19\n\t"           \
  "vpsrlw $4, %%zmm16, %%zmm22\n\t"                  \
  "vpsrlw $4, %%zmm17, %%zmm23\n\t"                  \
  "vpsrlw $4, %%zmm18, %%zmm24\n\t"                  \
  "vpsrlw $4, %%zmm19, %%zmm25\n\t"                  \
  "vpandd %%zmm26, %%zmm16, %%zmm16\n\t"             \
  "vpandd %%zmm26, %%zmm17, %%zmm17\n\t"             \
  "vpandd %%zmm26, %%zmm18, %%zmm18\n\t"             \
  "vpandd %%zmm26, %%zmm19, %%zmm19\n\t"             \
  "vpandd %%zmm26, %%zmm22, %%zmm22\n\t"             \
  "vpandd %%zmm26, %%zmm23, %%zmm23\n\t"             \
  "vpandd %%zmm26, %%zmm24, %%zmm24\n\t"             \
  "vpandd %%zmm26, %%zmm25, %%zmm25\n\t"             \
  "vpbroadcastd (%[x]), %%zmm20\n\t"                 \
  "vpbroadcastd 4(%[x]), %%zmm21\n\t"                \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm0\n\t"            \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm1\n\t"            \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm2\n\t"            \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm3\n\t"            \
  "vpdpbusd %%zmm21, %%zmm22, %%zmm0\n\t"            \
  "vpdpbusd %%zmm21, %%zmm23, %%zmm1\n\t"            \
  "vpdpbusd %%zmm21, %%zmm24, %%zmm2\n\t"            \
  "vpdpbusd %%zmm21, %%zmm25, %%zmm3\n\t"            \
  "vpbroadcastd (%[x],%[ldx],1), %%zmm20\n\t"        \
  "vpbroadcastd 4(%[x],%[ldx],1), %%zmm21\n\t"       \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm4\n\t"            \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm5\n\t"            \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm6\n\t"            \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm7\n\t"            \
  "vpdpbusd %%zmm21, %%zmm22, %%zmm4\n\t"            \
  "vpdpbusd %%zmm21, %%zmm23, %%zmm5\n\t"            \
  "vpdpbusd %%zmm21, %%zmm24, %%zmm6\n\t"            \
  "vpdpbusd %%zmm21, %%zmm25, %%zmm7\n\t"            \
  "vpbroadcastd (%[x],%[ldx],2), %%zmm20\n\t"        \
  "vpbroadcastd 4(%[x],%[ldx],2), %%zmm21\n\t"       \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm8\n\t"            \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm9\n\t"            \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm10\n\t"           \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm11\n\t"           \
  "vpdpbusd %%zmm21, %%zmm22, %%zmm8\n\t"            \
  "vpdpbusd %%zmm21, %%zmm23, %%zmm9\n\t"            \
  "vpdpbusd %%zmm21, %%zmm24, %%zmm10\n\t"           \
  "vpdpbusd %%zmm21, %%zmm25, %%zmm11\n\t"           \
  "vpbroadcastd (%[x],%[ldx3],1), %%zmm20\n\t"       \
  "vpbroadcastd 4(%[x],%[ldx3],1), %%zmm21\n\t"      \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm12\n\t"           \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm13\n\t"           \
  "vpdpbusd %%zmm20, %%zmm18, %%zmm14\n\t"           \
  "vpdpbusd %%zmm20, %%zmm19, %%zmm15\n\t"           \
  "vpdpbusd %%zmm21, %%zmm22, %%zmm12\n\t"           \
  "vpdpbusd %%zmm21, %%zmm23, %%zmm13\n\t"           \
  "vpdpbusd %%zmm21, %%zmm24, %%zmm14\n\t"           \
  "vpdpbusd %%zmm21, %%zmm25, %%zmm15\n\t"           \
  "add $64, %[w]\n\t"                                \
  "add $8, %[x]\n\t"                                 \
  "dec %[n]\n\t"                                     \
  "jnz 1b\n\t"

// What a fused loop is given: W at the first group of the tile's first block (blocks
// block_bytes apart), how far ahead it prefetches W (one sweep), X at the rows' first group (rows
// ldx apart), steps (quads or octets) per group, the groups' GroupParams and the accumulators
// (rows 256 bytes apart).
struct FusedArgs {
  const void* w;
  int64_t block_bytes, prefetch_ahead;
  const int8_t* x;
  int64_t ldx, steps;
  const GroupParams* params;
  int64_t groups;
  float* acc;
};

// The operands every fused loop names.
#define SLUICE_FUSED_OPERANDS(a, w, pf, x, p, g, n)                                         \
  : [w] "+r"(w), [pf] "+r"(pf), [x] "+r"(x), [p] "+r"(p), [g] "+r"(g), [n] "=&r"(n)        \
  : [steps] "m"(a.steps), [bb] "r"(a.block_bytes), [bb3] "r"(3 * a.block_bytes),            \
    [ldx] "r"(a.ldx), [ldx3] "r"(3 * a.ldx), [acc] "r"(a.acc)                                \
  : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
    "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19",         \
    "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "memory", "cc"

// Per group: the sums started, the group's k-steps (STEPS), the fold; the constant of the steps
// (`value`, a 32-bit pattern) broadcast into `reg` first.
#define SLUICE_GROUPS_LOOP(value, reg, STEPS) \
  "mov $" value ", %k[n]\n\t"                \
  "vpbroadcastd %k[n], %%" reg "\n\t"        \
  "2:\n\t"                                   \
  SLUICE_START_SUMS                           \
  "mov %[steps], %[n]\n\t"                   \
  STEPS                                       \
  SLUICE_FOLD_SUMS                            \
  "dec %[g]\n\t"                             \
  "jnz 2b\n\t"

// The 4 × 4 tile over a.groups whole groups: int8 quads (the xor bias in zmm25) or int4 octets
// (the nibble mask in zmm26).
template <bool kInt4>
SLUICE_AVX512_VNNI void groups_4x4(const FusedArgs& a) {
  const char* w = static_cast<const char*>(a.w);
  const char* pf = w + a.prefetch_ahead;
  const int8_t* x = a.x;
  const GroupParams* p = a.params;
  int64_t g = a.groups, n;
  if constexpr (kInt4)
    __asm__ volatile(SLUICE_GROUPS_LOOP("0x0f0f0f0f", "zmm26", SLUICE_INT4_OCTETS)
                     SLUICE_FUSED_OPERANDS(a, w, pf, x, p, g, n));
  else
    __asm__ volatile(SLUICE_GROUPS_LOOP("0x80808080", "zmm25", SLUICE_INT8_QUADS)
                     SLUICE_FUSED_OPERANDS(a, w, pf, x, p, g, n));
}
// clang-format on

// The full 4 × 4 tile with its accumulators 4 blocks wide (ldacc 64), int8 or int4 (kInt4):
// the fused loop over the tile's groups, kFusedGroups at a time.
template <bool kInt4>
SLUICE_AVX512_VNNI void tile_4x4_fused(const Tile& t) {
  const int64_t k = t.w->k, group_size = t.w->group_size, groups = t.x->groups;
  // Bytes of W per group and block: 16 rows of 1 byte per k (int8) or half a byte (int4).
  const int64_t group_bytes = group_size * kInt8BlockRows / (kInt4 ? 2 : 1);
  const auto* w = kInt4 ? block_group4(*t.w, t.block, t.g0)
                        : reinterpret_cast<const uint8_t*>(block_group(*t.w, t.block, t.g0));
  const float* sw = block_scales(*t.w, groups, t.block, t.g0);
  const int32_t* offsets = kInt4 ? t.x->offset_sum4 : t.x->offset_sum;
  FusedArgs a{.w = nullptr,
              .block_bytes = groups * group_bytes,
              .prefetch_ahead = (t.g1 - t.g0) * group_bytes,
              .x = t.x->q + t.row * k + t.g0 * group_size,
              .ldx = k,
              .steps = group_size / (kInt4 ? 8 : 4),
              .params = nullptr,
              .groups = 0,
              .acc = t.acc};
  for (int64_t g = t.g0; g < t.g1; g += kFusedGroups) {
    const int64_t count = std::min(kFusedGroups, t.g1 - g);
    GroupParams params[kFusedGroups];
    for (int64_t j = 0; j < count; ++j, sw += kInt8BlockRows) {
      for (int b = 0; b < 4; ++b)
        std::memcpy(params[j].sw[b], sw + b * groups * kInt8BlockRows, sizeof(params[j].sw[b]));
      for (int i = 0; i < 4; ++i) {
        params[j].sx[i] = t.x->scale[(t.row + i) * groups + g + j];
        params[j].offset[i] = offsets[(t.row + i) * groups + g + j];
      }
    }
    a.w = w;
    a.params = params;
    a.groups = count;
    groups_4x4<kInt4>(a);
    w += count * group_bytes;
    a.x += count * group_size;
  }
}

#undef SLUICE_START_SUMS
#undef SLUICE_FOLD_SUM
#undef SLUICE_FOLD_SUMS
#undef SLUICE_INT8_QUADS
#undef SLUICE_INT4_OCTETS
#undef SLUICE_PREFETCH_NEXT_SWEEP
#undef SLUICE_FUSED_OPERANDS
#undef SLUICE_GROUPS_LOOP

// w xor 0x80 is w + 128 as an unsigned byte; the accumulator starts at -128·Σx of the row's
// group (offset_sum), so after the group it holds Σw·x exactly (|Σ| < 2²⁵, no overflow).
//
// vpdpbusd has a latency of several cycles and two pipes: one int32 accumulator per row (4 at
// 4 rows) keeps a fraction of them busy; kBlocks blocks side by side give kRows × kBlocks
// independent sums (16 at 4 × 4), and each broadcast of X feeds kBlocks instructions. Per k-quad
// at 4 × 4: 4 loads and xors of W, 4 broadcasts, 16 vpdpbusd, in 22 of the 32 zmm registers.
template <int kRows, int kBlocks>
SLUICE_AVX512_VNNI void tile_avx512_vnni(const Tile& t) {
  if constexpr (kRows == 4 && kBlocks == 4)
    if (t.ldacc == 4 * kInt8BlockRows) return tile_4x4_fused<false>(t);
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const int64_t k = t.w->k, group_size = t.w->group_size, block_stride = k * kInt8BlockRows;
  const int8_t* wg = block_group(*t.w, t.block, t.g0);
  const int8_t* xg = t.x->q + t.row * k + t.g0 * group_size;
  GroupCursor c(t, t.x->offset_sum, t.g0);
  for (int64_t g = t.g0; g < t.g1;
       ++g, wg += group_size * kInt8BlockRows, xg += group_size, c.next_group()) {
    alignas(64) __m512i d[kRows][kBlocks];
    start_group(c, d);
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
    fold_group(c, t.acc, t.ldacc, d);
  }
}

// int4 (gemm_int8.h): one 64-byte line holds two k-quads of the 16 rows as nibbles u = q + 8;
// u & 15 (the quad at p) and u >> 4 (the quad at p + 4) are vpdpbusd's unsigned operands, and
// the group's sum starts at -8·Σx (offset_sum4). At 4 × 4: 8 unpacked lines, 16 sums, 2
// broadcasts and the mask, 27 registers.
template <int kRows, int kBlocks>
SLUICE_AVX512_VNNI void tile4_avx512_vnni(const Tile& t) {
  if constexpr (kRows == 4 && kBlocks == 4)
    if (t.ldacc == 4 * kInt8BlockRows) return tile_4x4_fused<true>(t);
  const __m512i low = _mm512_set1_epi8(15);
  const int64_t k = t.w->k, group_size = t.w->group_size, block_stride = k * kInt8BlockRows / 2;
  const uint8_t* wg = block_group4(*t.w, t.block, t.g0);
  const int8_t* xg = t.x->q + t.row * k + t.g0 * group_size;
  GroupCursor c(t, t.x->offset_sum4, t.g0);
  for (int64_t g = t.g0; g < t.g1;
       ++g, wg += group_size * kInt8BlockRows / 2, xg += group_size, c.next_group()) {
    alignas(64) __m512i d[kRows][kBlocks];
    start_group(c, d);
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
