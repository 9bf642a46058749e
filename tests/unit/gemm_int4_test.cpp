// The int4 form of the quantized GEMM (gemm_int8.h): nibble packing, the same bitwise agreement
// of every instruction with the scalar reference as the int8 form, and its error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"
#include "kernel_test_util.h"
#include "quant_gemm_check.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

using test_quant::describe;
using test_quant::expect_same_bits;
using test_quant::Shape;

constexpr QuantFormat kInt4 = QuantFormat::kInt4;

TEST(GemmInt4, EveryInstructionAndLevelMatchesTheScalarReferenceBitwise) {
  test_quant::expect_every_level_matches_the_reference(QuantFormat::kInt4, 8);
}

// Integer weights whose every group reaches ±7 quantize with scale exactly 1, and integer
// activations reaching ±127 too: the GEMM must return the exact integer dot products.
TEST(GemmInt4, IsExactOnDataThatQuantizesExactly) {
  const int64_t m = 5, n = 19, k = 96, group = 32;
  std::mt19937 rng(11);
  auto integers = [&](int64_t rows, int top) {
    std::uniform_int_distribution<int> v(-top, top);
    std::vector<float> a(size_t(rows * k));
    for (float& e : a) e = float(v(rng));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < k / group; ++g) a[size_t(r * k + g * group + (r + g) % group)] = -top;
    return a;
  };
  const auto wf = integers(n, 7), x = integers(m, 127);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  const auto w = quantize_weights(kInt4, wb.data(), n, k, group);
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

// Each weight within half a step (scale/2, scale = max|w|/7) of its value, and the relative
// error of the GEMM on normal data near what that step predicts: uniform rounding error of
// ±scale/2 has rms scale/√12 ≈ 0.29·scale, and scale ≈ 2.5σ/7 at group 32, so ≈ 10% of the
// weight's σ, the activations' int8 rounding adding little; measured: 0.099 for both shapes.
TEST(GemmInt4, QuantizationErrorIsHalfAStepAndTheGemmErrorNearItsRms) {
  for (const Shape s : {Shape{7, 33, 512, 32}, Shape{3, 17, 1024, 128}}) {
    const auto wb = test::random_bf16(size_t(s.n * s.k), 21, 0.05f);
    const auto x = test::random_floats(size_t(s.m * s.k), 22);
    const auto w = quantize_weights(kInt4, wb.data(), s.n, s.k, s.group);
    for (int64_t j = 0; j < s.n; ++j)
      for (int64_t p = 0; p < s.k; ++p) {
        const float v = bf16_to_f32(wb[size_t(j * s.k + p)]), sc = w.scale(j, p / s.group);
        ASSERT_LE(std::fabs(v - sc * w.q(j, p)), sc / 2 * (1 + 1e-4)) << j << "," << p;
      }
    std::vector<float> y(size_t(s.m * s.n));
    gemm_int8({.m = s.m, .x = x.data(), .w = &w, .y = y.data()});
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = 0;
        for (int64_t p = 0; p < s.k; ++p)
          exact += double(x[size_t(i * s.k + p)]) * bf16_to_f32(wb[size_t(j * s.k + p)]);
        err2 += (y[size_t(i * s.n + j)] - exact) * (y[size_t(i * s.n + j)] - exact);
        ref2 += exact * exact;
      }
    const double rel = std::sqrt(err2 / ref2);
    EXPECT_LT(rel, 0.15) << describe(s);
    EXPECT_GT(rel, 0.02) << describe(s) << ": int4 cannot be this close; is it int4?";
  }
}

TEST(GemmInt4, PacksThePlainAndNibbleFormsToTheSameBytes) {
  const int64_t n = 20, k = 64, group = 16;
  const auto wb = test::random_bf16(size_t(n * k), 31);
  const auto w = quantize_weights(kInt4, wb.data(), n, k, group);
  std::vector<int8_t> q(size_t(n * k)), back(size_t(n * k));
  std::vector<float> scales(size_t(n * k / group));
  quantize_rows(kInt4, wb.data(), n, k, group, q.data(), scales.data());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) {
      ASSERT_EQ(q[size_t(j * k + p)], w.q(j, p)) << j << "," << p;
      ASSERT_LE(std::abs(int(w.q(j, p))), 7);
    }
  std::vector<uint8_t> nibbles(q.size() / 2);
  int4_to_nibbles(q.data(), int64_t(q.size()), nibbles.data());
  EXPECT_EQ(nibbles[0] & 15, q[0] + 8);
  EXPECT_EQ(nibbles[0] >> 4, q[1] + 8);
  nibbles_to_int4(nibbles.data(), int64_t(q.size()), back.data(), "test");
  EXPECT_EQ(back, q);
  const auto packed = pack_weights(kInt4, back.data(), scales.data(), n, k, group);
  ASSERT_EQ(packed.bytes(), w.bytes());
  EXPECT_EQ(std::memcmp(packed.data, w.data, w.bytes()), 0);
  EXPECT_EQ(w.bytes(), quant_bytes(kInt4, n, k, group));
  EXPECT_LT(w.bytes(), quant_bytes(QuantFormat::kInt8, n, k, group));
}

void expect_error(const std::function<void()>& f, const std::string& field) {
  try {
    f();
    ADD_FAILURE() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(GemmInt4, RejectsBadShapesAndValues) {
  const std::vector<uint16_t> wb(64 * 4, f32_to_bf16(0.5f));
  expect_error([&] { quantize_weights(kInt4, wb.data(), 4, 48, 32); }, "field 'k'");
  expect_error([&] { quantize_weights(kInt4, wb.data(), 4, 64, 4); }, "multiple of 8");
  const std::vector<int8_t> q = {1, 2, -8, 4, 0, 0, 0, 0};
  const std::vector<float> s = {1.0f};
  expect_error([&] { pack_weights(kInt4, q.data(), s.data(), 1, 8, 8); }, "field 'q'");
  const std::vector<uint8_t> zero_nibble = {0x08};
  int8_t out[2];
  expect_error([&] { nibbles_to_int4(zero_nibble.data(), 2, out, "model.safetensors"); },
               "model.safetensors: element 1");
  // The kernels load whole 64-byte lines: a matrix elsewhere is refused, not read misaligned.
  const auto w = quantize_weights(kInt4, wb.data(), 4, 64, 32);
  std::vector<uint8_t> shifted(w.bytes() + 64);
  QuantView off = w;
  off.data = shifted.data() + (64 - reinterpret_cast<uintptr_t>(shifted.data()) % 64) % 64 + 16;
  std::vector<float> x(64), y(4);
  expect_error([&] { gemm_int8({.m = 1, .x = x.data(), .w = &off, .y = y.data()}); },
               "field 'w.data'");
}

}  // namespace
}  // namespace sluice::cpu
