#include "kernels/cpu/gemm_f32.h"

#include "core/dtype.h"
#include "kernels/cpu/gemm_tiled.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {

void gemm_f32(const GemmF32Args& a) {
  if (a.m == 0) return;
  tiled_gemm({.m = a.m,
              .n = a.n,
              .k = a.k,
              .x = a.x,
              .x_dtype = DType::F32,
              .ldx = a.k,
              .round_x_to_bf16 = false,
              .w = a.w,
              .ldw = a.k,
              .y = a.y,
              .ldy = a.n,
              .beta = a.beta},
             isa_level());
}

void gemm_f32_reference(const GemmF32Args& a) {
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t j = 0; j < a.n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < a.k; ++p) acc += a.x[i * a.k + p] * bf16_to_f32(a.w[j * a.k + p]);
      float* y = a.y + i * a.n + j;
      *y = a.beta == 0.0f ? acc : acc + a.beta * *y;
    }
}

}  // namespace sluice::cpu
