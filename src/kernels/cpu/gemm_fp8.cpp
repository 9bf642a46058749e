#include "kernels/cpu/gemm_fp8.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_tiled.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

// A panel of W dequantised at once: 64 × 1024 bf16 = 128 KB, within L2 beside the tiles' own
// working set, and 64 rows give two threads enough panels to share even W of 576 rows.
constexpr int64_t kPanelRows = 64;
constexpr int64_t kPanelDepth = 1024;  // a multiple of kFp8Block: a panel meets whole blocks

void check(const GemmFp8Args& a) {
  if (!a.w || !a.w->q || !a.w->scale || a.w->n <= 0 || a.w->k <= 0)
    fail("gemm_fp8: field 'w': expected codes, scales and n, k > 0");
  if (a.m < 0) fail("gemm_fp8: field 'm': expected m >= 0, got {}", a.m);
  if (a.x_dtype != DType::F32 && a.x_dtype != DType::BF16)
    fail("gemm_fp8: field 'x_dtype': expected F32 or BF16, got {}", dtype_name(a.x_dtype));
}

uint16_t* panel_scratch() {
  thread_local std::vector<uint16_t> panel(size_t(kPanelRows * kPanelDepth));
  return panel.data();
}

}  // namespace

void gemm_fp8(const GemmFp8Args& args) {
  check(args);
  if (args.m == 0) return;
  const Fp8Matrix& w = *args.w;
  const int64_t ldx = args.ldx ? args.ldx : w.k, ldy = args.ldy ? args.ldy : w.n;
  const size_t x_size = dtype_size(args.x_dtype);
  const IsaLevel level = isa_level();
  const int64_t panels = (w.n + kPanelRows - 1) / kPanelRows;
  // Each thread owns whole panels of rows, so each Y column is written by one thread; the tiles
  // it calls run inside this parallel region on that thread alone.
#pragma omp parallel for schedule(dynamic)
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t j0 = panel * kPanelRows, rows = std::min(kPanelRows, w.n - j0);
    uint16_t* tile = panel_scratch();
    for (int64_t p0 = 0; p0 < w.k; p0 += kPanelDepth) {
      const int64_t depth = std::min(kPanelDepth, w.k - p0);
      dequantize_fp8(w, j0, rows, p0, depth, tile, depth);
      tiled_gemm({.m = args.m,
                  .n = rows,
                  .k = depth,
                  .x = static_cast<const char*>(args.x) + size_t(p0) * x_size,
                  .x_dtype = args.x_dtype,
                  .ldx = ldx,
                  .round_x_to_bf16 = args.round_x_to_bf16,
                  .w = tile,
                  .ldw = depth,
                  .y = args.y + j0,
                  .ldy = ldy,
                  .beta = p0 == 0 ? args.beta : 1.0f},
                 level);
    }
  }
}

void gemm_fp8_reference(const GemmFp8Args& args) {
  check(args);
  const Fp8Matrix& w = *args.w;
  std::vector<uint16_t> dense(size_t(w.n * w.k));
  dequantize_fp8_scalar(w, 0, w.n, 0, w.k, dense.data(), w.k);
  gemm_reference({.m = args.m,
                  .n = w.n,
                  .k = w.k,
                  .x = args.x,
                  .x_dtype = args.x_dtype,
                  .ldx = args.ldx,
                  .w = dense.data(),
                  .y = args.y,
                  .ldy = args.ldy,
                  .beta = args.beta});
}

}  // namespace sluice::cpu
