// FP8 weights (DeepSeek-V3's e4m3 with 128 × 128 block scales) on the offload path, on the CPU
// stand-in device: the device holds and streams the codes and scales as the host does, 1 byte
// per weight (fp8_device_matrix's form), and the "device" GEMM (HostMath::gemm_fp8) dequantises
// them inside the CPU engine's kernel. The greedy tokens are the CPU engine's, token for token,
// on the tiny V3 model as make-model writes it and as a loaded checkpoint; the bytes on the link
// and in the footprint are the FP8 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/offload_executor.h"
#include "engine/offload_layout.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

constexpr int kNew = 16;

struct Fp8Run {
  std::map<int64_t, std::vector<int>> tokens;
  EngineStats stats;
};

// The test's requests, greedy; nobody reads the logits, so with the lm_head on the device the
// device picks the tokens.
Fp8Run run(BatchEngine& engine, const ModelConfig& c) {
  Fp8Run out;
  engine.run(testing::prompt_length_requests(c.vocab_size, kNew),
             [&](Completion&& done) { out.tokens[done.id] = done.tokens; });
  out.stats = engine.stats();
  return out;
}

Fp8Run on_standin(const Model& m, const Policy& p, const OffloadSettings& s) {
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  BatchEngine engine(m, p, EngineDevice{&device, &math, s});
  return run(engine, m.config);
}

// Every projection of the tiny V3 model but kv_b_proj (which stays on the host) is on the
// device in FP8; its experts stream (none resident), sit resident (all), or both; some run on
// the CPU path; the lm_head on the device or the host. Token for token the CPU engine's, in
// both precisions; and the same work accounted.
void expect_cpu_engines_tokens(const Model& m) {
  ASSERT_TRUE(m.config.fp8_weights);
  ASSERT_EQ(m.weights.layers.back().expert_gate.dtype, DType::F8_E4M3);
  const int L = m.config.num_layers;
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    const Policy p = testing::exercising_policy(precision, kNew);
    BatchEngine cpu_engine(m, p);
    const Fp8Run want = run(cpu_engine, m.config);
    ASSERT_EQ(want.tokens.size(), std::size(testing::kPromptLengths));
    for (int resident : {0, 2, L})
      for (int cpu_max : {0, 2})
        for (LmHeadPlace lm : {LmHeadPlace::kDevice, LmHeadPlace::kHost}) {
          SCOPED_TRACE(::testing::Message()
                       << precision_name(precision) << ", resident " << resident << " of " << L
                       << ", CPU experts <= " << cpu_max << ", lm_head on the device "
                       << (lm == LmHeadPlace::kDevice));
          OffloadSettings s{0, 6, cpu_max};
          s.resident_expert_layers = resident;
          s.lm_head = lm;
          const Fp8Run got = on_standin(m, p, s);
          EXPECT_EQ(got.tokens, want.tokens);
          EXPECT_DOUBLE_EQ(got.stats.flops, want.stats.flops);
          EXPECT_DOUBLE_EQ(got.stats.weight_bytes, want.stats.weight_bytes);
          EXPECT_EQ(got.stats.expert_tokens, want.stats.expert_tokens);
          EXPECT_EQ(got.stats.device_pages_copied > 0, resident < L);
          if (cpu_max > 0 && resident < L) {
            EXPECT_GT(got.stats.device_cpu_experts, 0);
          }
        }
  }
}

TEST(OffloadFp8, GreedyTokensEqualTheCpuEngine) {
  expect_cpu_engines_tokens(make_random_model(preset_config("tiny-deepseek-v3"), 42));
}

// As make-model writes the checkpoint and load_model maps it: the codes used in place, the
// scales separate tensors, the experts stacked.
TEST(OffloadFp8, GreedyTokensEqualTheCpuEngineOnALoadedCheckpoint) {
  testing::TempDir dir;
  write_random_checkpoint(preset_config("tiny-deepseek-v3"), dir.path(), 7);
  expect_cpu_engines_tokens(load_model(dir.path()));
}

// --expert-dtype int8 on the FP8 model: the experts and dense MLPs quantized from their
// dequantised weights at load and streamed packed, the attention projections still FP8 on the
// device; token for token the CPU engine's.
TEST(OffloadFp8, QuantizedExpertsBesideFp8Projections) {
  Model m = make_random_model(preset_config("tiny-deepseek-v3"), 42);
  quantize_model_experts(m, {ExpertDtype::kInt8, 32});
  ASSERT_EQ(m.weights.layers.back().expert_gate.dtype, DType::U8);
  ASSERT_EQ(m.weights.layers.back().q_b.dtype, DType::F8_E4M3);
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    const Policy p = testing::exercising_policy(precision, kNew);
    BatchEngine cpu_engine(m, p);
    const Fp8Run want = run(cpu_engine, m.config);
    const Fp8Run got = on_standin(m, p, {0, 6, 2});
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_DOUBLE_EQ(got.stats.flops, want.stats.flops);
    EXPECT_DOUBLE_EQ(got.stats.device_weight_bytes,
                     double(got.stats.device_pages_copied) * double(expert_matrix_bytes(m.config)));
  }
}

// The stand-in's FP8 GEMM reads the device form (scales, then codes, in one buffer) and gives
// cpu::gemm_fp8's numbers on the separate arrays, bit for bit, over partial edge blocks (576
// rows as kv_a_proj_with_mqa; n and k not multiples of 128; a depth past the kernel's 1024-wide
// panel), bf16 and fp32 inputs, beta 0 and 1.
TEST(OffloadFp8, StandinGemmEqualsTheCpuKernelOverPartialBlocks) {
  offload::HostMath math;
  std::mt19937 rng(5);
  std::normal_distribution<float> d;
  for (auto [m, n, k] : {std::tuple{1, 576, 64}, {7, 200, 300}, {5, 129, 1100}, {3, 5, 7}}) {
    const Shape scale_shape = fp8_scale_shape(n, k);
    std::vector<uint8_t> q(size_t(n) * k);
    for (uint8_t& c : q) c = uint8_t(rng() % 0x7f) | uint8_t(rng() & 0x80);  // no NaN
    std::vector<float> scale(size_t(shape_numel(scale_shape)));
    for (float& v : scale) v = std::exp2(float(int(rng() % 12)) - 10.0f);
    std::vector<char> device_form(fp8_matrix_bytes(n, k));
    std::memcpy(device_form.data(), scale.data(), scale.size() * 4);
    std::memcpy(device_form.data() + scale.size() * 4, q.data(), q.size());
    const cpu::Fp8Matrix host{q.data(), scale.data(), n, k};
    const cpu::Fp8Matrix device = fp8_device_matrix(device_form.data(), n, k);
    ASSERT_EQ(device.q, reinterpret_cast<const uint8_t*>(device_form.data()) + scale.size() * 4);
    std::vector<float> xf(size_t(m) * k), y0(size_t(m) * n);
    for (float& v : xf) v = d(rng);
    for (float& v : y0) v = d(rng);
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
    for (bool x_bf16 : {true, false})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(::testing::Message()
                     << m << "x" << n << "x" << k << " bf16 x " << x_bf16 << " beta " << beta);
        const void* x = x_bf16 ? static_cast<const void*>(xb.data()) : xf.data();
        std::vector<float> want = y0, got = y0;
        cpu::gemm_fp8({.m = m,
                       .x = x,
                       .x_dtype = x_bf16 ? DType::BF16 : DType::F32,
                       .w = &host,
                       .y = want.data(),
                       .beta = beta,
                       .round_x_to_bf16 = false});
        math.gemm_fp8(
            nullptr,
            {.w = device, .m = m, .x = x, .x_bf16 = x_bf16, .y = got.data(), .beta = beta});
        EXPECT_EQ(got, want);
        // And the reference (W dequantised whole, X rounded to bf16): bf16 inputs agree to fp32
        // summation order.
        if (x_bf16) {
          std::vector<float> ref = y0;
          cpu::gemm_fp8_reference(
              {.m = m, .x = x, .x_dtype = DType::BF16, .w = &host, .y = ref.data(), .beta = beta});
          EXPECT_LT(testing::relative_max_error(got, ref), 1e-5);
        }
      }
  }
}

// On the link: every streamed page is one FP8 expert matrix, its block scales then its codes (1
// byte per weight), copied as two ranges of the host's own tensors: the weight bytes per page are
// the codes and scales, where the same model in bf16 copies 2 bytes per weight. The footprint's
// pages and resident projections are the FP8 sizes, and the step buffers hold the
// dequantisation tile.
TEST(OffloadFp8, PagesAndFootprintCarryOneBytePerWeightAndTheScales) {
  const ModelConfig fp8 = preset_config("tiny-deepseek-v3");
  const ModelConfig bf16 = [&] {
    ModelConfig c = fp8;
    c.fp8_weights = false;
    return c;
  }();
  const int64_t H = fp8.hidden_size, I = fp8.expert_intermediate_size;
  const size_t scale_bytes = size_t(shape_numel(fp8_scale_shape(I, H))) * 4;
  ASSERT_EQ(fp8_matrix_bytes(I, H), size_t(I * H) + scale_bytes);
  const Policy p = testing::exercising_policy(Precision::kBf16, kNew);
  OffloadSettings s{0, 6, 0};
  s.resident_expert_layers = 0;
  for (const ModelConfig* c : {&fp8, &bf16}) {
    const Model m = make_random_model(*c, 42);
    offload::CpuStandinDevice device(size_t(1) << 30);
    offload::HostMath math;
    BatchEngine engine(m, p, EngineDevice{&device, &math, s});
    const Fp8Run got = run(engine, m.config);
    const EngineStats& st = got.stats;
    ASSERT_GT(st.device_pages_copied, 0);
    const size_t page = c == &bf16 ? size_t(I * H) * 2 : fp8_matrix_bytes(I, H);
    EXPECT_DOUBLE_EQ(st.device_weight_bytes, double(st.device_pages_copied) * double(page));
    if (c == &bf16) continue;
    device.synchronize_all();  // every copy issued has completed, and is in the trace
    // The weights queue's page copies: the scales and the codes of each matrix.
    int64_t scale_copies = 0, code_copies = 0;
    for (const offload::TraceEntry& t : device.trace()) {
      if (t.queue != offload::Queue::kWeights || t.bytes == 0) continue;
      if (t.label.starts_with("L") && t.label.find(".e") != std::string::npos) {
        scale_copies += t.bytes == scale_bytes;
        code_copies += t.bytes == size_t(I * H);
        EXPECT_TRUE(t.bytes == scale_bytes || t.bytes == size_t(I * H)) << t.label;
      }
    }
    EXPECT_EQ(scale_copies, st.device_pages_copied);
    EXPECT_EQ(code_copies, st.device_pages_copied);
    const OffloadFootprint f = offload_footprint(m.config, p, s),
                           fb = offload_footprint(bf16, p, s);
    EXPECT_EQ(f.page_bytes, fp8_matrix_bytes(I, H));
    EXPECT_EQ(fb.page_bytes, size_t(I * H) * 2);
    EXPECT_LT(f.resident, fb.resident);  // the projections in FP8 (the router stays bf16)
    EXPECT_EQ(f.buffers - fb.buffers, (size_t(fp8_tile_elements(fp8)) * 2 + 255) / 256 * 256);
    EXPECT_GT(fp8_tile_elements(fp8), 0);
    EXPECT_EQ(fp8_tile_elements(bf16), 0);
  }
}

// The device holds every projection in FP8 when config.json declares FP8 weights: one left in
// bf16 is refused before anything runs, naming the tensor and what was expected.
TEST(OffloadFp8, AProjectionNotInFp8IsNamed) {
  Model m = make_random_model(preset_config("tiny-deepseek-v3"), 42);
  Tensor& wo = m.weights.layers[1].wo;
  wo = Tensor::allocate(DType::BF16, wo.shape);
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  EXPECT_ERROR_MENTIONS(BatchEngine(m, testing::exercising_policy(Precision::kBf16, kNew),
                                    EngineDevice{&device, &math, {0, 6, 0}}),
                        "layer 1 o_proj", "expected F8_E4M3", "block scales", "got BF16",
                        "without scales");
}

}  // namespace
}  // namespace sluice
