// The roofline bench prints (engine/throughput_report.h): with int8 or int4 experts, their GEMMs'
// operations count against the int8 dot product's peak and the rest against the bf16 one; with
// bf16 experts every FLOP counts against the bf16 peak.
#include <gtest/gtest.h>

#include "engine/throughput_report.h"

namespace sluice {
namespace {

Ceilings made_up_ceilings() {
  Ceilings c;
  c.dram_bytes_per_s = 10e9;
  c.gemm_flops = 80e9;
  c.instructions = {.fp32_fma_flops = 50e9,
                    .bf16_flops = 100e9,
                    .int8_ops = 200e9,
                    .fp32_instruction = "fma",
                    .bf16_instruction = "bf16 dot",
                    .int8_instruction = "int8 dot"};
  return c;
}

// 1000 GFLOP in 20 s, 800 of them in the expert GEMMs (10 s inside them); the decode-only steps
// did 100 GFLOP (80 of the experts') in 4 s. 10 GB read: never the bound here.
EngineStats made_up_run() {
  EngineStats s;
  s.flops = 1000e9;
  s.expert_flops = 800e9;
  s.expert_gemm_seconds = 10;
  s.weight_bytes = 10e9;
  s.decode_only_seconds = 4;
  s.decode_only_flops = 100e9;
  s.decode_only_expert_flops = 80e9;
  s.decode_only_bytes = 1e9;
  s.prefill_seconds = 12;
  s.decode_seconds = 8;
  return s;
}

TEST(ThroughputReport, QuantizedExpertsCountAgainstTheInt8Peak) {
  const Ceilings c = made_up_ceilings();
  const EngineStats s = made_up_run();
  const ThroughputReport bf16 = summarize(s, 20, 100, 100, c, Precision::kBf16);
  // 1000 GFLOP at 100 GFLOP/s: 10 s of the 20.
  EXPECT_DOUBLE_EQ(bf16.roofline_seconds, 10);
  EXPECT_DOUBLE_EQ(bf16.fraction_of_compute_ceiling, 0.5);
  EXPECT_DOUBLE_EQ(bf16.expert_gemm_fraction_of_ceiling, 0.8);  // 80 GFLOP/s of 100
  EXPECT_EQ(bf16.expert_ceiling_instruction, "bf16 dot");

  const ThroughputReport int8 =
      summarize(s, 20, 100, 100, c, Precision::kBf16, ExpertDtype::kInt8);
  // 200 GFLOP at 100 and 800 GOP at 200: 6 s.
  EXPECT_DOUBLE_EQ(int8.roofline_seconds, 6);
  EXPECT_DOUBLE_EQ(int8.fraction_of_roofline, 0.3);
  EXPECT_DOUBLE_EQ(int8.fraction_of_compute_ceiling, 0.3);
  EXPECT_DOUBLE_EQ(int8.expert_gemm_fraction_of_ceiling, 0.4);  // 80 GOP/s of 200
  EXPECT_EQ(int8.expert_ceiling_instruction, "int8 dot");
  // Decode-only steps: 20 GFLOP at 100 and 80 GOP at 200 = 0.6 s of 4.
  EXPECT_DOUBLE_EQ(int8.decode_fraction_of_roofline, 0.6 / 4);
  // The other steps: 180 GFLOP at 100 and 720 GOP at 200 = 5.4 s of 16.
  EXPECT_DOUBLE_EQ(int8.prefill_fraction_of_roofline, 5.4 / 16);
  // int4 experts run on the same int8 dot product.
  EXPECT_DOUBLE_EQ(summarize(s, 20, 100, 100, c, Precision::kBf16, ExpertDtype::kInt4)
                       .roofline_seconds,
                   6);
}

}  // namespace
}  // namespace sluice
