// The CUDA quantized expert GEMM (kernels/cuda/quant_gemm.h, through CudaMath::gemm_quant)
// against cpu::gemm_int8, bit for bit, over int8 and int4 weights, bf16 and fp32 activations,
// beta 0 and not, and awkward sizes: a W row count short of a packed block of 16 and of the
// kernel's 64-row tile, X rows short of its 32-row tile, groups from 8 to 1024, and a row of X
// holding a NaN (its outputs NaN on both). Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cpu/gemm_int8.h"
#include "runtime/gpu/cuda_device.h"
#include "runtime/gpu/cuda_math.h"

namespace sluice {
namespace {

using testing::DeviceVec;

// Equal bit for bit, or both NaN (a NaN's payload is not part of the contract).
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

TEST(CudaQuantGemm, MatchesTheCpuKernelBitForBit) {
  SKIP_WITHOUT_GPU("CUDA quantized GEMM test");
  gpu::CudaDevice device(0, size_t(1) << 30);
  gpu::CudaMath math(device);
  std::mt19937 rng(5);
  std::normal_distribution<float> d;
  for (cpu::QuantFormat format : {cpu::QuantFormat::kInt8, cpu::QuantFormat::kInt4}) {
    for (auto [m, n, k, group] : {std::tuple{1, 16, 128, 128},
                                  {37, 200, 384, 128},
                                  {5, 129, 1024, 32},
                                  {70, 33, 256, 64},
                                  {3, 5, 16, 8},
                                  {33, 70, 2048, 1024},
                                  {64, 64, 512, 128}}) {
      std::vector<uint16_t> w(size_t(n) * k);
      for (uint16_t& v : w) v = f32_to_bf16(d(rng) * 0.05f);
      const cpu::QuantWeights q = cpu::quantize_weights(format, w.data(), n, k, group);
      std::vector<float> xf(size_t(m) * k), y0(size_t(m) * n);
      for (float& v : xf) v = d(rng);
      for (float& v : y0) v = d(rng);
      if (m > 2) xf[size_t(k) + 3] = std::numeric_limits<float>::quiet_NaN();  // row 1
      std::vector<uint16_t> xb(xf.size());
      for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
      DeviceVec<uint8_t> dw(std::vector<uint8_t>(q.data, q.data + q.bytes()));
      cpu::QuantView on_device = q;
      on_device.data = dw.ptr;
      DeviceVec<uint16_t> dxb(xb);
      DeviceVec<float> dxf(xf);
      for (bool x_bf16 : {true, false})
        for (float beta : {0.0f, 0.5f}) {
          std::vector<float> want = y0;
          cpu::gemm_int8({.m = m,
                          .x = x_bf16 ? static_cast<const void*>(xb.data()) : xf.data(),
                          .x_dtype = x_bf16 ? DType::BF16 : DType::F32,
                          .w = &q,
                          .y = want.data(),
                          .beta = beta});
          DeviceVec<float> dy(y0);
          math.gemm_quant(nullptr, on_device, m,
                          x_bf16 ? static_cast<const void*>(dxb.ptr) : dxf.ptr, x_bf16, dy.ptr,
                          beta);
          const std::vector<float> got = dy.get();
          int differ = 0;
          for (size_t i = 0; i < want.size(); ++i) differ += !same(got[i], want[i]);
          EXPECT_EQ(differ, 0) << cpu::quant_format_name(format) << " m=" << m << " n=" << n
                               << " k=" << k << " group=" << group << " x_bf16=" << x_bf16
                               << " beta=" << beta;
        }
    }
  }
}

}  // namespace
}  // namespace sluice
