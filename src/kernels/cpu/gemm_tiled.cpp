#include "kernels/cpu/gemm_tiled.h"

#include <algorithm>

#include "kernels/cpu/column_split.h"
#include "kernels/cpu/gemm_lanes.h"
#include "kernels/cpu/gemm_tiles.h"
#include "kernels/cpu/scratch.h"

namespace sluice::cpu {
namespace {

using tiles::kGroup;
using tiles::kMaxCols;
using tiles::kMaxRows;

// Rows of X packed at a time: bounds the scratch (256 rows × 14336 × 4 B = 14.7 MB at the widest
// Mixtral input) while each weight byte brought from DRAM still meets 256 rows (≥ 256 FLOP per
// byte, far above the ≈ 7 FLOP/byte where an AVX2 machine turns compute bound).
constexpr int64_t kRowBlock = 256;
// With more than one tile of rows, k is walked in ranges of kDepth values and W in blocks of
// kColBlock rows, so a block of W (96 × 1024 × 2 B = 192 KB) stays in L2 while every tile of rows
// passes over it, and each tile's activations (4 × 1024 × 4 B = 16 KB) stay in L1.
constexpr int64_t kDepth = 1024;
constexpr int64_t kColBlock = 32 * kMaxCols;
int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

// One row of X into the "evens then odds" groups of gemm_tiles.h, zero-padded to `ldp`.
template <typename Load>
void pack_row(Load load, int64_t k, float* dst, int64_t ldp) {
  for (int64_t g = 0; g < ldp; g += kGroup) {
    for (int64_t t = 0; t < kGroup; ++t) {
      const int64_t slot = g + (t % 2) * (kGroup / 2) + t / 2;
      dst[slot] = g + t < k ? load(g + t) : 0.0f;
    }
  }
}

void pack_row(const TiledGemmArgs& a, int64_t row, float* dst, int64_t ldp) {
  if (a.x_dtype == DType::BF16) {
    const uint16_t* x = static_cast<const uint16_t*>(a.x) + row * a.ldx;
    pack_row([x](int64_t p) { return bf16_to_f32(x[p]); }, a.k, dst, ldp);
  } else if (a.round_x_to_bf16) {
    const float* x = static_cast<const float*>(a.x) + row * a.ldx;
    pack_row([x](int64_t p) { return bf16_to_f32(f32_to_bf16(x[p])); }, a.k, dst, ldp);
  } else {
    const float* x = static_cast<const float*>(a.x) + row * a.ldx;
    pack_row([x](int64_t p) { return x[p]; }, a.k, dst, ldp);
  }
}

// Whether the token lanes take the call: at avx512bf16 and above, where X is bf16 or rounded to
// bf16 anyway (`vdpbf16ps` multiplies bf16 activations).
bool lanes_take(const TiledGemmArgs& a, IsaLevel level) {
  return level >= IsaLevel::kAvx512Bf16 && (a.x_dtype == DType::BF16 || a.round_x_to_bf16);
}

// Rows [r0, r0 + rows) of X, packed for the tiles into `out`.
void pack_rows(const TiledGemmArgs& a, int64_t r0, int64_t rows, float* out, int64_t ldp) {
#pragma omp parallel for schedule(static) if (rows * a.k >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) pack_row(a, r0 + r, out + r * ldp, ldp);
}

struct Block {
  const TiledGemmArgs* a;
  const float* packed;  // rows [r0, r0 + rows) of X, packed for the tiles
  int64_t ldp;          // packed row stride, in elements
  int64_t r0, rows;
  IsaLevel level;
};

tiles::TileFn tile_for(IsaLevel level, int rows, int cols) {
  return level >= IsaLevel::kAvx2 ? tiles::avx2_tile(rows, cols) : tiles::scalar_tile(rows, cols);
}

// A block of W: rows [c0, c1) at k-values [k0, k1).
struct WBlock {
  int64_t c0, c1, k0, k1;
};

// Brings the next block of W (the same W rows at the next k range, or the next W rows at the
// first one) into L2 while the tiles work on the current block, a share of its cache lines before
// each tile: the first tile of rows to meet a block then finds it in cache instead of waiting on
// DRAM at every line. For the tiles that do not fetch it from inside their loops (the scalar
// ones).
class NextBlockPrefetcher {
 public:
  NextBlockPrefetcher(const TiledGemmArgs& a, const WBlock& next, int64_t tiles)
      : w_(a.w),
        ldw_(a.ldw),
        c_(next.c0),
        c_end_(next.c1),
        k0_(next.k0),
        k1_(std::min(next.k1, a.k)),
        p_(next.k0) {
    const int64_t lines = (c_end_ - c_) * ((k1_ - k0_ + kLine - 1) / kLine);
    per_tile_ = (lines + tiles - 1) / std::max<int64_t>(1, tiles);
  }

  void before_tile() {
    for (int64_t l = 0; l < per_tile_ && c_ < c_end_; ++l) {
      // prefetcht1: into L2 (GCC drops __builtin_prefetch from some loops, see gemm_tiles.h).
      __asm__ volatile("prefetcht1 (%0)" : : "r"(w_ + c_ * ldw_ + p_));
      p_ += kLine;
      if (p_ >= k1_) p_ = k0_, ++c_;
    }
  }

 private:
  static constexpr int64_t kLine = 64 / sizeof(uint16_t);
  const uint16_t* w_;
  int64_t ldw_, c_, c_end_, k0_, k1_, p_, per_tile_ = 0;
};

// Every packed row of the block `b` against the block `w` of W, tile by tile; `next` is the block
// of W walked after it, whose lines the tiles bring into cache while they work.
void run_block(const Block& b, const WBlock& w, const WBlock& next, bool stream) {
  const TiledGemmArgs& a = *b.a;
  tiles::TileJob job{.ldx = b.ldp,
                     .ldw = a.ldw,
                     .k = a.k,
                     .k0 = w.k0,
                     .k1 = w.k1,
                     .ldy = a.ldy,
                     .first = w.k0 == 0,
                     .beta = a.beta,
                     .stream = stream};
  // The AVX2 tiles fetch the next block from inside their loops (TileJob::next_block): on 2
  // Milan cores, m = 8 went from 8.4–8.7 to 7.1–7.2 ms and m = 12 from 11.6 to 10.0–10.1 ms
  // against the bursts of NextBlockPrefetcher (n = 14336, k = 4096; bench/RESULTS.md).
  const bool tiles_fetch_next_block = b.level >= IsaLevel::kAvx2;
  const int64_t row_tiles = row_tile_count(b.rows, kMaxRows);
  NextBlockPrefetcher prefetcher(
      a, next, stream ? 0 : row_tiles * ((w.c1 - w.c0 + kMaxCols - 1) / kMaxCols));
  // Rows split evenly: at m = 5, 9, 13 and 17 (n = 14336, k = 4096, 2 Milan cores at the avx2
  // level) that took 6.3–6.8 → 5.8–6.6, 9.1–9.2 → 8.5–8.8, 11.6–12.5 → 11.2–11.4 and
  // 14.8 → 14.1–14.4 ms, three interleaved runs (bench/RESULTS.md).
  for_each_row_tile(b.rows, kMaxRows, [&](int64_t t, int64_t i, int64_t rows) {
    for (int64_t j = w.c0; j < w.c1; j += kMaxCols) {
      const int cols = int(std::min<int64_t>(kMaxCols, w.c1 - j));
      job.x = b.packed + i * b.ldp;
      job.w = a.w + j * a.ldw;
      job.y = a.y + (b.r0 + i) * a.ldy + j;
      const int64_t next_row = j - w.c0 + next.c0;
      job.next_block = tiles_fetch_next_block && t == 0 && next_row < next.c1
                           ? a.w + next_row * a.ldw + next.k0
                           : nullptr;
      if (!stream && !tiles_fetch_next_block) prefetcher.before_tile();
      tile_for(b.level, int(rows), cols)(job);
    }
  });
}

// W rows [c0, c1) against every packed row of the block: one pass over W, streamed, for a single
// tile of rows; otherwise blocks of kColBlock rows × kDepth values, each kept in L2 while every
// tile of rows passes over it.
void run_columns(const Block& b, int64_t c0, int64_t c1) {
  const bool stream = b.rows <= kMaxRows;
  const int64_t k_padded = round_up(b.a->k, kGroup);
  const int64_t depth = stream ? k_padded : kDepth;
  const int64_t col_block = stream ? c1 - c0 : kColBlock;
  for (int64_t cb = c0; cb < c1; cb += col_block) {
    const int64_t cb_end = std::min(c1, cb + col_block);
    for (int64_t k0 = 0; k0 < k_padded; k0 += depth) {
      const bool last_range = k0 + depth >= k_padded;
      const int64_t next_cb = last_range ? cb_end : cb;
      const int64_t next_k0 = last_range ? 0 : k0 + depth;
      run_block(b, {cb, cb_end, k0, std::min(k_padded, k0 + depth)},
                {next_cb, std::min(c1, next_cb + col_block), next_k0, next_k0 + depth}, stream);
    }
  }
}

}  // namespace

void pack_row_bf16(const TiledGemmArgs& a, int64_t row, uint16_t* dst, int64_t ldp) {
  if (a.x_dtype == DType::BF16) {
    const uint16_t* x = static_cast<const uint16_t*>(a.x) + row * a.ldx;
    std::copy(x, x + a.k, dst);
  } else {
    const float* x = static_cast<const float*>(a.x) + row * a.ldx;
    for (int64_t p = 0; p < a.k; ++p) dst[p] = f32_to_bf16(x[p]);
  }
  std::fill(dst + a.k, dst + ldp, uint16_t(0));
}

void tiled_gemm(const TiledGemmArgs& a, IsaLevel level) {
  if (lanes_take(a, level)) return lane_gemm_avx512bf16(a);
  // One spare group per packed row: with k a multiple of 1024 (every real model), rows exactly
  // k apart would all fall into the same L1 sets as each other and as W's rows.
  const int64_t ldp = round_up(a.k, kGroup) + kGroup;
  for (int64_t r0 = 0; r0 < a.m; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, a.m - r0);
    float* packed = thread_scratch<0, float>(size_t(rows * ldp));
    pack_rows(a, r0, rows, packed, ldp);
    const Block b{&a, packed, ldp, r0, rows, level};
    for_each_thread_columns(a.n, kMaxCols, [&](int64_t c0, int64_t c1) { run_columns(b, c0, c1); });
  }
}

const char* tiled_gemm_name(IsaLevel level) {
  if (level >= IsaLevel::kAvx512Bf16) return "sluice:avx512bf16 lanes";
  return level >= IsaLevel::kAvx2 ? "sluice:avx2" : "sluice:scalar";
}

}  // namespace sluice::cpu
