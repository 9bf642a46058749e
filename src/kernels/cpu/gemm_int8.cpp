#include "kernels/cpu/gemm_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm_int8_kernels.h"

namespace sluice::cpu {
namespace {

using int8::Activations;
using int8::Kernels;
using int8::Tile;

// Rows of X that share one pass over W: the float accumulators of a block (rows × 16 fp32 =
// 8 KB) stay in L1, and the quantized rows (rows × k × 2 bytes = 1 MB at k = 4096) in L2/L3, so
// W is read from DRAM once per 128 rows: at m ≥ 128 the kernel is compute bound by ~100×.
constexpr int64_t kRowsPerPass = 128;
// k per sweep over the row tiles: 16 rows × 1024 bytes of W = 16 KB, reused from L1 by every
// tile of 4 rows.
constexpr int64_t kBytesPerSweep = 1024;
// Below this many multiply-adds a call runs on one thread (the fork costs ~µs).
constexpr int64_t kParallelMacs = int64_t(1) << 18;

template <typename T>
std::unique_ptr<T[], FreeDeleter> aligned_zeros(size_t count) {
  const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (p == nullptr) fail("int8 weights: out of memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

void check_shape(const char* what, int64_t n, int64_t k, int64_t group_size) {
  if (n <= 0) fail("{}: field 'n': expected > 0 rows, got {}", what, n);
  if (group_size < 4 || group_size > kInt8MaxGroup || group_size % 4 != 0)
    fail("{}: field 'group_size': expected a multiple of 4 in [4, {}], got {}", what, kInt8MaxGroup,
         group_size);
  if (k <= 0 || k % group_size != 0)
    fail("{}: field 'k': expected a positive multiple of the group size {}, got {}", what,
         group_size, k);
}

Int8Weights allocate(int64_t n, int64_t k, int64_t group_size) {
  Int8Weights w;
  w.n = n;
  w.k = k;
  w.group_size = group_size;
  w.packed = aligned_zeros<int8_t>(size_t(w.blocks() * kInt8BlockRows * k));
  w.scales = aligned_zeros<float>(size_t(w.blocks() * kInt8BlockRows * w.groups()));
  return w;
}

size_t packed_index(const Int8Weights& w, int64_t j, int64_t p) {
  const int64_t block = j / kInt8BlockRows, r = j % kInt8BlockRows;
  return size_t(block * kInt8BlockRows * w.k + (p / 4) * kInt8BlockRows * 4 + r * 4 + p % 4);
}

size_t scale_index(const Int8Weights& w, int64_t j, int64_t g) {
  const int64_t block = j / kInt8BlockRows, r = j % kInt8BlockRows;
  return size_t((block * w.groups() + g) * kInt8BlockRows + r);
}

// Symmetric quantization of one group, the same for weights and activations: the scale is
// max|v| / 127 and q = round-to-nearest-even(v · (127 / max|v|)), which cannot exceed 127 in
// magnitude (v ≤ max|v| and the two roundings add at most 2⁻²² to 127). Returns the scale.
// A group holding an inf or NaN gets q = 0 and scale NaN, so the outputs it feeds are NaN, as
// they would be (or inf) in a float GEMM.
float quantize_group(const float* v, int64_t count, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t p = 0; p < count; ++p) {
    amax = std::max(amax, std::fabs(v[p]));
    finite = finite && std::isfinite(v[p]);
  }
  if (!finite) {
    std::fill(q, q + count, int8_t(0));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t p = 0; p < count; ++p) q[p] = int8_t(std::nearbyint(v[p] * inv));
  return amax / 127.0f;
}

// ---- activations ----------------------------------------------------------------------------

struct ActivationBuffers {
  std::vector<int8_t> q;
  std::vector<uint8_t> abs;
  std::vector<float> scale;
  std::vector<int32_t> offset_sum;
  Activations view;
};

void allocate_activations(ActivationBuffers& b, int64_t m, int64_t k, int64_t groups) {
  b.q.resize(size_t(m * k));
  b.abs.resize(size_t(m * k));
  b.scale.resize(size_t(m * groups));
  b.offset_sum.resize(size_t(m * groups));
  b.view = {.k = k,
            .groups = groups,
            .q = b.q.data(),
            .abs = b.abs.data(),
            .scale = b.scale.data(),
            .offset_sum = b.offset_sum.data()};
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
    b.scale[size_t(i * groups + g)] = quantize_group(row + g * group, group, q + g * group);
    int32_t sum = 0;
    for (int64_t p = g * group; p < (g + 1) * group; ++p) sum += q[p];
    b.offset_sum[size_t(i * groups + g)] = -128 * sum;
  }
  for (int64_t p = 0; p < k; ++p) b.abs[size_t(i * k + p)] = uint8_t(std::abs(q[p]));
}

// ---- argument checks ------------------------------------------------------------------------

void check_args(const GemmInt8Args& a) {
  if (a.w == nullptr || !a.w->packed)
    fail("gemm_int8: field 'w': expected packed int8 weights, got none");
  const Int8Weights& w = *a.w;
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

void tile_scalar(const Tile& t, int64_t rows) {
  const Int8Weights& w = *t.w;
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
      const float sx = x.scale[(t.row + i) * x.groups + g];
      float* acc = t.acc + i * kInt8BlockRows;
      for (int64_t r = 0; r < kInt8BlockRows; ++r)
        acc[r] = std::fma(float(d[r]), sx * sw[r], acc[r]);
    }
  }
}

template <int kRows>
void tile_scalar_rows(const Tile& t) {
  tile_scalar(t, kRows);
}

void store_scalar(const float* acc, int64_t rows, int64_t cols, float* y, int64_t ldy, float beta) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = acc[i * kInt8BlockRows + c];
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

// All rows of a pass against one block of 16 columns: sweeps of k (so the W of a sweep stays in
// L1), and within a sweep tiles of up to 4 rows, then the store.
void run_block(const Pass& p, int64_t block, float* acc) {
  const Int8Weights& w = *p.args->w;
  std::fill(acc, acc + p.rows * kInt8BlockRows, 0.0f);
  const int64_t groups_per_sweep = std::max<int64_t>(1, kBytesPerSweep / w.group_size);
  for (int64_t g0 = 0; g0 < w.groups(); g0 += groups_per_sweep)
    for (int64_t i = 0; i < p.rows; i += int8::kMaxTileRows) {
      const int64_t rows = std::min<int64_t>(int8::kMaxTileRows, p.rows - i);
      p.kernels->tile[rows - 1]({.x = p.x,
                                 .w = &w,
                                 .row = p.row0 + i,
                                 .block = block,
                                 .g0 = g0,
                                 .g1 = std::min(w.groups(), g0 + groups_per_sweep),
                                 .acc = acc + i * kInt8BlockRows});
    }
  const int64_t ldy = p.args->ldy ? p.args->ldy : w.n, col0 = block * kInt8BlockRows;
  p.kernels->store(acc, p.rows, std::min(kInt8BlockRows, w.n - col0),
                   p.args->y + p.row0 * ldy + col0, ldy, p.args->beta);
}

}  // namespace

namespace int8 {
Kernels kernels_scalar() {
  return {
      .tile = {tile_scalar_rows<1>, tile_scalar_rows<2>, tile_scalar_rows<3>, tile_scalar_rows<4>},
      .store = store_scalar};
}
}  // namespace int8

int8_t Int8Weights::q(int64_t j, int64_t p) const {
  return packed[packed_index(*this, j, p)];
}

float Int8Weights::scale(int64_t j, int64_t g) const {
  return scales[scale_index(*this, j, g)];
}

size_t Int8Weights::bytes() const {
  return size_t(blocks() * kInt8BlockRows) * size_t(k + groups() * int64_t(sizeof(float)));
}

Int8Weights Int8Weights::clone() const {
  Int8Weights c = allocate(n, k, group_size);
  std::memcpy(c.packed.get(), packed.get(), size_t(blocks() * kInt8BlockRows * k));
  std::memcpy(c.scales.get(), scales.get(),
              size_t(blocks() * kInt8BlockRows * groups()) * sizeof(float));
  return c;
}

Int8Weights quantize_weights_int8(const uint16_t* w, int64_t n, int64_t k, int64_t group_size) {
  check_shape("quantize_weights_int8", n, k, group_size);
  Int8Weights out = allocate(n, k, group_size);
#pragma omp parallel if (n * k >= kParallelMacs)
  {
    std::vector<float> row(static_cast<size_t>(k));
    std::vector<int8_t> q(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) row[size_t(p)] = bf16_to_f32(w[j * k + p]);
      for (int64_t g = 0; g < out.groups(); ++g)
        out.scales[scale_index(out, j, g)] =
            quantize_group(row.data() + g * group_size, group_size, q.data() + g * group_size);
      for (int64_t p = 0; p < k; ++p) out.packed[packed_index(out, j, p)] = q[size_t(p)];
    }
  }
  return out;
}

Int8Weights pack_weights_int8(const int8_t* q, const float* scales, int64_t n, int64_t k,
                              int64_t group_size) {
  check_shape("pack_weights_int8", n, k, group_size);
  Int8Weights out = allocate(n, k, group_size);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) {
      if (q[j * k + p] == -128)
        fail(
            "pack_weights_int8: field 'q': row {} column {} is -128; symmetric int8 weights "
            "lie in [-127, 127]",
            j, p);
      out.packed[packed_index(out, j, p)] = q[j * k + p];
    }
    for (int64_t g = 0; g < out.groups(); ++g)
      out.scales[scale_index(out, j, g)] = scales[j * out.groups() + g];
  }
  return out;
}

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
  const Int8Weights& w = *args.w;
  if (args.m == 0) return;
  const Kernels kernels = kernels_for(dot);
  ActivationBuffers xb;
  allocate_activations(xb, args.m, w.k, w.groups());
#pragma omp parallel if (args.m * w.n * w.k >= kParallelMacs)
  {
    std::vector<float> row(size_t(w.k));
    std::vector<float> acc(size_t(kRowsPerPass * kInt8BlockRows));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < args.m; ++i)
      quantize_activation_row(args, w.k, w.group_size, i, row.data(), xb);
    for (int64_t row0 = 0; row0 < args.m; row0 += kRowsPerPass) {
      const Pass pass{.kernels = &kernels,
                      .x = &xb.view,
                      .args = &args,
                      .row0 = row0,
                      .rows = std::min(kRowsPerPass, args.m - row0)};
#pragma omp for schedule(static) nowait
      for (int64_t block = 0; block < w.blocks(); ++block) run_block(pass, block, acc.data());
    }
  }
}

void gemm_int8_reference(const GemmInt8Args& args) {
  check_args(args);
  const Int8Weights& w = *args.w;
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
