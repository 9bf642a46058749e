// Quantized experts (--expert-dtype int8/int4) on the offload path, on the CPU stand-in device:
// the pages streamed are the packed bytes the host holds, the "device" GEMM (HostMath::
// gemm_quant) computes from them, and the results are the CPU engine's on the same quantized
// model: bit for bit in f32 precision with every expert on the device, within the bf16 engine
// tolerance otherwise. The executor's footprint and the bytes it streams follow the packed size.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/offload_executor.h"
#include "engine/offload_layout.h"
#include "model/expert_quant.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

constexpr int kNew = 12;

struct QuantRun {
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;
  std::map<int64_t, std::vector<int>> tokens;
  EngineStats stats;
};

QuantRun run(BatchEngine& engine, const ModelConfig& c) {
  QuantRun out;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    out.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  std::vector<Request> requests = testing::prompt_length_requests(c.vocab_size, kNew);
  engine.run(requests, [&](Completion&& done) { out.tokens[done.id] = done.tokens; });
  out.stats = engine.stats();
  return out;
}

QuantRun on_standin(const Model& m, const Policy& p, const OffloadSettings& s) {
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  BatchEngine engine(m, p, EngineDevice{&device, &math, s});
  return run(engine, m.config);
}

class OffloadQuantized : public ::testing::TestWithParam<testing::QuantizedTinyCase> {
 protected:
  Model model() const {
    Model m = make_random_model(preset_config(GetParam().preset), 42);
    quantize_model_experts(m, {GetParam().dtype, GetParam().group});
    return m;
  }
};

TEST_P(OffloadQuantized, StreamedAndResidentExpertsGiveTheCpuEnginesNumbers) {
  const Model m = model();
  const int L = m.config.num_layers;
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    const Policy p = testing::exercising_policy(precision, kNew);
    BatchEngine cpu_engine(m, p);
    const QuantRun want = run(cpu_engine, m.config);
    for (int resident : {0, 1, L})
      for (int cpu_max : {0, 2}) {
        SCOPED_TRACE(::testing::Message()
                     << "f32 " << (precision == Precision::kF32) << ", resident " << resident
                     << ", cpu experts ≤ " << cpu_max);
        OffloadSettings s{0, 6, cpu_max};
        s.resident_expert_layers = resident;
        const QuantRun got = on_standin(m, p, s);
        EXPECT_EQ(got.tokens, want.tokens);
        ASSERT_EQ(got.logits.size(), want.logits.size());
        double worst = 0;
        int bitwise = 0;
        for (const auto& [key, row] : want.logits) {
          worst = std::max(worst, testing::relative_max_error(got.logits.at(key), row));
          bitwise += got.logits.at(key) == row;
        }
        // f32 with every expert on the device is the CPU engine's arithmetic in its order; CPU
        // experts join the residual after the device's (see offload_executor_test).
        if (precision == Precision::kF32 && cpu_max == 0)
          EXPECT_EQ(bitwise, int(want.logits.size()));
        else
          EXPECT_LT(worst, 1e-2);
        EXPECT_DOUBLE_EQ(got.stats.flops, want.stats.flops);
        if (resident < L) {
          EXPECT_GT(got.stats.device_pages_copied, 0);
        }
        // Every page copied is one packed expert matrix (w1/w3 and w2 pack to the same size
        // at these shapes).
        EXPECT_DOUBLE_EQ(got.stats.device_weight_bytes, double(got.stats.device_pages_copied) *
                                                            double(expert_matrix_bytes(m.config)));
      }
  }
}

TEST_P(OffloadQuantized, TheFootprintCountsThePackedBytes) {
  const Model m = model();
  ModelConfig bf16 = m.config;
  bf16.expert_quant = {};
  const Policy p = testing::exercising_policy(Precision::kBf16, kNew);
  OffloadSettings s{0, 6, 0};
  s.resident_expert_layers = m.config.num_layers;
  const OffloadFootprint q = offload_footprint(m.config, p, s), b = offload_footprint(bf16, p, s);
  const int64_t H = m.config.hidden_size, I = m.config.expert_intermediate_size;
  const size_t packed = cpu::quant_bytes(quant_format(GetParam().dtype), I, H, GetParam().group);
  EXPECT_EQ(expert_matrix_bytes(m.config), packed);
  EXPECT_EQ(q.page_bytes, packed);
  EXPECT_EQ(q.resident_experts, size_t(m.config.num_layers) * 3 * m.config.num_experts * packed);
  EXPECT_LT(q.resident_experts, b.resident_experts);
  EXPECT_LT(q.page_bytes, b.page_bytes);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, OffloadQuantized,
                         ::testing::ValuesIn(testing::quantized_tiny_cases()),
                         testing::quantized_case_name);

}  // namespace
}  // namespace sluice
