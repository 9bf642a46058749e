// The planner's GPU memory accounting (gpu_memory_use) against the offload executor's footprint
// (offload_footprint) for the same settings: the planner must not choose a plan the executor then
// refuses for want of memory, nor leave much of the budget unused. The executor is at most what
// the planner counts, and within a few percent of it.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "engine/offload_executor.h"
#include "model/presets.h"
#include "runtime/planner/offload_cost_model.h"

namespace sluice {
namespace {

// cuBLASLt's workspace: the CUDA math takes it from the device budget before the executor does
// (kernels/cuda/gemm.h), and the planner counts it among the step buffers.
constexpr size_t kGemmWorkspace = size_t(32) << 20;

struct Setting {
  int batch, prefill_chunk, expert_batch;
  Precision precision;
  int resident, depth, cpu_expert_max_tokens;
  double omega;  // the CPU's share of attention; below 1 the GPU holds a KV pool
};

// Mixtral; Qwen2-57B-A14B with a dense layer (shared experts and their gates, a dense MLP, q/k/v
// biases resident); DBRX (LayerNorm, clip_qkv). Four layers each.
std::vector<ModelConfig> agreement_models() {
  ModelConfig qwen2 = preset_config("qwen2-57b-a14b", 4);
  qwen2.dense_layers = {2};
  return {preset_config("mixtral-8x7b", 4), qwen2, preset_config("dbrx", 4)};
}

// The planner's GPU memory use and the executor's footprint for `c` under `s`, compared.
void expect_agreement(const ModelConfig& c, const Setting& s) {
  Policy p;
  p.batch = s.batch;
  p.attn_micro_batch = 64;
  p.prefill_chunk = s.prefill_chunk;
  p.expert_batch = s.expert_batch;
  p.kv_block_size = 16;
  p.kv_blocks = s.batch * 64;
  p.precision = s.precision;
  OffloadPlan o;
  o.gpu = true;
  o.cpu_attention_share = s.omega;
  o.resident_expert_layers = s.resident;
  o.page_bytes = expert_weight_bytes(c) / 3;  // one matrix, as the executor pages
  o.prefetch_depth = s.depth;
  o.cpu_expert_max_tokens = s.cpu_expert_max_tokens;
  const GpuMemoryUse planned = gpu_memory_use(c, p, o);

  OffloadSettings e;
  e.page_slots = 3 * s.depth;  // as plan_for_workload fills it
  e.cpu_expert_max_tokens = s.cpu_expert_max_tokens;
  e.resident_expert_layers = s.resident;
  e.lm_head = LmHeadPlace::kDevice;  // the planner counts the lm_head on the GPU
  e.cpu_attention_share = s.omega;
  const OffloadFootprint f = offload_footprint(c, p, e);
  const bool streams = s.resident < c.num_layers;
  const size_t executor = f.with_slots(streams ? e.page_slots : 0) + kGemmWorkspace;

  SCOPED_TRACE(::testing::Message() << p.describe() << " " << describe(o));
  std::printf("%s %s: planner %zu, executor %zu bytes (%+.3f%%)\n", p.describe().c_str(),
              describe(o).c_str(), planned.total(), executor,
              100.0 * (double(executor) / double(planned.total()) - 1));
  EXPECT_EQ(f.resident_experts, planned.resident_experts);
  EXPECT_EQ(f.page_bytes * size_t(streams ? e.page_slots : 0), planned.page_slots);
  // The GPU share's KV pool, whole blocks, and their block table entries (in the buffers).
  const size_t pool_blocks = size_t(gpu_kv_blocks(p.kv_blocks, s.omega));
  EXPECT_EQ(f.kv_pool, pool_blocks * size_t(p.kv_block_size) * kv_bytes_per_token(c));
  EXPECT_EQ(planned.kv_cache, f.kv_pool + pool_blocks * 4);
  EXPECT_EQ(f.kv_pool == 0, s.omega == 1);
  EXPECT_LE(executor, planned.total());
  EXPECT_GE(double(executor), 0.97 * double(planned.total()));
}

TEST(OffloadMemoryAgreement, PlannerCountsWhatTheExecutorAllocates) {
  for (const ModelConfig& c : agreement_models()) {
    SCOPED_TRACE(c.architecture);
    const Setting settings[] = {
        {64, 512, 256, Precision::kBf16, 0, 2, 0, 1},
        {64, 512, 256, Precision::kBf16, 1, 3, 16, 1},
        {256, 2048, 1024, Precision::kBf16, 2, 4, 4, 1},
        {32, 256, 64, Precision::kF32, 3, 2, 0, 1},
        {128, 512, 512, Precision::kBf16, 4, 2, 16, 1},
        {1, 16, 16, Precision::kBf16, 0, 2, 0, 1},
        {64, 512, 256, Precision::kBf16, 1, 2, 0, 0.5},
        {32, 256, 64, Precision::kF32, 2, 2, 4, 0},
        {128, 512, 512, Precision::kBf16, 4, 3, 16, 0.75},
        {1, 16, 16, Precision::kBf16, 0, 2, 0, 0.25},
    };
    for (const Setting& s : settings) expect_agreement(c, s);
  }
}

// DeepSeek-V3 cut to its three dense layers and one MoE layer, FP8 as released: the resident
// projections, dense MLPs and expert pages at 1 byte per weight with their block scales, and the
// FP8 GEMMs' dequantisation tile, counted alike by both. Multi-head latent attention runs on the
// host (ω = 1).
TEST(OffloadMemoryAgreement, Fp8WeightsAreCountedAlike) {
  const ModelConfig c = preset_config("deepseek-v3", 4);
  ASSERT_TRUE(c.fp8_weights);
  for (const Setting& s : {Setting{64, 512, 256, Precision::kBf16, 0, 2, 0, 1},
                           Setting{256, 2048, 1024, Precision::kBf16, 1, 4, 4, 1},
                           Setting{32, 256, 64, Precision::kF32, 0, 3, 16, 1}})
    expect_agreement(c, s);
}

}  // namespace
}  // namespace sluice
