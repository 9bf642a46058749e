// The token-lane GEMM of gemm_lanes.h: the packing of X, the tiles, and the loops over them.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "core/dtype.h"
#include "kernels/cpu/column_split.h"
#include "kernels/cpu/gemm_lanes.h"
#include "kernels/cpu/gemm_tiles.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/simd_avx512.h"  // also silences GCC 12's false warning in the intrinsics

namespace sluice::cpu {
namespace {

constexpr int kLanes = 16;     // rows of X per block: the fp32 lanes of one register
constexpr int kMaxBlocks = 4;  // blocks of rows per tile
// Columns (rows of W) per tile: 6 W rows k apart fit the 8 ways of an L1 set, where 12 thrashed
// them. Measured on 2 Zen 4 cores (n = 14336, k = 4096, 2026-12-06), against the former tiles of
// 2 blocks × 12 columns: with 4 blocks (4 loads of X and 6 broadcasts of W per 24 `vdpbf16ps`)
// 80–84% of the peak where 2 × 12 gave ~71%; with 2 blocks (m = 17 to 32) m = 24 10.5 → 9.7 ms
// and m = 32 11.3 → 9.9–10.6 ms; with 1 block, m = 16 8.0 → 5.4 ms, where the `vdpbf16ps` 4 × 3
// tiles (since removed) took 6.1–6.2 ms. 8 columns measured the same as 6.
constexpr int kMaxCols = 6;
constexpr int64_t kPairValues = 2 * kLanes;  // packed elements per step (one line) of one block
// k pairs per range: a tile's X (4 blocks × 2048 pairs × 64 B = 512 KB) stays in L2 while it
// meets the block's columns one tile after another. Measured on 2 Zen 4 cores (2026-12-06, 4 × 6
// tiles, m = 64 and 256): 64 pairs 72–73% of the `vdpbf16ps` peak, 128 pairs 76–78%, 256 78–80%,
// 512 80–81%, 2048 81–84% (n = 14336, k = 4096), and 87–92% at the down projection's
// n = 4096, k = 14336 (seven ranges). Long runs of each W row keep the hardware prefetchers
// streaming; Zen 5 measured 128–512 pairs within 3% of each other with the 2 × 12 tiles.
constexpr int64_t kDepthPairs = 2048;
// Columns whose partial sums a thread keeps between k ranges (96 × 256 rows × 4 B = 96 KB), and
// whose W over one range every tile of rows walks (from L2 where it fits). 24 and 48 columns
// measured the same as 96 on Zen 4.
constexpr int64_t kColBlock = 16 * kMaxCols;
constexpr int64_t kRowBlock = 256;     // rows of X packed at a time
constexpr int64_t kPairsPerLine = 16;  // pairs of one W row in a 64-byte line
// Rows past the last whole block of 16, when there are at most this many, stay out of the lanes
// (where they would cost a whole block) and meet each tile's W right after it, with k in the
// vector lanes instead: leftover tiles of up to 4 rows × the tile's columns, whose cost grows
// with their rows (gemm_lanes.h). Measured on 2 Zen 4 cores (n = 14336, k = 4096, 2026-12-07):
// 12 against 8 took m = 25–28 from 9.4–9.7 to 8.5–9.1 ms and m = 44 from 14.7 to 13.6–13.7; at
// m = 30 and 31 (14 and 15 rows past) a whole block and the leftover tiles measured the same.
constexpr int64_t kMaxLeftoverRows = 12;
// With one tile of rows, each tile meets its W once, straight from memory: it prefetches into L2
// the W of the tile this many tiles after it (tile_ahead_w). With several tiles of rows, the first
// prefetches the next column block's W (next_block_w), which the others then meet in L2. Measured
// on 2 Zen 5 cores (n = 14336, k = 4096, 2026-12-08, bench-kernels, two interleaved rounds), one
// thread, the next column block's W against 2 tiles ahead: m = 4 4.7–5.3 ms against 4.6–5.0,
// m = 8 5.8–6.0 against 4.6–4.7, m = 12 6.2–7.7 against 4.9–5.2, m = 16 7.0–8.0 against 6.1–6.2,
// m = 32 10.7–11.9 against 9.9–10.5; two threads, m = 4 3.4 against 2.5, m = 16 3.8 against 3.4.
// The next column block is 768 KB of W ahead (96 rows of 8 KB), most of Zen 5's 1 MB L2.
constexpr int64_t kTilesAhead = 2;
constexpr int kLeftoverTileRows = 4;
constexpr int64_t kValuesPerLine = 2 * kPairsPerLine;

struct LaneJob {
  const uint16_t* x = nullptr;  // packed X: the tile's first block, at the range's first pair
  int64_t x_block_stride = 0;   // elements from one block of rows to the next
  const uint16_t* w = nullptr;  // W row of the tile's first column, at the range's first value
  int64_t ldw = 0;
  int64_t steps = 0;                 // whole steps of W values in the range (2P values each)
  int64_t tail_values = 0;           // then this many values (< 2P) of a last step at k's end
  const uint16_t* next_w = nullptr;  // the W the loops visit after this tile (into L2), or null
  float* partial = nullptr;  // [column][row] sums over the ranges so far, row stride ld_partial
  int64_t ld_partial = 0;
  bool first = true;  // the first range: the sums start here, else they add to partial's
};

// W's 2P values of column j at step s, in every lane group: P pairs, as the lanes of each of
// X's rows hold them (a 4- or 16-byte broadcast).
template <int P>
SLUICE_AVX512_BF16 inline __m512bh broadcast_step(const uint16_t* w) {
  if constexpr (P == 1) {
    uint32_t pair;
    std::memcpy(&pair, w, sizeof(pair));
    return (__m512bh)_mm512_set1_epi32(int(pair));
  } else {
    static_assert(P == 4);
    return (__m512bh)_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  }
}

// The last `values` (< 2P) of W's column at a partial last step, zero after, broadcast alike.
template <int P>
SLUICE_AVX512_BF16 inline __m512bh broadcast_tail(const uint16_t* w, int64_t values) {
  const __m128i v = _mm_maskz_loadu_epi16(__mmask8((1u << values) - 1), w);
  if constexpr (P == 1)
    return (__m512bh)_mm512_broadcastd_epi32(v);
  else
    return (__m512bh)_mm512_broadcast_i32x4(v);
}

// One step of the tile: each block's line of X (its R rows' 2P values at step s) against each
// column's broadcast of W; a partial last step (kTail) reads W masked.
template <int P, int MB, int NR, bool kTail = false>
SLUICE_AVX512_BF16 inline void lane_step(__m512 (&acc)[MB][NR], const LaneJob& job,
                                         const uint16_t* const (&w)[NR], int64_t s) {
  __m512bh xv[MB];
#pragma GCC unroll 4
  for (int b = 0; b < MB; ++b)
    xv[b] = (__m512bh)_mm512_load_si512(job.x + b * job.x_block_stride + s * kPairValues);
#pragma GCC unroll 6
  for (int j = 0; j < NR; ++j) {
    const __m512bh wv = kTail ? broadcast_tail<P>(w[j] + 2 * P * s, job.tail_values)
                              : broadcast_step<P>(w[j] + 2 * P * s);
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) acc[b][j] = _mm512_dpbf16_ps(acc[b][j], xv[b], wv);
  }
}

// The tile's sums into the partial sums of its columns (transposed, [column][row]): Y is written
// from there once per column block (store_column_block), in whole lines.
template <int MB, int NR>
SLUICE_AVX512_BF16 inline void finish(__m512 (&acc)[MB][NR], const LaneJob& job) {
  for (int b = 0; b < MB; ++b) {
    for (int j = 0; j < NR; ++j) {
      float* part = job.partial + j * job.ld_partial + b * kLanes;
      __m512 sum = acc[b][j];
      if (!job.first) sum = _mm512_add_ps(sum, _mm512_load_ps(part));
      _mm512_store_ps(part, sum);
    }
  }
}

template <int P, int MB, int NR>
SLUICE_AVX512_BF16 void lane_tile(const LaneJob& job) {
  constexpr int64_t kStepsPerLine = kPairsPerLine / P;  // steps over one line of each W row
  __m512 acc[MB][NR], acc_odd[MB][NR];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (auto& row : acc_odd)
    for (auto& a : row) a = _mm512_setzero_ps();
  const uint16_t* w[NR];
  for (int j = 0; j < NR; ++j) w[j] = job.w + j * job.ldw;
  int64_t s = 0;
  while (s < job.steps) {
    const int64_t end = std::min(job.steps, s + kStepsPerLine);
    if (job.next_w) {
      for (int j = 0; j < kMaxCols; ++j) {
        // prefetcht1 (into L2): GCC drops __builtin_prefetch from some loops (gemm_tiles.h).
        __asm__ volatile("prefetcht1 (%0)" : : "r"(job.next_w + j * job.ldw + 2 * P * s));
      }
    }
    if constexpr (MB == 1) {
      // One block has NR accumulators only: alternate steps go to a second set, so twice as many
      // chains hide the latency of `vdpbf16ps`. On 2 Zen 4 cores (n = 14336, k = 4096,
      // 2026-12-07, five interleaved runs): m = 16 5.0–5.1 ms against 5.2–5.3; with 2 blocks
      // (m = 32, 24 accumulators) the second set made no difference and is not used.
      for (; s + 1 < end; s += 2) {
        lane_step<P, MB, NR>(acc, job, w, s);
        lane_step<P, MB, NR>(acc_odd, job, w, s + 1);
      }
    }
    for (; s < end; ++s) lane_step<P, MB, NR>(acc, job, w, s);
  }
  if constexpr (MB == 1) {
#pragma GCC unroll 6
    for (int j = 0; j < NR; ++j) acc[0][j] = _mm512_add_ps(acc[0][j], acc_odd[0][j]);
  }
  if (job.tail_values > 0) lane_step<P, MB, NR, true>(acc, job, w, s);
  finish<MB, NR>(acc, job);
}

// The leftover rows against one lane tile's columns over the same k range: X bf16 in its natural
// order (row stride ldx, zero past k), W read where it lies (its last line masked at k).
struct LeftoverJob {
  const uint16_t* x = nullptr;  // the tile's first leftover row, at k = 0
  int64_t ldx = 0;
  const uint16_t* w = nullptr;  // W row of the tile's first column, at k = 0
  int64_t ldw = 0;
  int64_t v0 = 0, v1 = 0;  // k-values of the range, v0 a multiple of kValuesPerLine, v1 ≤ k
  float* y = nullptr;      // Y at the tile's first row and column
  int64_t ldy = 0;
  bool first = true;  // the first range: Y = sum + beta · Y; later ones: Y += sum
  float beta = 0.0f;
};

template <int MR, int NR>
SLUICE_AVX512_BF16 inline void leftover_line(__m512 (&acc)[MR][NR], const LeftoverJob& job,
                                             int64_t v, __mmask32 valid) {
  __m512i wv[NR];
#pragma GCC unroll 6
  for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_epi16(valid, job.w + j * job.ldw + v);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    const __m512i xv = _mm512_load_si512(job.x + i * job.ldx + v);
#pragma GCC unroll 6
    for (int j = 0; j < NR; ++j)
      acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
  }
}

template <int MR, int NR>
SLUICE_AVX512_BF16 void leftover_tile(const LeftoverJob& job) {
  __m512 acc[MR][NR];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  // One loop with the last line's mask computed in it: with a second call for the last line,
  // GCC 12 kept the accumulators in memory too and stored all of them at every line. A second
  // set of accumulators for one row (as lane_tile's for one block) measured the same at m = 1,
  // 17 and 33 (2 Zen 4 cores, 2026-12-07), and is not used.
  for (int64_t v = job.v0; v < job.v1; v += kValuesPerLine) {
    const int64_t valid = job.v1 - v;
    leftover_line<MR, NR>(acc, job, v,
                          valid >= kValuesPerLine ? ~__mmask32(0) : __mmask32((1u << valid) - 1));
  }
  // Unrolled, so the accumulators stay registers (indexed at run time, GCC stored them to memory
  // at every line).
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 6
    for (int j = 0; j < NR; ++j)
      tiles::add_range_sum(job.y[i * job.ldy + j], _mm512_reduce_add_ps(acc[i][j]), job.first,
                           job.beta);
  }
}

using LeftoverTileFn = void (*)(const LeftoverJob&);

template <int MR, int... NR>
constexpr std::array<LeftoverTileFn, kMaxCols> row_of_leftover_tiles(
    std::integer_sequence<int, NR...>) {
  return {&leftover_tile<MR, NR + 1>...};
}

template <int... MR>
constexpr std::array<std::array<LeftoverTileFn, kMaxCols>, kLeftoverTileRows> leftover_table(
    std::integer_sequence<int, MR...>) {
  return {row_of_leftover_tiles<MR + 1>(std::make_integer_sequence<int, kMaxCols>{})...};
}

LeftoverTileFn leftover_tile_for(int64_t rows, int64_t cols) {
  static constexpr auto table =
      leftover_table(std::make_integer_sequence<int, kLeftoverTileRows>{});
  return table[rows - 1][cols - 1];
}

using LaneTileFn = void (*)(const LaneJob&);

template <int P, int MB, int... NR>
constexpr std::array<LaneTileFn, kMaxCols> row_of_tiles(std::integer_sequence<int, NR...>) {
  return {&lane_tile<P, MB, NR + 1>...};
}

template <int P, int... MB>
constexpr std::array<std::array<LaneTileFn, kMaxCols>, kMaxBlocks> tile_table(
    std::integer_sequence<int, MB...>) {
  return {row_of_tiles<P, MB + 1>(std::make_integer_sequence<int, kMaxCols>{})...};
}

template <int P>
LaneTileFn tile_for(int64_t blocks, int64_t cols) {
  static constexpr auto table = tile_table<P>(std::make_integer_sequence<int, kMaxBlocks>{});
  return table[blocks - 1][cols - 1];
}

// Steps of 2P values (P pairs) that cover k.
int64_t step_count(int64_t k, int P) {
  return (k + 2 * P - 1) / (2 * P);
}

// Rows [r0, r0 + rows) of X into blocks of R = 16 / P rows ([block][step][R rows][2P values], one
// 64-byte line per step, gemm_lanes.h), as bf16 (fp32 X rounded to nearest even), zero past k and
// past the last row. P is a template argument so each step's copy is a fixed-size store: with P
// at run time, the copies became calls to memcpy, and the W-cpu prefill lost 3–6%.
template <int P>
void pack_rows(const TiledGemmArgs& a, int64_t r0, int64_t rows, uint16_t* out) {
  constexpr int64_t R = kLanes / P, span = 2 * P;
  const int64_t steps = step_count(a.k, P);
  const int64_t blocks = (rows + R - 1) / R;
#pragma omp parallel for schedule(static) if (rows * a.k >= (1 << 15))
  for (int64_t r = 0; r < blocks * R; ++r) {
    uint16_t* lines = out + (r / R) * steps * kPairValues + (r % R) * span;
    std::array<uint16_t, kValuesPerLine> run{};  // a run of the row's values, then scattered
    for (int64_t q0 = 0; q0 < steps * span; q0 += kValuesPerLine) {
      const int64_t q1 = std::min(a.k, q0 + kValuesPerLine);
      run.fill(0);
      if (r < rows) {
        if (a.x_dtype == DType::BF16) {
          const uint16_t* x = static_cast<const uint16_t*>(a.x) + (r0 + r) * a.ldx;
          std::copy(x + q0, x + q1, run.begin());
        } else {
          const float* x = static_cast<const float*>(a.x) + (r0 + r) * a.ldx;
          for (int64_t q = q0; q < q1; ++q) run[q - q0] = f32_to_bf16(x[q]);
        }
      }
      const int64_t s0 = q0 / span, s1 = std::min(steps, (q0 + kValuesPerLine) / span);
      for (int64_t st = s0; st < s1; ++st)
        std::memcpy(lines + st * kPairValues, &run[(st - s0) * span], span * sizeof(uint16_t));
    }
  }
}

// Rows [r0, r0 + rows) of X: the first `lane_rows` packed in blocks for the lanes, the rest
// (at most kMaxLeftoverRows) packed in order for the leftover tiles.
struct RowBlock {
  const TiledGemmArgs* a;
  int p;  // pairs per lane group: blocks of 16 / p rows
  const uint16_t* packed;
  int64_t r0, rows, lane_rows;
  const uint16_t* leftover;
  int64_t ld_leftover;
};

// The rows of a row block of blocks of 16 that go to the lanes: all, unless those past the last
// whole block are few enough for the leftover tiles.
int64_t lane_rows_of(int64_t rows) {
  const int64_t past = rows % kLanes;
  return past <= kMaxLeftoverRows ? rows - past : rows;
}

// The leftover rows of `rb` against W rows [j, j + cols) over k-values [v0, v1).
void run_leftover(const RowBlock& rb, int64_t j, int64_t cols, int64_t v0, int64_t v1) {
  const TiledGemmArgs& a = *rb.a;
  LeftoverJob job{.ldx = rb.ld_leftover,
                  .w = a.w + j * a.ldw,
                  .ldw = a.ldw,
                  .v0 = v0,
                  .v1 = v1,
                  .ldy = a.ldy,
                  .first = v0 == 0,
                  .beta = a.beta};
  for (int64_t i = rb.lane_rows; i < rb.rows; i += kLeftoverTileRows) {
    const int64_t rows = std::min<int64_t>(kLeftoverTileRows, rb.rows - i);
    job.x = rb.leftover + (i - rb.lane_rows) * rb.ld_leftover;
    job.y = a.y + (rb.r0 + i) * a.ldy + j;
    leftover_tile_for(rows, cols)(job);
  }
}

// Where the tile of columns [j, j + kMaxCols) lies in the block of W the loops visit next: the
// same columns at the next k range, or the next column block's at the first.
const uint16_t* next_block_w(const TiledGemmArgs& a, int64_t j, int64_t cb, int64_t cb_end,
                             int64_t c1, int64_t v1) {
  if (v1 < a.k) return a.w + j * a.ldw + v1;
  if (cb_end < c1) return a.w + (cb_end + (j - cb)) * a.ldw;
  return nullptr;
}

// W of the tile kTilesAhead tiles after the one at column j and k-values from v0, in the order
// the loops visit them with one tile of rows: the column block's tiles over a k range of
// `range_values`, the same tiles over the next range, then the next column block. Null past the
// thread's last column c1.
const uint16_t* tile_ahead_w(const TiledGemmArgs& a, int64_t j, int64_t cb, int64_t c1, int64_t v0,
                             int64_t range_values) {
  int64_t col = j + kTilesAhead * kMaxCols, v = v0, block = cb;
  for (int64_t block_end = std::min(c1, cb + kColBlock); col >= block_end;
       block_end = std::min(c1, block + kColBlock)) {
    col -= block_end - block;  // past the block's last tile: its first tiles at the next range
    v += range_values;
    if (v >= a.k) {  // or the next block's at the first
      v = 0;
      block = block_end;
      if (block >= c1) return nullptr;
    }
    col += block;
  }
  return a.w + col * a.ldw + v;
}

// The transpose of 16 vectors of 16 floats: v[i][j] becomes v[j][i]. 32-bit then 64-bit
// unpacks transpose the 4 × 4 blocks inside each 128-bit lane, then two rounds of 128-bit lane
// shuffles put the blocks in place.
SLUICE_AVX512 inline void transpose_16x16(__m512 (&v)[kLanes]) {
  __m512 t[kLanes], u[kLanes];
  for (int i = 0; i < kLanes; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  // u[4g + x], lane L: column 4L + x of rows 4g to 4g + 3.
  for (int g = 0; g < kLanes; g += 4) {
    const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]),
                  c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int x = 0; x < 4; ++x) {
    // Lanes 0 and 2 (even) and 1 and 3 (odd) of u[x], u[4 + x], then of u[8 + x], u[12 + x].
    const __m512 even_lo = _mm512_shuffle_f32x4(u[x], u[4 + x], 0x88),
                 odd_lo = _mm512_shuffle_f32x4(u[x], u[4 + x], 0xdd),
                 even_hi = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0x88),
                 odd_hi = _mm512_shuffle_f32x4(u[8 + x], u[12 + x], 0xdd);
    v[x] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);      // column x
    v[4 + x] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);    // column 4 + x
    v[8 + x] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xdd);  // column 8 + x
    v[12 + x] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xdd);   // column 12 + x
  }
}

// Y[row][c0 + c] = partial[c][row] (+ beta · Y) for the lane rows of `rb` and `cols` columns:
// the finished sums of a column block, written to Y a 16 × 16 transpose at a time, so each row
// of Y takes whole lines. Written tile by tile from the accumulators instead, as scattered groups
// of 6 floats a row apart (n floats), the stores took ~19% of the 4 × 6 tile's time (2 Zen 4
// cores, m = 64, n = 14336, k = 4096, 2026-12-07).
SLUICE_AVX512 void store_column_block(const RowBlock& rb, const float* partial, int64_t ld_partial,
                                      int64_t c0, int64_t cols) {
  const TiledGemmArgs& a = *rb.a;
  const int64_t R = kLanes / rb.p;
  const __m512 beta = _mm512_set1_ps(a.beta);
  for (int64_t b = 0; b * R < rb.lane_rows; ++b) {
    const int64_t rows = std::min<int64_t>(R, rb.lane_rows - b * R);
    for (int64_t c = 0; c < cols; c += kLanes) {
      const int64_t n = std::min<int64_t>(kLanes, cols - c);
      __m512 v[kLanes];
      for (int64_t i = 0; i < kLanes; ++i) {
        v[i] = i < n ? _mm512_load_ps(partial + (c + i) * ld_partial + b * kLanes)
                     : _mm512_setzero_ps();
      }
      transpose_16x16(v);  // v[lane]: the lane's sums over the 16 columns
      const __mmask16 mask = avx512::tail_mask(int(n));
      for (int64_t i = 0; i < rows; ++i) {
        float* y = a.y + (rb.r0 + b * R + i) * a.ldy + c0 + c;
        __m512 sum = v[i * rb.p];  // a row's P lanes hold its sums over alternate pairs
        for (int t = 1; t < rb.p; ++t) sum = _mm512_add_ps(sum, v[i * rb.p + t]);
        if (a.beta != 0.0f)
          sum = _mm512_add_ps(sum, _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mask, y)));
        _mm512_mask_storeu_ps(y, mask, sum);
      }
    }
  }
}

// W rows [c0, c1) against every row of the block: the lane tiles of rows, and after the last of
// them on each tile of columns the leftover rows on the same columns (W still in cache).
void run_columns(const RowBlock& rb, int64_t c0, int64_t c1) {
  const TiledGemmArgs& a = *rb.a;
  const int P = rb.p;
  const int64_t R = kLanes / P, span = 2 * P, steps = step_count(a.k, P);
  const int64_t blocks = (rb.lane_rows + R - 1) / R, lanes_padded = blocks * kLanes;
  const int64_t tail_values = a.k % span;
  float* partial = thread_scratch<1, float>(size_t(kColBlock * std::max<int64_t>(1, lanes_padded)));
  // At least one tile of rows, to carry the leftover rows when no block remains.
  const int64_t row_tiles = std::max<int64_t>(1, (blocks + kMaxBlocks - 1) / kMaxBlocks);
  for (int64_t cb = c0; cb < c1; cb += kColBlock) {
    const int64_t cb_end = std::min(c1, cb + kColBlock);
    for (int64_t s0 = 0; s0 < steps; s0 += kDepthPairs / P) {
      const int64_t s1 = std::min(steps, s0 + kDepthPairs / P);
      LaneJob job;
      job.x_block_stride = steps * kPairValues;
      job.ldw = a.ldw;
      job.tail_values = s1 == steps ? tail_values : 0;
      job.steps = s1 - s0 - (job.tail_values > 0 ? 1 : 0);
      job.ld_partial = lanes_padded;
      job.first = s0 == 0;
      for (int64_t t = 0; t < row_tiles; ++t) {
        const int64_t b = t * kMaxBlocks;
        job.x = rb.packed + b * job.x_block_stride + s0 * kPairValues;
        for (int64_t j = cb; j < cb_end; j += kMaxCols) {
          const int64_t cols = std::min<int64_t>(kMaxCols, cb_end - j);
          if (b < blocks) {
            job.w = a.w + j * a.ldw + span * s0;
            if (b > 0)
              job.next_w = nullptr;
            else if (row_tiles == 1)
              job.next_w = tile_ahead_w(a, j, cb, c1, span * s0, span * (kDepthPairs / P));
            else
              job.next_w = next_block_w(a, j, cb, cb_end, c1, span * s1);
            job.partial = partial + (j - cb) * lanes_padded + b * kLanes;
            const int64_t tile_blocks = std::min<int64_t>(kMaxBlocks, blocks - b);
            (P == 1 ? tile_for<1>(tile_blocks, cols) : tile_for<4>(tile_blocks, cols))(job);
          }
          if (t == row_tiles - 1 && rb.lane_rows < rb.rows)
            run_leftover(rb, j, cols, span * s0, std::min(a.k, span * s1));
        }
      }
    }
    store_column_block(rb, partial, lanes_padded, cb, cb_end - cb);
  }
}

}  // namespace

void lane_gemm_avx512bf16(const TiledGemmArgs& a) {
  const int P = a.m <= kFourRowBlocksMaxRows ? 4 : 1;
  const int64_t steps = step_count(a.k, P);
  for (int64_t r0 = 0, rows = 0; r0 < a.m; r0 += rows) {
    // A last few rows join the block before them as its leftover rows, which meet W in cache,
    // instead of making a block of their own that reads all of W again.
    rows = a.m - r0 <= kRowBlock + kMaxLeftoverRows ? a.m - r0 : kRowBlock;
    const int64_t lane_rows = P == 1 ? lane_rows_of(rows) : rows;
    const int64_t blocks = (lane_rows + kLanes / P - 1) / (kLanes / P);
    uint16_t* packed =
        thread_scratch<0, uint16_t>(size_t(std::max<int64_t>(1, blocks) * steps * kPairValues));
    (P == 1 ? pack_rows<1> : pack_rows<4>)(a, r0, lane_rows, packed);
    // One spare line per row, so rows k apart do not share L1 sets (gemm_tiled.cpp).
    const int64_t ld_leftover =
        (a.k + kValuesPerLine - 1) / kValuesPerLine * kValuesPerLine + kValuesPerLine;
    uint16_t* leftover = thread_scratch<2, uint16_t>(size_t((rows - lane_rows) * ld_leftover + 1));
    for (int64_t r = lane_rows; r < rows; ++r)
      pack_row_bf16(a, r0 + r, leftover + (r - lane_rows) * ld_leftover, ld_leftover);
    const RowBlock rb{&a, P, packed, r0, rows, lane_rows, leftover, ld_leftover};
    for_each_thread_columns(a.n, kMaxCols,
                            [&](int64_t c0, int64_t c1) { run_columns(rb, c0, c1); });
  }
}

}  // namespace sluice::cpu
