// The CUDA path of FP8 weights (DeviceMath::gemm_fp8): the dequantisation kernel bit for bit
// against kernels/cpu's, and CudaMath::gemm_fp8 (row panels of W dequantised into a bf16 tile,
// then cuBLASLt, or the fp32 kernel for f32 precision) against cpu::gemm_fp8, over awkward
// sizes: partial 128 × 128 edge blocks (576 rows as kv_a_proj_with_mqa), a depth past one CPU
// panel, and tiles that split W into panels which do not divide its rows. Skipped, with a
// message, on machines without a GPU; compiled everywhere nvcc is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/offload_ops.h"
#include "runtime/gpu/cuda_device.h"
#include "runtime/gpu/cuda_math.h"

namespace sluice {
namespace {

using testing::DeviceVec;

// Codes over the whole e4m3 range but NaN (normals, subnormals, both zeros), block scales of
// varied magnitude, as kernels/cpu's FP8 test draws them.
struct Fp8Weights {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  cpu::Fp8Matrix w;
  Fp8Weights(int64_t n, int64_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    q.resize(size_t(n * k));
    for (uint8_t& c : q) {
      c = uint8_t(rng());
      if ((c & 0x7f) == 0x7f) c &= 0xfe;
    }
    w = {nullptr, nullptr, n, k};
    scale.resize(size_t(w.scale_rows() * w.scale_cols()));
    std::uniform_real_distribution<float> exponent(-12.f, 2.f);
    for (float& s : scale) s = std::exp2(exponent(rng));
    w.q = q.data();
    w.scale = scale.data();
  }
};

TEST(CudaFp8, DequantisationIsTheCpusBitForBit) {
  SKIP_WITHOUT_GPU("CUDA FP8 test");
  for (auto [n, k, row0, rows] :
       {std::tuple{576, 64, 0, 576}, {200, 300, 130, 70}, {129, 1100, 1, 128}, {5, 7, 2, 3}}) {
    const Fp8Weights f(n, k, uint32_t(n + k));
    std::vector<uint16_t> want(size_t(rows * k));
    cpu::dequantize_fp8_scalar(f.w, row0, rows, 0, k, want.data(), k);
    DeviceVec<uint8_t> dq(f.q);
    DeviceVec<float> ds(f.scale);
    DeviceVec<uint16_t> out(std::vector<uint16_t>(want.size()));
    cuda::dequantize_fp8(dq.ptr, ds.ptr, k, row0, rows, out.ptr, nullptr);
    EXPECT_EQ(out.get(), want) << "n=" << n << " k=" << k << " rows [" << row0 << ", "
                               << row0 + rows << ")";
  }
}

TEST(CudaFp8, GemmMatchesTheCpuKernel) {
  SKIP_WITHOUT_GPU("CUDA FP8 test");
  gpu::CudaDevice device(0, size_t(1) << 30);
  gpu::CudaMath math(device);
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  // m, n, k, and the tile's rows (0: the whole matrix in one panel).
  for (auto [m, n, k, tile_rows] : {std::tuple{1, 576, 64, 0},
                                    {37, 200, 300, 64},
                                    {5, 129, 1100, 7},
                                    {300, 256, 2048, 100},
                                    {3, 5, 7, 2}}) {
    const Fp8Weights f(n, k, uint32_t(m * 7 + n));
    std::vector<float> xf(size_t(m) * k), y0(size_t(m) * n);
    for (float& v : xf) v = d(rng);
    for (float& v : y0) v = d(rng);
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
    DeviceVec<uint8_t> dq(f.q);
    DeviceVec<float> ds(f.scale);
    DeviceVec<uint16_t> dxb(xb),
        tile(std::vector<uint16_t>(size_t((tile_rows ? tile_rows : n) * k)));
    DeviceVec<float> dxf(xf);
    for (bool x_bf16 : {true, false})
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> want = y0;
        cpu::gemm_fp8({.m = m,
                       .x = x_bf16 ? static_cast<const void*>(xb.data()) : xf.data(),
                       .x_dtype = x_bf16 ? DType::BF16 : DType::F32,
                       .w = &f.w,
                       .y = want.data(),
                       .beta = beta,
                       .round_x_to_bf16 = false});
        DeviceVec<float> dy(y0);
        math.gemm_fp8(nullptr, {.w = {dq.ptr, ds.ptr, n, k},
                                .m = m,
                                .x = x_bf16 ? static_cast<const void*>(dxb.ptr) : dxf.ptr,
                                .x_bf16 = x_bf16,
                                .y = dy.ptr,
                                .beta = beta,
                                .tile = tile.ptr,
                                .tile_elements = int64_t(tile.n)});
        const std::vector<float> got = dy.get();
        double scale = 0;
        for (float v : want) scale = std::max(scale, double(std::fabs(v)));
        // The same bf16 weights and fp32 sums in another order (cuBLASLt's, the warp's).
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5 * scale * std::sqrt(double(k)) + 1e-6)
              << "m=" << m << " n=" << n << " k=" << k << " tile rows " << tile_rows << " bf16 x "
              << x_bf16 << " beta " << beta << " at " << i;
      }
  }
}

}  // namespace
}  // namespace sluice
