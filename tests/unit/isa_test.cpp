// The ISA level: names, the levels this CPU offers, forcing one for a scope, and SLUICE_ISA's
// errors as the command line reports them.
#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "test_util.h"

namespace sluice::cpu {
namespace {

TEST(Isa, NamesRoundTripAndUnknownNamesAreRejected) {
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAvx512Bf16,
                     IsaLevel::kAmx})
    EXPECT_EQ(parse_isa(isa_name(l)), l);
  EXPECT_FALSE(parse_isa("bogus"));
  EXPECT_FALSE(parse_isa("AVX2"));
  EXPECT_FALSE(parse_isa(""));
}

TEST(Isa, OffersEveryLevelFromScalarToTheCpus) {
  const auto levels = supported_isa_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), IsaLevel::kScalar);
  EXPECT_EQ(levels.back(), cpu_isa_level());
  EXPECT_LE(isa_level(), cpu_isa_level());
  EXPECT_FALSE(cpu_model_name().empty());
  const CpuFeatures& f = cpu_features();
  // Each level implies the features below it.
  if (cpu_isa_level() >= IsaLevel::kAvx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
  if (cpu_isa_level() >= IsaLevel::kAvx512) {
    EXPECT_TRUE(f.avx512);
  }
  if (cpu_isa_level() >= IsaLevel::kAvx512Bf16) {
    EXPECT_TRUE(f.avx512_bf16);
  }
  if (cpu_isa_level() >= IsaLevel::kAmx) {
    EXPECT_TRUE(f.amx);
  }
}

TEST(Isa, ScopedLevelLowersAndRestores) {
  const IsaLevel before = isa_level();
  {
    ScopedIsaLevel at(IsaLevel::kScalar);
    EXPECT_EQ(isa_level(), IsaLevel::kScalar);
    EXPECT_EQ(int8_dot(), Int8Dot::kScalar);
  }
  EXPECT_EQ(isa_level(), before);
}

TEST(Isa, ALevelAboveTheCpusIsAnErrorNamingWhatItOffers) {
  if (cpu_isa_level() == IsaLevel::kAmx) GTEST_SKIP() << "this CPU offers every level";
  const IsaLevel above = IsaLevel(int(cpu_isa_level()) + 1);
  try {
    set_isa_level(above);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offers scalar"), std::string::npos) << e.what();
  }
}

std::string with_isa(const std::string& value, const std::string& args) {
  return "SLUICE_ISA=" + value + " " + testing::sluice_command(args);
}

TEST(IsaCli, BogusLevelIsOneClearError) {
  auto r = testing::run_command(with_isa("bogus", "inspect --model /nonexistent-model"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("error: SLUICE_ISA=bogus: expected one of scalar, avx2"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("offers scalar"), std::string::npos) << r.output;
}

TEST(IsaCli, LevelAboveTheCpusIsOneClearError) {
  if (cpu_isa_level() == IsaLevel::kAmx) GTEST_SKIP() << "this CPU offers every level";
  const std::string above = isa_name(IsaLevel(int(cpu_isa_level()) + 1));
  auto r = testing::run_command(with_isa(above, "inspect --model /nonexistent-model"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("error: SLUICE_ISA=" + above + ": this CPU"), std::string::npos)
      << r.output;
}

// The built-in job at the lowest level: no instruction above x86-64-v2 runs, and it still works
// end to end (quick profile, planner, engine, results).
TEST(IsaCli, DemoRunsAtTheScalarLevel) {
  testing::TempDir cache;
  auto r = testing::run_command("XDG_CACHE_HOME=" + cache.path().string() + " " +
                                with_isa("scalar", "demo"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("8 completed, 0 failed"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sluice::cpu
