// The AVX512-BF16 GEMM for many rows of X ("token lanes"): Y[m, n] = X[m, k] · Wᵀ (+ beta · Y),
// W bf16 [n, k] used where it lies, X bf16 (or fp32 rounded to bf16).
//
// Tiles that put k in the vector lanes and reduce horizontally at the end (as the AVX2 4 × 3 tiles
// of gemm_tiles.h) need, for each `vdpbf16ps`, one load of W and one of X per four instructions,
// and twelve accumulators barely cover the instruction's latency. Here the lanes hold 16 rows of X:
// X is packed as [16-row block][k pair][16 rows][2 values], one 64-byte line per pair, and each
// weight pair W[j][2p..2p+1] is broadcast to all lanes, so
//
//     acc[block b][column j] += X pairs of the block's 16 rows · broadcast(W[j] pair p)
//
// A tile of 4 blocks × 6 columns keeps 24 accumulators (of 32 registers) and issues 4 loads of X
// and 6 broadcasts of W per 24 `vdpbf16ps` (fewer blocks × 6 where fewer rows remain).
// Rows past the last whole block of 16 (up to 12 of them) would waste most of a block's lanes, so
// they go to leftover tiles instead: right after each lane tile, up to 4 of them × the tile's 6 W
// rows over the same k range, k in the lanes as in gemm_tiles.h (one load per W line and per X
// row, a horizontal sum at the end), meeting W in cache.
// Up to kFourRowBlocksMaxRows rows the blocks hold 4 rows instead, each row's 4 lanes 4 pairs of
// k: X as [4-row block][step of 8 k-values][4 rows][8 values], and W's 8 values of a step
// broadcast 16 bytes at a time, so each lane meets its own pair; a row's 4 lanes are summed when
// Y is written. A block then wastes at most 3 rows.
// k is walked in ranges of up to 2048 pairs: over one range a tile of rows (512 KB of packed X)
// stays in L2 while it meets a block of 96 columns, tile after tile; with several tiles of rows the
// first prefetches the next range's W into L2, with one each tile prefetches the W of the tile two
// after it. Sums over a range are kept transposed ([column][row]) in
// a per-thread scratch between ranges, and after the last range each column block's are written
// to Y a 16 × 16 transpose at a time, so every row of Y takes whole lines.
//
// Measured on 2 Zen 5 cores (n = 14336, k = 4096, 2 × 12 tiles over 128-pair ranges): 70–77% of
// the `vdpbf16ps` peak from m = 32 up, where a loop of the same instructions on L1-resident data
// reaches ~95%. Tried and not kept there: W's lines copied to a contiguous buffer before use (W
// rows k apart share L1 sets; it cost more than it saved at m ≤ 64), 3 blocks × 8 columns (68%),
// the broadcast folded into `vdpbf16ps` as an {1to16} memory operand (30%: slow on this core),
// prefetcht0 of the tile's own W (38%).
// On 2 Zen 4 cores (2026-12-06) the 2 × 12 tiles over 128-pair ranges reached ~71% at m = 64
// and 256, and 50–54% at n = 4096, k = 14336. Packing each column block's W over a range into
// [tile][pair][12] first (an AVX-512 16 × 16 transpose, so a tile reads one stream and its 12 rows
// no longer share L1 sets) took m = 256 from 89.7–89.8 to 85.2–86.0 ms but m = 64 from 22.4–23.9
// to 24.9 and m = 32 to 14.7–15.0 (11.3–15.8 before), so it was not kept. The 6-column tiles over
// 2048-pair ranges reach 80–84% at n = 14336, k = 4096 and 87–92% at n = 4096, k = 14336 from
// m = 64 up, ~80% at m = 32 (gemm_lanes_avx512bf16.cpp has the measurements). With Y written
// in whole lines (before, each tile stored its 6 columns of every row, a row of Y apart: ~19% of
// the 4 × 6 tile's time), 94–96% from m = 64 at both shapes and 82–88% at m = 16 (2026-12-07).
// Tried and not kept there: the last block as a half block of 8 rows in 256-bit registers
// (m = 17 to 24 took 10.8–11.2 ms against 9.1–9.5 with a whole block: a 256-bit `vdpbf16ps` is
// no cheaper on Zen 4); prefetcht0 of a one-block tile's own W 2 to 8 lines ahead, and column
// blocks of 24 or 48 (the same, within the noise, at m = 16 to 64).
#pragma once

#include <cstdint>

#include "kernels/cpu/gemm_tiled.h"

namespace sluice::cpu {

// Up to this many rows of X the lanes hold blocks of 4 rows, each row's lanes 4 pairs of k apiece
// (W broadcast 16 bytes at a time), so a block wastes at most 3 rows where a block of 16 wastes
// up to 15; from here up, blocks of 16 rows, the rows past the last whole block in leftover
// tiles. On one Zen 4 core (n = 14336, k = 4096, 2026-12-07), blocks of 4 against what took
// these rows before (the leftover tiles alone up to m = 4, `vdpbf16ps` 4 × 3 tiles, since
// removed, to 9, one part-filled block of 16 to 12): m = 1 4.7–5.1 ms against 5.6–5.9, m = 4
// 4.7–4.9 against 6.7–6.9, m = 8 5.3 against 7.7–7.8, m = 10 and 12 7.6–7.7 against 9.1–9.3;
// m = 13 to 16 the same (9.4 ms) and m = 17 to 20 slower (12.3 against 10.6–11.8; 13.0–13.2 with
// the 5 blocks in one tile of 4 columns, and from 6 blocks in one tile GCC spilled the
// accumulators). Two cores: m = 8 3.6 against 4.1–4.4 ms, m = 12 4.0–4.2 against 4.6–4.8.
constexpr int64_t kFourRowBlocksMaxRows = 12;

// Shapes and strides already checked; X is bf16 or rounded to it (tiled_gemm's lanes_take).
void lane_gemm_avx512bf16(const TiledGemmArgs& args);

}  // namespace sluice::cpu
