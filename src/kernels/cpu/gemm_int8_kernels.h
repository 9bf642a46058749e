// Internal to the int8 GEMM: what the driver (gemm_int8.cpp) hands to the per-level tile
// kernels (gemm_int8_avx2.cpp, gemm_int8_avx512.cpp). Not for use outside those files.
#pragma once

#include <cstdint>

#include "kernels/cpu/gemm_int8.h"

namespace sluice::cpu::int8 {

// Rows of X one tile call computes at once: MR int32 accumulators per 16 columns; at 4 rows the
// AVX2 kernel uses 15 of its 16 ymm registers.
constexpr int kMaxTileRows = 4;
// Blocks of 16 columns one tile call may take (Kernels::max_blocks of its level): the AVX512-VNNI
// tile takes 4, so 16 int32 accumulators hide vpdpbusd's latency and each broadcast of X meets 4
// lines of W.
constexpr int kMaxTileBlocks = 4;

// X quantized per row and group (see gemm_int8.h), in the forms the instructions want.
struct Activations {
  int64_t k = 0, groups = 0;
  const int8_t* q = nullptr;             // [m, k] in [-127, 127]
  const uint8_t* abs = nullptr;          // [m, k] |q|: the unsigned operand of vpmaddubsw
  const float* scale = nullptr;          // [m, groups]
  const int32_t* offset_sum = nullptr;   // [m, groups] -128·Σq: corrects vpdpbusd's w + 128
  const int32_t* offset_sum4 = nullptr;  // [m, groups] -8·Σq: corrects int4's nibble q + 8
};

// Rows [row, row + rows) of X (rows ≤ kMaxTileRows) against packed blocks [block, block + blocks)
// of W (blocks ≤ the level's max_blocks), groups [g0, g1): acc[r][c] = fma(float(d), sx·sw,
// acc[r][c]) for each group in order (16 columns a block).
struct Tile {
  const Activations* x = nullptr;
  const QuantView* w = nullptr;
  int64_t row = 0, block = 0, blocks = 1, g0 = 0, g1 = 0;
  float* acc = nullptr;  // [rows][blocks · 16], row stride ldacc
  int64_t ldacc = kInt8BlockRows;
};
using TileFn = void (*)(const Tile&);

// y[r][c] = beta == 0 ? acc[r][c] : fma(beta, y[r][c], acc[r][c]) for r < rows, c < cols ≤ 16;
// acc's row stride is ldacc.
using StoreFn = void (*)(const float* acc, int64_t ldacc, int64_t rows, int64_t cols, float* y,
                         int64_t ldy, float beta);

struct Kernels {
  TileFn tile[kMaxTileRows] = {};   // tile[rows - 1], int8 weights
  TileFn tile4[kMaxTileRows] = {};  // tile4[rows - 1], int4 weights
  StoreFn store = nullptr;
  int64_t max_blocks = 1;  // blocks of 16 columns a tile call takes
};

Kernels kernels_scalar();
Kernels kernels_avx2_maddubs();
Kernels kernels_avx_vnni();
Kernels kernels_avx512_vnni();

// How far ahead of the line a tile reads it prefetches W, in bytes of the packed stream (a block's
// 16 rows are one contiguous stream of k · 16 bytes). Measured on 2 Zen 3 cores (AMD EPYC
// "Milan", AVX2 level, n = 14336, k = 4096, group 128, three interleaved runs of each,
// 2026-12-05): without it W was read at 84–89% of DRAM at m = 1 and 53–61% at m = 4; 1024 bytes
// ahead 89–92% and 64–68%; 2048 ahead 84–90% and 66–70%.
constexpr int64_t kPrefetchAheadBytes = 2048;

// Address of group g of block `block` in the packed int8 weights, and of its 16 scales (`groups` is
// w.groups(), passed in to keep a 64-bit division out of the kernels' loops).
inline const int8_t* block_group(const QuantView& w, int64_t block, int64_t g) {
  return reinterpret_cast<const int8_t*>(w.values()) +
         (block * w.k + g * w.group_size) * kInt8BlockRows;
}
// The int4 form: half the bytes per k.
inline const uint8_t* block_group4(const QuantView& w, int64_t block, int64_t g) {
  return w.values() + (block * w.k + g * w.group_size) * (kInt8BlockRows / 2);
}
inline const float* block_scales(const QuantView& w, int64_t groups, int64_t block, int64_t g) {
  return w.scales() + (block * groups + g) * kInt8BlockRows;
}

// What a tile's loop over groups reads besides W and X, as pointers at group g that advance by
// one group each step. Hoisted out of the loop: QuantView::scales() is an out-of-line call, and
// the hand-laid loops' "memory" clobber makes GCC reload every field reached through the Tile
// after each of them (on 2 Zen 4 cores the fold of the 4 × 4 int8 tile took 31% of its time
// with that code, with a call per block).
struct GroupCursor {
  const float* sw;        // the 16 scales of block t.block; block t.block + b at sw + b·sw_stride
  const float* sx;        // X's scale of row t.row; row t.row + i at sx + i·groups
  const int32_t* offset;  // the row's offset sum (offset_sum or offset_sum4), laid out as sx
  int64_t sw_stride, groups;

  GroupCursor(const Tile& t, const int32_t* offsets, int64_t g)
      : sw(block_scales(*t.w, t.x->groups, t.block, g)),
        sx(t.x->scale + t.row * t.x->groups + g),
        offset(offsets + t.row * t.x->groups + g),
        sw_stride(t.x->groups * kInt8BlockRows),
        groups(t.x->groups) {}
  void next_group() {
    sw += kInt8BlockRows;
    ++sx;
    ++offset;
  }
};

}  // namespace sluice::cpu::int8
