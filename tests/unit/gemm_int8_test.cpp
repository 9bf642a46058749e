#include "kernels/cpu/gemm_int8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "core/error.h"
#include "kernel_test_util.h"
#include "quant_gemm_check.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

using test_quant::describe;
using test_quant::expect_same_bits;
using test_quant::Shape;

TEST(GemmInt8, EveryInstructionAndLevelMatchesTheScalarReferenceBitwise) {
  test_quant::expect_every_level_matches_the_reference(QuantFormat::kInt8, 4);
}

TEST(GemmInt8, StridedBf16ActivationsMatchTheReferenceBitwise) {
  const int64_t m = 6, n = 21, k = 64, group = 32, ldx = 70, ldy = 25;
  const auto w = quantize_weights_int8(test::random_bf16(size_t(n * k), 3).data(), n, k, group);
  const auto x = test::random_bf16(size_t(m * ldx), 4);
  const auto y0 = test::random_floats(size_t(m * ldy), 5);
  std::vector<float> ref = y0;
  GemmInt8Args args{.m = m,
                    .x = x.data(),
                    .x_dtype = DType::BF16,
                    .ldx = ldx,
                    .w = &w,
                    .y = ref.data(),
                    .ldy = ldy,
                    .beta = 1.0f};
  gemm_int8_reference(args);
  for (Int8Dot dot : gemm_int8_dots_available()) {
    std::vector<float> y = y0;
    args.y = y.data();
    gemm_int8_using(dot, args);
    expect_same_bits(y, ref, int8_dot_name(dot));  // includes the padding columns n..ldy
  }
}

// Integer data whose every group reaches ±127 quantizes with scale exactly 1, so the GEMM must
// return the exact integer dot products (all below 2²⁴, so exact in fp32).
TEST(GemmInt8, IsExactOnDataThatQuantizesExactly) {
  const int64_t m = 5, n = 19, k = 96, group = 32;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> v(-127, 127);
  auto integers = [&](int64_t rows) {
    std::vector<float> a(size_t(rows * k));
    for (float& e : a) e = float(v(rng));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < k / group; ++g) a[size_t(r * k + g * group + (r + g) % group)] = 127;
    return a;
  };
  const auto wf = integers(n), x = integers(m);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);  // exact: |v| < 256
  const auto w = quantize_weights_int8(wb.data(), n, k, group);
  for (Int8Dot dot : gemm_int8_dots_available()) {
    std::vector<float> y(size_t(m * n));
    gemm_int8_using(dot, {.m = m, .x = x.data(), .w = &w, .y = y.data()});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        int64_t exact = 0;
        for (int64_t p = 0; p < k; ++p)
          exact += int64_t(x[size_t(i * k + p)]) * int64_t(wf[size_t(j * k + p)]);
        ASSERT_EQ(y[size_t(i * n + j)], float(exact))
            << int8_dot_name(dot) << " i=" << i << " j=" << j;
      }
  }
}

// Against the fp32 matmul of the unquantized operands, computed in double. With x̂ = sx·qx and
// ŵ = sw·qw the quantized values, |x − x̂| ≤ sx/2 and |w − ŵ| ≤ sw/2 (each widened by 1e-4 for
// the fp32 roundings of the scale and of v·127/max|v|), so
//   |Σ x·w − Σ x̂·ŵ| ≤ Σ_g (sw_g/2 · Σ_g|x| + sx_g/2 · Σ_g|ŵ|)
// and the kernel's fp32 fold of G groups (one rounding for sx·sw, one per fma) adds at most
// (G + 2)·2⁻²³ · Σ|x̂·ŵ|.
TEST(GemmInt8, ErrorAgainstTheFp32MatmulIsWithinTheAnalyticBound) {
  for (const Shape s : {Shape{7, 33, 512, 32}, Shape{3, 17, 1024, 128}}) {
    auto wb = test::random_bf16(size_t(s.n * s.k), 21, 0.05f);
    auto x = test::random_floats(size_t(s.m * s.k), 22);
    x[5] = 30.0f;  // an outlier: its group's scale grows, the others' do not
    const auto w = quantize_weights_int8(wb.data(), s.n, s.k, s.group);
    std::vector<float> y(size_t(s.m * s.n));
    gemm_int8({.m = s.m, .x = x.data(), .w = &w, .y = y.data()});
    const int64_t groups = s.k / s.group;
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < s.m; ++i) {
      std::vector<float> sx(static_cast<size_t>(groups));
      for (int64_t g = 0; g < groups; ++g) {
        float amax = 0;
        for (int64_t p = g * s.group; p < (g + 1) * s.group; ++p)
          amax = std::max(amax, std::fabs(x[size_t(i * s.k + p)]));
        sx[size_t(g)] = amax / 127.0f;
      }
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = 0, bound = 0, magnitude = 0;
        for (int64_t g = 0; g < groups; ++g) {
          double sum_x = 0, sum_w = 0;
          for (int64_t p = g * s.group; p < (g + 1) * s.group; ++p) {
            const double xv = x[size_t(i * s.k + p)], wv = bf16_to_f32(wb[size_t(j * s.k + p)]);
            const double w_hat = double(w.scale(j, g)) * w.q(j, p);
            const double x_hat = double(sx[size_t(g)]) * std::nearbyint(xv / sx[size_t(g)]);
            exact += xv * wv;
            sum_x += std::fabs(xv);
            sum_w += std::fabs(w_hat);
            magnitude += std::fabs(x_hat * w_hat);
          }
          bound += (w.scale(j, g) / 2.0 * sum_x + sx[size_t(g)] / 2.0 * sum_w) * (1 + 1e-4);
        }
        bound += double(groups + 2) * std::ldexp(1.0, -23) * magnitude;
        const double got = y[size_t(i * s.n + j)];
        ASSERT_LE(std::fabs(got - exact), bound) << describe(s) << " i=" << i << " j=" << j;
        err2 += (got - exact) * (got - exact);
        ref2 += exact * exact;
      }
    }
    // The bound is the worst case; typical errors are ~1% of the result for normal data (each
    // operand's rounding error is uniform in ±scale/2, scale ≈ 3σ/127 at these group sizes).
    EXPECT_LT(std::sqrt(err2 / ref2), 0.02) << describe(s);
  }
}

TEST(GemmInt8, NonFiniteInputsGiveNaNWhereTheyReach) {
  const int64_t m = 3, n = 18, k = 64, group = 32;
  auto wb = test::random_bf16(size_t(n * k), 41);
  wb[size_t(5 * k + 40)] = f32_to_bf16(std::numeric_limits<float>::infinity());  // row 5
  const auto w = quantize_weights_int8(wb.data(), n, k, group);
  auto x = test::random_floats(size_t(m * k), 42);
  x[size_t(1 * k + 3)] = std::numeric_limits<float>::quiet_NaN();  // row 1
  for (Int8Dot dot : gemm_int8_dots_available()) {
    std::vector<float> y(size_t(m * n));
    gemm_int8_using(dot, {.m = m, .x = x.data(), .w = &w, .y = y.data()});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(std::isnan(y[size_t(i * n + j)]), i == 1 || j == 5)
            << int8_dot_name(dot) << " i=" << i << " j=" << j;
  }
}

TEST(GemmInt8, QuantizesWeightsGroupWiseAndPacksLikePackWeights) {
  const int64_t n = 20, k = 64, group = 16;
  const auto wb = test::random_bf16(size_t(n * k), 31);
  const auto w = quantize_weights_int8(wb.data(), n, k, group);
  std::vector<int8_t> q(size_t(n * k));
  std::vector<float> scales(size_t(n * k / group));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t g = 0; g < k / group; ++g) {
      float amax = 0;
      for (int64_t p = g * group; p < (g + 1) * group; ++p)
        amax = std::max(amax, std::fabs(bf16_to_f32(wb[size_t(j * k + p)])));
      ASSERT_EQ(w.scale(j, g), amax / 127.0f) << "j=" << j << " g=" << g;
      scales[size_t(j * (k / group) + g)] = w.scale(j, g);
      for (int64_t p = g * group; p < (g + 1) * group; ++p) {
        const float v = bf16_to_f32(wb[size_t(j * k + p)]);
        ASSERT_EQ(w.q(j, p), int8_t(std::nearbyint(v * (127.0f / amax)))) << j << "," << p;
        ASSERT_LE(std::fabs(v - w.scale(j, g) * w.q(j, p)), w.scale(j, g) / 2 * (1 + 1e-4));
        q[size_t(j * k + p)] = w.q(j, p);
      }
    }
  const auto packed = pack_weights_int8(q.data(), scales.data(), n, k, group);
  ASSERT_EQ(packed.bytes(), w.bytes());
  EXPECT_EQ(std::memcmp(packed.data, w.data, w.bytes()), 0);
}

void expect_error(const std::function<void()>& f, const std::string& field) {
  try {
    f();
    ADD_FAILURE() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(GemmInt8, RejectsBadShapesAndArguments) {
  const std::vector<uint16_t> wb(64 * 4, f32_to_bf16(0.5f));
  expect_error([&] { quantize_weights_int8(wb.data(), 4, 48, 32); }, "field 'k'");
  expect_error([&] { quantize_weights_int8(wb.data(), 4, 64, 6); }, "field 'group_size'");
  expect_error([&] { quantize_weights_int8(wb.data(), 4, 2048, 2048); }, "field 'group_size'");
  expect_error([&] { quantize_weights_int8(wb.data(), 0, 64, 32); }, "field 'n'");
  const std::vector<int8_t> q = {1, 2, -128, 4};
  const std::vector<float> s = {1.0f};
  expect_error([&] { pack_weights_int8(q.data(), s.data(), 1, 4, 4); }, "field 'q'");
  const auto w = quantize_weights_int8(wb.data(), 4, 64, 32);
  std::vector<float> x(64), y(4);
  expect_error([&] { gemm_int8({.m = 1, .x = x.data(), .ldx = 10, .w = &w, .y = y.data()}); },
               "field 'ldx'");
  expect_error([&] { gemm_int8({.m = 1, .x = x.data(), .w = &w, .y = y.data(), .ldy = 2}); },
               "field 'ldy'");
  expect_error(
      [&] { gemm_int8({.m = 1, .x = x.data(), .x_dtype = DType::I32, .w = &w, .y = y.data()}); },
      "field 'x_dtype'");
  expect_error([&] { gemm_int8({.m = 1, .x = x.data(), .y = y.data()}); }, "field 'w'");
}

}  // namespace
}  // namespace sluice::cpu
