// Instruction peaks: each loop the CPU offers gives a positive, finite rate; each level's
// ceilings come from that level's instructions; a wider instruction is faster than the scalar
// loop; a loop above the level in force is a clear error.
#include "kernels/cpu/peaks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

constexpr double kShort = 0.03;  // seconds per peak: enough for a rate, quick for a test

TEST(InstructionPeaks, EveryLevelUpToTheCurrentHasPositiveFiniteCeilings) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    const InstructionPeaks p = measure_instruction_peaks(kShort);
    EXPECT_EQ(p.level, level);
    for (double rate : {p.fp32_fma_flops, p.bf16_flops, p.int8_ops}) {
      EXPECT_GT(rate, 0) << isa_name(level);
      EXPECT_TRUE(std::isfinite(rate)) << isa_name(level);
    }
    // Below avx512bf16 a bf16 GEMM widens its weights to fp32: the same ceiling, measured once.
    if (level < IsaLevel::kAvx512Bf16) {
      EXPECT_EQ(p.loops.bf16, p.loops.fp32) << isa_name(level);
      EXPECT_EQ(p.bf16_flops, p.fp32_fma_flops) << isa_name(level);
    } else {
      EXPECT_NE(p.loops.bf16, p.loops.fp32) << isa_name(level);
    }
  }
}

TEST(InstructionPeaks, EachLevelsLoopsAreItsOwnInstructions) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    const PeakLoops l = peak_loops();
    for (PeakLoop loop : {l.fp32, l.bf16, l.int8})
      EXPECT_TRUE(peak_loop_available(loop)) << isa_name(level) << " " << peak_loop_name(loop);
    switch (level) {
      case IsaLevel::kScalar:
        EXPECT_EQ(l.fp32, PeakLoop::kScalarFma);
        EXPECT_EQ(l.int8, PeakLoop::kScalarInt8);
        break;
      case IsaLevel::kAvx2:
        EXPECT_EQ(l.fp32, PeakLoop::kAvx2Fma);
        EXPECT_EQ(l.int8, cpu_features().avx_vnni ? PeakLoop::kAvxVnni : PeakLoop::kAvx2Maddubs);
        break;
      case IsaLevel::kAvx512:
        EXPECT_EQ(l.fp32, PeakLoop::kAvx512Fma);
        if (cpu_features().avx512_vnni) {
          EXPECT_EQ(l.int8, PeakLoop::kAvx512Vnni);
        }
        break;
      case IsaLevel::kAvx512Bf16:
        EXPECT_EQ(l.bf16, PeakLoop::kAvx512Bf16Dot);
        break;
      case IsaLevel::kAmx:
        EXPECT_EQ(l.bf16, PeakLoop::kAmxBf16);
        EXPECT_EQ(l.int8, PeakLoop::kAmxInt8);
        break;
    }
  }
}

TEST(InstructionPeaks, EveryAvailableLoopMeasures) {
  for (int i = 0; i <= int(PeakLoop::kAmxInt8); ++i) {
    const PeakLoop loop = PeakLoop(i);
    if (!peak_loop_available(loop)) continue;
    const double rate = measure_peak(loop, kShort);
    EXPECT_GT(rate, 0) << peak_loop_name(loop);
    EXPECT_TRUE(std::isfinite(rate)) << peak_loop_name(loop);
  }
}

// 8-lane FMA on 2 ports against the scalar level's SSE mulps + addps (4 lanes): at least twice
// the rate on every AVX2 CPU; asserted with margin, as other load on the machine adds noise.
TEST(InstructionPeaks, Avx2FmaExceedsTheScalarLoop) {
  if (!isa_at_least(IsaLevel::kAvx2)) GTEST_SKIP() << "the level in force is below avx2";
  // The best of three alternating rounds each: another process on the same cores (ctest -j2)
  // can take one round of either loop, not all three.
  double avx2 = 0, scalar = 0;
  for (int round = 0; round < 3; ++round) {
    avx2 = std::max(avx2, measure_peak(PeakLoop::kAvx2Fma, 0.1));
    scalar = std::max(scalar, measure_peak(PeakLoop::kScalarFma, 0.1));
  }
  EXPECT_GT(avx2, 1.2 * scalar) << "avx2 " << avx2 / 1e9 << " GFLOP/s, scalar " << scalar / 1e9;
}

TEST(InstructionPeaks, ALoopAboveTheLevelInForceIsAnErrorNamingIt) {
  ScopedIsaLevel at(IsaLevel::kScalar);
  EXPECT_FALSE(peak_loop_available(PeakLoop::kAvx2Fma));
  try {
    measure_peak(PeakLoop::kAvx2Fma, kShort);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("avx2 vfmadd231ps ymm"), std::string::npos) << what;
    EXPECT_NE(what.find("ISA level scalar"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace sluice::cpu
