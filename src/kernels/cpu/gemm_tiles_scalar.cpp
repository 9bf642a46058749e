// The scalar-level tiles: plain C++ over the packed layout of gemm_tiles.h (the build's
// x86-64-v2 baseline; the compiler may use SSE).
#include "core/dtype.h"
#include "kernels/cpu/gemm_tiles.h"

namespace sluice::cpu::tiles {
namespace {

template <int MR, int NR>
void tile(const TileJob& job) {
  float acc[MR][NR] = {};
  uint16_t tail[NR][kGroup];
  for (int64_t p = job.k0; p < job.k1; p += kGroup) {
    const uint16_t* w[NR];
    for (int j = 0; j < NR; ++j) {
      w[j] = job.w + j * job.ldw + p;
      if (p + kGroup > job.k) {
        copy_tail_group(w[j], job.k - p, tail[j]);
        w[j] = tail[j];
      }
    }
    for (int t = 0; t < kGroup / 2; ++t) {
      for (int i = 0; i < MR; ++i) {
        const float even = job.x[i * job.ldx + p + t];
        const float odd = job.x[i * job.ldx + p + kGroup / 2 + t];
        for (int j = 0; j < NR; ++j)
          acc[i][j] += even * bf16_to_f32(w[j][2 * t]) + odd * bf16_to_f32(w[j][2 * t + 1]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) store_sum(job, i, j, acc[i][j]);
}

template <int MR, int NR>
struct Tile {
  static constexpr TileFn fn = &tile<MR, NR>;
};

}  // namespace

TileFn scalar_tile(int rows, int cols) {
  static constexpr auto table = make_tile_table<Tile>();
  return table[rows - 1][cols - 1];
}

}  // namespace sluice::cpu::tiles
