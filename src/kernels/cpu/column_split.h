// How sluice's GEMMs share W among the OpenMP threads.
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

}  // namespace sluice::cpu
