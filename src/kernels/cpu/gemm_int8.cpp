#include "kernels/cpu/gemm_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/column_split.h"
#include "kernels/cpu/gemm_int8_kernels.h"
#include "kernels/cpu/quant_group.h"

namespace sluice::cpu {
namespace {

using int8::Activations;
using int8::Kernels;
using int8::Tile;

// Rows of X that share one pass over W: the float accumulators of a block (rows × 16 fp32 =
// 8 KB) stay in L1, and the quantized rows (rows × k × 2 bytes = 1 MB at k = 4096) in L2/L3, so
// W is read from DRAM once per 128 rows: at m ≥ 128 the kernel is compute bound by ~100×.
constexpr int64_t kRowsPerPass = 128;
// k per sweep over the row tiles, times the blocks of a tile: 16 rows × 1024 bytes of W = 16 KB,
// reused from L1 by every tile of 4 rows.
constexpr int64_t kBytesPerSweep = 1024;
// Below this many multiply-adds a call runs on one thread (the fork costs ~µs).
constexpr int64_t kParallelMacs = int64_t(1) << 18;

// ---- activations ----------------------------------------------------------------------------

struct ActivationBuffers {
  std::vector<int8_t> q;
  std::vector<uint8_t> abs;
  std::vector<float> scale;
  std::vector<int32_t> offset_sum, offset_sum4;
  Activations view;
};

void allocate_activations(ActivationBuffers& b, int64_t m, int64_t k, int64_t groups) {
  b.q.resize(size_t(m * k));
  b.abs.resize(size_t(m * k));
  b.scale.resize(size_t(m * groups));
  b.offset_sum.resize(size_t(m * groups));
  b.offset_sum4.resize(size_t(m * groups));
  b.view = {.k = k,
            .groups = groups,
            .q = b.q.data(),
            .abs = b.abs.data(),
            .scale = b.scale.data(),
            .offset_sum = b.offset_sum.data(),
            .offset_sum4 = b.offset_sum4.data()};
}

// Quantizes row i of X into the buffers; `row` is scratch of k floats. Plain C++ shared by
// every level, so the quantized activations are the same bytes everywhere.
void quantize_activation_row(const GemmInt8Args& a, int64_t k, int64_t group, int64_t i, float* row,
                             ActivationBuffers& b) {
  const int64_t ldx = a.ldx ? a.ldx : k, groups = k / group;
  if (a.x_dtype == DType::F32)
    std::memcpy(row, static_cast<const float*>(a.x) + i * ldx, size_t(k) * sizeof(float));
  else
    for (int64_t p = 0; p < k; ++p)
      row[p] = bf16_to_f32(static_cast<const uint16_t*>(a.x)[i * ldx + p]);
  int8_t* q = b.q.data() + i * k;
  for (int64_t g = 0; g < groups; ++g) {
    b.scale[size_t(i * groups + g)] =
        quant::quantize_group(row + g * group, group, 127, q + g * group);
    int32_t sum = 0;
    for (int64_t p = g * group; p < (g + 1) * group; ++p) sum += q[p];
    b.offset_sum[size_t(i * groups + g)] = -128 * sum;
    b.offset_sum4[size_t(i * groups + g)] = -8 * sum;
  }
  for (int64_t p = 0; p < k; ++p) b.abs[size_t(i * k + p)] = uint8_t(std::abs(q[p]));
}

// ---- argument checks ------------------------------------------------------------------------

void check_args(const GemmInt8Args& a) {
  if (a.w == nullptr || a.w->data == nullptr)
    fail("gemm_int8: field 'w': expected packed int8 or int4 weights, got none");
  const QuantView& w = *a.w;
  if (reinterpret_cast<uintptr_t>(w.data) % 64 != 0)
    fail("gemm_int8: field 'w.data': expected a 64-byte aligned packed matrix, got address {}",
         static_cast<const void*>(w.data));
  if (a.m < 0) fail("gemm_int8: field 'm': expected >= 0, got {}", a.m);
  if (a.m > 0 && (a.x == nullptr || a.y == nullptr))
    fail("gemm_int8: fields 'x' and 'y': expected non-null pointers for m = {}", a.m);
  if (a.x_dtype != DType::F32 && a.x_dtype != DType::BF16)
    fail("gemm_int8: field 'x_dtype': expected F32 or BF16, got {}", dtype_name(a.x_dtype));
  if (a.ldx != 0 && a.ldx < w.k)
    fail("gemm_int8: field 'ldx': expected 0 or >= k = {}, got {}", w.k, a.ldx);
  if (a.ldy != 0 && a.ldy < w.n)
    fail("gemm_int8: field 'ldy': expected 0 or >= n = {}, got {}", w.n, a.ldy);
}

// ---- scalar level ---------------------------------------------------------------------------

// acc[r] = fma(float(d[r]), sx · sw[r], acc[r]) for row `row` of X and group g.
void fold_scalar(const Activations& x, int64_t row, int64_t g, const int32_t* d, const float* sw,
                 float* acc) {
  const float sx = x.scale[row * x.groups + g];
  for (int64_t r = 0; r < kInt8BlockRows; ++r) acc[r] = std::fma(float(d[r]), sx * sw[r], acc[r]);
}

void tile_scalar(const Tile& t, int64_t rows) {
  const QuantView& w = *t.w;
  const Activations& x = *t.x;
  for (int64_t g = t.g0; g < t.g1; ++g) {
    const int8_t* wg = int8::block_group(w, t.block, g);
    const float* sw = int8::block_scales(w, t.x->groups, t.block, g);
    for (int64_t i = 0; i < rows; ++i) {
      const int8_t* xq = x.q + (t.row + i) * x.k + g * w.group_size;
      int32_t d[kInt8BlockRows] = {};
      for (int64_t quad = 0; quad < w.group_size / 4; ++quad)
        for (int64_t r = 0; r < kInt8BlockRows; ++r)
          for (int64_t b = 0; b < 4; ++b)
            d[r] += int32_t(xq[quad * 4 + b]) * wg[(quad * kInt8BlockRows + r) * 4 + b];
      fold_scalar(x, t.row + i, g, d, sw, t.acc + i * t.ldacc);
    }
  }
}

// int4: each byte of an octet line holds k = 8o + b (low nibble) and 8o + 4 + b (high), as q + 8.
void tile4_scalar(const Tile& t, int64_t rows) {
  const QuantView& w = *t.w;
  const Activations& x = *t.x;
  for (int64_t g = t.g0; g < t.g1; ++g) {
    const uint8_t* wg = int8::block_group4(w, t.block, g);
    const float* sw = int8::block_scales(w, t.x->groups, t.block, g);
    for (int64_t i = 0; i < rows; ++i) {
      const int8_t* xq = x.q + (t.row + i) * x.k + g * w.group_size;
      int32_t d[kInt8BlockRows] = {};
      for (int64_t octet = 0; octet < w.group_size / 8; ++octet)
        for (int64_t r = 0; r < kInt8BlockRows; ++r)
          for (int64_t b = 0; b < 4; ++b) {
            const uint8_t u = wg[(octet * kInt8BlockRows + r) * 4 + b];
            d[r] += int32_t(xq[octet * 8 + b]) * ((u & 15) - 8) +
                    int32_t(xq[octet * 8 + 4 + b]) * ((u >> 4) - 8);
          }
      fold_scalar(x, t.row + i, g, d, sw, t.acc + i * t.ldacc);
    }
  }
}

template <int kRows>
void tile_scalar_rows(const Tile& t) {
  tile_scalar(t, kRows);
}

template <int kRows>
void tile4_scalar_rows(const Tile& t) {
  tile4_scalar(t, kRows);
}

void store_scalar(const float* acc, int64_t ldacc, int64_t rows, int64_t cols, float* y,
                  int64_t ldy, float beta) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = acc[i * ldacc + c];
      float& out = y[i * ldy + c];
      out = beta == 0.0f ? v : std::fma(beta, out, v);
    }
}

Kernels kernels_for(Int8Dot dot) {
  switch (dot) {
    case Int8Dot::kScalar:
      return int8::kernels_scalar();
    case Int8Dot::kAvx2Maddubs:
      return int8::kernels_avx2_maddubs();
    case Int8Dot::kAvxVnni:
      return int8::kernels_avx_vnni();
    case Int8Dot::kAvx512Vnni:
      return int8::kernels_avx512_vnni();
    case Int8Dot::kAmx:
      break;
  }
  fail("gemm_int8: no kernel for the int8 instruction {}", int8_dot_name(dot));
}

// ---- driver ---------------------------------------------------------------------------------

struct Pass {
  const Kernels* kernels;
  const Activations* x;
  const GemmInt8Args* args;
  int64_t row0, rows;  // rows of X in this pass over W
};

// All rows of a pass against blocks [block, block + blocks) of 16 columns: sweeps of k (so the W
// of a sweep, ≤ kBytesPerSweep per row of W, stays in L1), within a sweep tiles of up to 4 rows
// split evenly (at the avx2 level on 2 Milan cores, n = 14336, k = 4096: int8 m = 5 3.25–3.39 →
// 3.09–3.25 ms, m = 13 7.7–7.9 → 7.4–7.7; int4 unchanged), then the store of each block.
void run_blocks(const Pass& p, int64_t block, int64_t blocks, float* acc) {
  const QuantView& w = *p.args->w;
  const int8::TileFn* tiles = w.format == QuantFormat::kInt4 ? p.kernels->tile4 : p.kernels->tile;
  const int64_t ldacc = blocks * kInt8BlockRows;
  std::fill(acc, acc + p.rows * ldacc, 0.0f);
  const int64_t groups_per_sweep = std::max<int64_t>(1, kBytesPerSweep / (w.group_size * blocks));
  for (int64_t g0 = 0; g0 < w.groups(); g0 += groups_per_sweep)
    for_each_row_tile(p.rows, int8::kMaxTileRows, [&](int64_t, int64_t i, int64_t rows) {
      tiles[rows - 1]({.x = p.x,
                       .w = &w,
                       .row = p.row0 + i,
                       .block = block,
                       .blocks = blocks,
                       .g0 = g0,
                       .g1 = std::min(w.groups(), g0 + groups_per_sweep),
                       .acc = acc + i * ldacc,
                       .ldacc = ldacc});
    });
  const int64_t ldy = p.args->ldy ? p.args->ldy : w.n;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t col0 = (block + b) * kInt8BlockRows;
    p.kernels->store(acc + b * kInt8BlockRows, ldacc, p.rows, std::min(kInt8BlockRows, w.n - col0),
                     p.args->y + p.row0 * ldy + col0, ldy, p.args->beta);
  }
}

}  // namespace

namespace int8 {
Kernels kernels_scalar() {
  return {
      .tile = {tile_scalar_rows<1>, tile_scalar_rows<2>, tile_scalar_rows<3>, tile_scalar_rows<4>},
      .tile4 = {tile4_scalar_rows<1>, tile4_scalar_rows<2>, tile4_scalar_rows<3>,
                tile4_scalar_rows<4>},
      .store = store_scalar};
}
}  // namespace int8

Int8Dot gemm_int8_dot() {
  const Int8Dot dot = int8_dot();
  if (dot != Int8Dot::kAmx) return dot;
  // The amx level runs the AVX512-VNNI kernel; every AMX CPU has AVX512-VNNI, but stay correct
  // if a hypervisor hides it.
  const CpuFeatures& f = cpu_features();
  if (f.avx512_vnni) return Int8Dot::kAvx512Vnni;
  return f.avx_vnni ? Int8Dot::kAvxVnni : Int8Dot::kAvx2Maddubs;
}

void gemm_int8(const GemmInt8Args& args) {
  gemm_int8_using(gemm_int8_dot(), args);
}

std::vector<Int8Dot> gemm_int8_dots_available() {
  std::vector<Int8Dot> dots = {Int8Dot::kScalar};
  const CpuFeatures& f = cpu_features();
  if (isa_at_least(IsaLevel::kAvx2)) dots.push_back(Int8Dot::kAvx2Maddubs);
  if (isa_at_least(IsaLevel::kAvx2) && f.avx_vnni) dots.push_back(Int8Dot::kAvxVnni);
  if (isa_at_least(IsaLevel::kAvx512) && f.avx512_vnni) dots.push_back(Int8Dot::kAvx512Vnni);
  return dots;
}

// Roofline, Mixtral expert shape n = 14336, k = 4096, group 128: W is 58.7 MB of int8 plus
// 1.8 MB of scales, 2·m·n·k int ops. On the 2-core AVX2 development machine (Zen 3 class), the
// AVX2 tile's instruction mix peaks at ~220 GOP/s (see gemm_int8_avx2.cpp) and DRAM reads at
// ~19-21 GB/s, so the ridge point is m ≈ 220 / (2 · 20) ≈ 5: at m ≤ 4 the kernel streams W
// at DRAM speed, from m ≈ 8 on it is compute bound and W comes from L1/L2.
void gemm_int8_using(Int8Dot dot, const GemmInt8Args& args) {
  check_args(args);
  const auto dots = gemm_int8_dots_available();
  if (std::find(dots.begin(), dots.end(), dot) == dots.end())
    fail(
        "gemm_int8: the int8 instruction {} is not available at the isa level {} of this CPU "
        "({})",
        int8_dot_name(dot), isa_name(isa_level()), cpu_model_name());
  const QuantView& w = *args.w;
  if (args.m == 0) return;
  const Kernels kernels = kernels_for(dot);
  ActivationBuffers xb;
  allocate_activations(xb, args.m, w.k, w.groups());
#pragma omp parallel if (args.m * w.n * w.k >= kParallelMacs)
  {
    std::vector<float> row(size_t(w.k));
    std::vector<float> acc(size_t(kRowsPerPass * kernels.max_blocks * kInt8BlockRows));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < args.m; ++i)
      quantize_activation_row(args, w.k, w.group_size, i, row.data(), xb);
    for (int64_t row0 = 0; row0 < args.m; row0 += kRowsPerPass) {
      const Pass pass{.kernels = &kernels,
                      .x = &xb.view,
                      .args = &args,
                      .row0 = row0,
                      .rows = std::min(kRowsPerPass, args.m - row0)};
      // Dynamic: on a shared VM one core can lose a share of its time to a neighbour, and a static
      // split then leaves the other waiting at the end of the call.
      const int64_t span = kernels.max_blocks, spans = (w.blocks() + span - 1) / span;
#pragma omp for schedule(dynamic) nowait
      for (int64_t s = 0; s < spans; ++s)
        run_blocks(pass, s * span, std::min(span, w.blocks() - s * span), acc.data());
    }
  }
}

void gemm_int8_reference(const GemmInt8Args& args) {
  check_args(args);
  const QuantView& w = *args.w;
  ActivationBuffers xb;
  allocate_activations(xb, args.m, w.k, w.groups());
  std::vector<float> row(size_t(w.k));
  for (int64_t i = 0; i < args.m; ++i)
    quantize_activation_row(args, w.k, w.group_size, i, row.data(), xb);
  const int64_t ldy = args.ldy ? args.ldy : w.n;
  for (int64_t i = 0; i < args.m; ++i)
    for (int64_t j = 0; j < w.n; ++j) {
      float acc = 0.0f;
      for (int64_t g = 0; g < w.groups(); ++g) {
        int32_t d = 0;
        for (int64_t p = g * w.group_size; p < (g + 1) * w.group_size; ++p)
          d += int32_t(xb.q[size_t(i * w.k + p)]) * w.q(j, p);
        acc = std::fma(float(d), xb.scale[size_t(i * w.groups() + g)] * w.scale(j, g), acc);
      }
      float& out = args.y[i * ldy + j];
      out = args.beta == 0.0f ? acc : std::fma(args.beta, out, acc);
    }
}

}  // namespace sluice::cpu
