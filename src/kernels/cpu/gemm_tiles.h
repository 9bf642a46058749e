// sluice's own GEMM against bf16 weights in place: the pieces shared by the driver
// (gemm_tiled.cpp) and the per-level tile kernels (gemm_tiles_scalar.cpp, gemm_tiles_avx2.cpp).
//
// Y[m, n] = X[m, k] · Wᵀ, W bf16 [n, k] row-major, used where it lies (a mapped checkpoint).
//
// Packed X. Each row of X is copied once per call, as fp32, into groups of 16 k-values stored
// "evens then odds": group g holds x[16g+0], x[16g+2], …, x[16g+14], then x[16g+1], …, x[16g+15],
// zero-padded to a multiple of 16. With that order a tile widens 16 bf16 weights to fp32 with one
// shift (the even ones, whose bits sit in the low half of each 32-bit pair) and one AND (the odd
// ones, already in the high half): one integer instruction per 8 weights, no shuffles, and the
// products meet the right activations.
//
// A tile computes MR rows of X against NR rows of W over a range of k, with MR × NR fp32
// accumulators that are summed horizontally at the end of the range and written to Y.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

namespace sluice::cpu::tiles {

constexpr int64_t kGroup = 16;  // k-values per packed group
constexpr int kMaxRows = 4;     // MR: rows of X per tile
constexpr int kMaxCols = 3;     // NR: rows of W per tile

struct TileJob {
  const float* x = nullptr;     // packed X, first row of the tile, at k = 0
  int64_t ldx = 0;              // packed row stride (elements), a multiple of the group
  const uint16_t* w = nullptr;  // first W row of the tile, at k = 0
  int64_t ldw = 0;
  int64_t k = 0;           // true k: W is not read at or past it
  int64_t k0 = 0, k1 = 0;  // range of this call; k0 a multiple of kGroup, k1 ≤ padded k
  float* y = nullptr;      // Y at the tile's first row and column
  int64_t ldy = 0;
  bool first = true;  // first k range: Y = acc + beta·Y; later ones: Y += acc
  float beta = 0.0f;
  // W is streamed from memory once (few rows of X, nothing to reuse): prefetch each of the tile's
  // W rows kPrefetchAhead values ahead, and past the end of a row the same row of the next tile.
  bool stream = false;
  // Set on the first row tile of a block that does not stream (AVX2 tiles): the same W rows and
  // k-offsets in the block the driver walks next. The tile's loop prefetches them, one line per
  // row per group, spread through its work instead of in bursts between tiles.
  const uint16_t* next_block = nullptr;
};

// How far ahead a streaming tile prefetches W, in k-values, and how many k-values it runs between
// two rounds of prefetches. A tile reads NR short streams (one W row each, 8 KB at k = 4096), too
// short for the hardware prefetchers to ramp up on; measured on 2 Zen 5 cores at the avx2 level
// (n = 14336, k = 4096), the prefetches took m = 1 from 34 to 42 GB/s and m = 4 from 26 to 35 GB/s.
// Rounds of 256 values 1024 ahead beat 512 values 2048 ahead (three runs of each, interleaved,
// 2026-12-02: m = 4 33.6–36.2 GB/s against 30.1–32.6, m = 1 46.6–48.2 against 44.9–45.7; 4096 and
// 8192 ahead, and prefetcht2, were no better than 2048). The AVX2 4 × 3 tile spreads its
// prefetches through its loop instead of issuing rounds (groups_4x3 in gemm_tiles_avx2.cpp). At
// avx512bf16 a few rows go to the token-lane kernel (gemm_lanes.h), which needs no prefetches.
constexpr int64_t kPrefetchAhead = 1024;
constexpr int64_t kPrefetchChunk = 256;

// Prefetches W at k-values [from, from + kPrefetchChunk) of each of the NR rows of the job's
// tile; values at or past k fall on the same row of the next tile (prefetches never fault, so a
// tile at the end of W may point past it).
inline void prefetch_w(const TileJob& job, int rows, int64_t from) {
  constexpr int64_t kLine = 64 / sizeof(uint16_t);
  for (int j = 0; j < rows; ++j) {
    for (int64_t p = from; p < from + kPrefetchChunk; p += kLine) {
      const uint16_t* at =
          p < job.k ? job.w + j * job.ldw + p : job.w + (j + rows) * job.ldw + (p - job.k);
      // Not __builtin_prefetch: GCC 12 drops it from this loop.
      __asm__ volatile("prefetcht0 (%0)" : : "r"(at));
    }
  }
}

using TileFn = void (*)(const TileJob&);

// The tile of `rows` × `cols` (1..kMaxRows × 1..kMaxCols) for each level.
TileFn scalar_tile(int rows, int cols);
TileFn avx2_tile(int rows, int cols);

// The [kMaxRows][kMaxCols] table of a level's tiles, Tile<MR, NR>::fn at [MR - 1][NR - 1].
template <template <int, int> class Tile, int MR, int... NR>
constexpr std::array<TileFn, kMaxCols> row_of_tiles(std::integer_sequence<int, NR...>) {
  return {Tile<MR, NR + 1>::fn...};
}
template <template <int, int> class Tile, int... MR>
constexpr std::array<std::array<TileFn, kMaxCols>, kMaxRows> tile_table(
    std::integer_sequence<int, MR...>) {
  return {row_of_tiles<Tile, MR + 1>(std::make_integer_sequence<int, kMaxCols>{})...};
}
template <template <int, int> class Tile>
constexpr auto make_tile_table() {
  return tile_table<Tile>(std::make_integer_sequence<int, kMaxRows>{});
}

// Copies the `group` bf16 weights of a group that runs past k into `out`, zero-filled past k, so
// the tail group goes through the same code as the others without reading past the row.
inline void copy_tail_group(const uint16_t* w_group, int64_t valid, uint16_t* out,
                            int64_t group = kGroup) {
  for (int64_t t = 0; t < group; ++t) out[t] = t < valid ? w_group[t] : uint16_t(0);
}

// Adds a sum over one k range into y: the first range sets y = sum + beta·y (beta 0 overwrites,
// whatever y held), later ranges add to it. The tiles' rule, and the token lanes' (gemm_lanes.h).
inline void add_range_sum(float& y, float sum, bool first, float beta) {
  if (!first) {
    y += sum;
  } else {
    y = beta != 0.0f ? sum + beta * y : sum;
  }
}

// Writes one finished accumulator to Y under the job's first/beta rule.
inline void store_sum(const TileJob& job, int i, int j, float sum) {
  add_range_sum(job.y[i * job.ldy + j], sum, job.first, job.beta);
}

}  // namespace sluice::cpu::tiles
