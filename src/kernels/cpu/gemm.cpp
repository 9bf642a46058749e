#include "kernels/cpu/gemm.h"

#include <atomic>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm_onednn.h"
#include "kernels/cpu/gemm_tiled.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

std::atomic<GemmRowMode> g_row_mode{GemmRowMode::kExact};

GemmArgs resolve(const GemmArgs& in) {
  GemmArgs a = in;
  if (a.ldx == 0) a.ldx = a.k;
  if (a.ldw == 0) a.ldw = a.k;
  if (a.ldy == 0) a.ldy = a.n;
  if (a.m < 0 || a.n <= 0 || a.k <= 0)
    fail("gemm: field 'shape': expected m >= 0, n > 0, k > 0, got m={} n={} k={}", a.m, a.n, a.k);
  if (a.ldx < a.k || a.ldw < a.k || a.ldy < a.n)
    fail("gemm: field 'ld': expected ldx >= k, ldw >= k, ldy >= n, got {} {} {} for k={} n={}",
         a.ldx, a.ldw, a.ldy, a.k, a.n);
  if (a.x_dtype != DType::F32 && a.x_dtype != DType::BF16)
    fail("gemm: field 'x_dtype': expected F32 or BF16, got {}", dtype_name(a.x_dtype));
  return a;
}

bool runtime_rows() {
  return g_row_mode.load(std::memory_order_relaxed) == GemmRowMode::kRuntime;
}

// Up to this many rows sluice's own kernels beat oneDNN's bf16 matmul at the AVX-512 levels.
// Measured on 2 Zen 5 cores (n = 14336, k = 4096, `sluice bench-kernels`, best of 3 runs):
// - avx512: the prefetching avx2 tiles read W at 37–41 GB/s at m = 1 where oneDNN reads 17–26,
//   and are behind from m = 8 on;
// - avx512bf16: the `vdpbf16ps` 4 × 3 tiles up to m = 16 (4.9–5.5 ms at m = 16, oneDNN 5.9–9.7),
//   and above it the token-lane kernel (gemm_lanes.h), at every m measured: m = 32 5.3 ms
//   (oneDNN 7.2), m = 64 10.4 (10.9–14.7), m = 256 40.9 (36.5–45.5), m = 1024 165 (147–169),
//   70–77% of the `vdpbf16ps` peak from m = 32 up. The lanes have since grown faster still
//   (94–96% from m = 64 on 2 Zen 4 cores) and take every m, in blocks of 4 rows up to m = 12
//   (gemm_lanes.h); the 4 × 3 `vdpbf16ps` tiles are gone.
// At the amx level oneDNN's AMX kernels are assumed ahead (not measured: no AMX machine yet).
int64_t max_tiled_rows(IsaLevel level) {
  if (level >= IsaLevel::kAmx) return 4;
  return level >= IsaLevel::kAvx512Bf16 ? std::numeric_limits<int64_t>::max() : 4;
}

bool uses_onednn(IsaLevel level, int64_t m) {
  return level >= IsaLevel::kAvx512 && m > max_tiled_rows(level);
}

TiledGemmArgs tiled_args(const GemmArgs& a) {
  return {.m = a.m,
          .n = a.n,
          .k = a.k,
          .x = a.x,
          .x_dtype = a.x_dtype,
          .ldx = a.ldx,
          .round_x_to_bf16 = true,
          .w = a.w,
          .ldw = a.ldw,
          .y = a.y,
          .ldy = a.ldy,
          .beta = a.beta};
}

}  // namespace

void gemm(const GemmArgs& args) {
  const GemmArgs a = resolve(args);
  if (a.m == 0) return;
  const IsaLevel level = isa_level();
  if (uses_onednn(level, a.m) && onednn::try_gemm(a, runtime_rows())) return;
  tiled_gemm(tiled_args(a), level);
}

void gemm_reference(const GemmArgs& args) {
  const GemmArgs a = resolve(args);
  std::vector<float> row(size_t(a.k));
  for (int64_t i = 0; i < a.m; ++i) {
    for (int64_t p = 0; p < a.k; ++p) {
      row[p] = a.x_dtype == DType::F32
                   ? bf16_to_f32(f32_to_bf16(static_cast<const float*>(a.x)[i * a.ldx + p]))
                   : bf16_to_f32(static_cast<const uint16_t*>(a.x)[i * a.ldx + p]);
    }
    for (int64_t j = 0; j < a.n; ++j) {
      const uint16_t* w_row = a.w + j * a.ldw;
      float acc = 0.0f;
      for (int64_t p = 0; p < a.k; ++p) acc += row[p] * bf16_to_f32(w_row[p]);
      float& y = a.y[i * a.ldy + j];
      y = a.beta != 0.0f ? acc + a.beta * y : acc;
    }
  }
}

void set_gemm_row_mode(GemmRowMode mode) {
  g_row_mode.store(mode);
}
GemmRowMode gemm_row_mode() {
  return g_row_mode.load();
}

size_t gemm_cached_primitives() {
  return onednn::cached_primitives();
}

std::string gemm_implementation(const GemmArgs& args) {
  const GemmArgs a = resolve(args);
  const IsaLevel level = isa_level();
  if (uses_onednn(level, a.m)) {
    std::string name = onednn::implementation(a, runtime_rows());
    if (!name.empty()) return "oneDNN " + name;
  }
  return tiled_gemm_name(level);
}

}  // namespace sluice::cpu
