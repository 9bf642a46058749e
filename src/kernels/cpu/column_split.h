// How sluice's GEMMs split their work: W's rows among the OpenMP threads, X's rows into tiles.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace sluice::cpu {

// Calls run(c0, c1) on each thread with a contiguous share [c0, c1) of W's n rows, in whole tiles
// of `tile` rows, so every weight byte is read by one thread only.
template <typename Run>
void for_each_thread_columns(int64_t n, int64_t tile, const Run& run) {
  const int64_t tiles = (n + tile - 1) / tile;
  const int threads = int(std::min<int64_t>(omp_get_max_threads(), tiles));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t c0 = std::min(n, tiles * t / nt * tile);
    const int64_t c1 = std::min(n, tiles * (t + 1) / nt * tile);
    if (c0 < c1) run(c0, c1);
  }
}

// The fewest tiles of at most `max_rows` rows that hold `rows` rows.
inline int64_t row_tile_count(int64_t rows, int64_t max_rows) {
  return (rows + max_rows - 1) / max_rows;
}

// Calls run(t, first_row, tile_rows) for each of the row_tile_count tiles, the rows split as
// evenly as possible (13 rows in tiles of 4: 4, 3, 3, 3 rather than 4, 4, 4, 1), so that no tile
// of one row, which loads as many weights as it does multiply-adds, takes a pass over W of its
// own.

template <typename Run>
void for_each_row_tile(int64_t rows, int64_t max_rows, const Run& run) {
  const int64_t tiles = row_tile_count(rows, max_rows);
  for (int64_t t = 0, first = 0; t < tiles; ++t) {
    const int64_t tile_rows = rows / tiles + (t < rows % tiles ? 1 : 0);
    run(t, first, tile_rows);
    first += tile_rows;
  }
}

}  // namespace sluice::cpu
