// Dense GEMM against bf16 weights in the Hugging Face nn.Linear layout.
//
//   Y[m, n] = X[m, k] · Wᵀ + beta · Y       (torch: y = F.linear(x, w) + beta * y)
//
// W is bf16 row-major [n, k] (out_features × in_features), used in place: it is usually a
// pointer into a mapped checkpoint, so it is never reordered or copied by this module
// (oneDNN sees it as a K×N matrix in the plain `ba` format). X is fp32 or bf16; fp32 rows are
// rounded to bf16 (nearest even) before the multiply, the products are accumulated in fp32.
// oneDNN runs on the OpenMP runtime (the Debian build uses DNNL_RUNTIME_OMP), so the GEMM
// shares the engine's one OpenMP thread pool. Call it from one thread at a time per stream;
// concurrent calls from different threads are safe (each thread has its own stream).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace sluice::cpu {

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;      // [m, k], row stride ldx elements
  DType x_dtype = DType::F32;   // F32 or BF16
  int64_t ldx = 0;              // 0 means k
  const uint16_t* w = nullptr;  // bf16 [n, k], row stride ldw elements
  int64_t ldw = 0;              // 0 means k
  float* y = nullptr;           // fp32 [m, n], row stride ldy elements
  int64_t ldy = 0;              // 0 means n
  float beta = 0.0f;            // 0: overwrite Y; otherwise Y = X·Wᵀ + beta·Y
};

// At the AVX-512 levels and more rows than sluice's tiles handle faster (4 at avx512, 16 at
// avx512bf16) a oneDNN primitive per (shape, strides, dtype, beta), created once and cached;
// elsewhere sluice's tiles.
void gemm(const GemmArgs& args);

// Plain triple loop, fp32 accumulation in k order, X rounded to bf16 exactly as gemm() does.
// Slow; for tests.
void gemm_reference(const GemmArgs& args);

// How gemm() describes the row count m to oneDNN. The engine calls with a different m for
// every expert, so the choice matters; see the measurements in hardware_probe.cpp.
enum class GemmRowMode : uint8_t {
  kExact,    // one primitive per distinct m (creation ~tens of µs, then cached)
  kRuntime,  // one primitive for every m (DNNL_RUNTIME_DIM_VAL)
};
void set_gemm_row_mode(GemmRowMode mode);
GemmRowMode gemm_row_mode();

// Number of cached oneDNN primitives, and the implementation gemm() uses for a shape at the
// level in force ("oneDNN brg:avx512_core_bf16", "sluice:avx2"), for benchmarks and reports.
size_t gemm_cached_primitives();
std::string gemm_implementation(const GemmArgs& args);

}  // namespace sluice::cpu
