// The GPU offload pipeline's cost model against hand arithmetic (expert page bytes, a copy-bound
// critical path, the prefetch window), GPU memory accounting, and the planner's search over the
// offload plan, all with a synthetic GPU profile whose numbers make the arithmetic easy.
#include "runtime/planner/offload_cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "model/presets.h"
#include "runtime/disk/expert_page_pool.h"
#include "runtime/planner/planner.h"
#include "synthetic_profile.h"

namespace sluice {
namespace {

// CPU: 1e11 B/s DRAM, 1e12 FLOP/s. GPU: 1e12 B/s device memory, 1e14 FLOP/s, PCIe 2e10 B/s.
HardwareProfile synthetic_gpu_profile(double h2d = 2e10) {
  testing::SyntheticGpu gpu;
  gpu.h2d = h2d;
  return testing::synthetic_gpu_profile(gpu);
}

Policy small_policy() {
  Policy p;
  p.batch = 64, p.attn_micro_batch = 64, p.expert_batch = 256, p.prefill_chunk = 64;
  p.kv_blocks = 64;
  return p;
}

// The device's rows per expert GEMM: b_e, raised to 1024 (a GPU at 16 rows is memory bound), and
// never more than a step's rows (B + the prefill chunk).
TEST(OffloadCostModel, DeviceExpertRows) {
  Policy p;
  p.batch = 256, p.prefill_chunk = 4096, p.expert_batch = 16;
  EXPECT_EQ(p.device_expert_rows(), 1024);
  p.expert_batch = 2048;
  EXPECT_EQ(p.device_expert_rows(), 2048);
  p.batch = 64, p.prefill_chunk = 64;
  EXPECT_EQ(p.device_expert_rows(), 128);
  p.batch = 0, p.prefill_chunk = 0;  // unresolved: one row, never an empty GEMM loop
  EXPECT_EQ(p.device_expert_rows(), 1);
}

OffloadPlan streamed(int depth = 2) {
  OffloadPlan o;
  o.gpu = true;
  o.cpu_attention_share = 1.0;
  o.resident_expert_layers = 0;
  o.page_bytes = size_t(14336) * 4096 * 2;  // one expert matrix
  o.prefetch_depth = depth;
  return o;
}

StepShape decode_step(int tokens, double kv_positions, int sampled = 0) {
  StepShape s;
  s.micro_batches = {MicroBatchShape{tokens, kv_positions, kv_positions}};
  s.decode_tokens = tokens;
  s.sampled = sampled;
  return s;
}

double sum_of(const TaskGraph& g, const std::string& group, double Task::*field) {
  double s = 0;
  for (const Task& t : g.tasks())
    if (t.group == group) s += t.*field;
  return s;
}

const double kExpertBytes = 3.0 * 14336 * 4096 * 2;

TEST(OffloadCostModel, DecodeCopiesOnlyExpertsThatGetATokenFromNonResidentLayers) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  EXPECT_EQ(expert_weight_bytes(c), size_t(kExpertBytes));
  // 8 decode tokens, top-2 of 8: an expert is idle with probability (3/4)^8.
  const double busy = 1 - std::pow(0.75, 8);
  OffloadPlan o = streamed();
  const OffloadCostModel all_streamed(synthetic_gpu_profile(), c, small_policy(), o);
  const TaskGraph g = all_streamed.step_graph(decode_step(8, 800));
  EXPECT_NEAR(sum_of(g, "expert weights", &Task::bytes), 4 * 8 * busy * kExpertBytes,
              1e-9 * kExpertBytes);
  // Two of four layers resident (layers 1 and 3, evenly spaced): half the copies.
  o.resident_expert_layers = 2;
  EXPECT_FALSE(layer_resident(0, 4, 2));
  EXPECT_TRUE(layer_resident(1, 4, 2));
  EXPECT_FALSE(layer_resident(2, 4, 2));
  EXPECT_TRUE(layer_resident(3, 4, 2));
  const OffloadCostModel half(synthetic_gpu_profile(), c, small_policy(), o);
  EXPECT_NEAR(sum_of(half.step_graph(decode_step(8, 800)), "expert weights", &Task::bytes),
              2 * 8 * busy * kExpertBytes, 1e-9 * kExpertBytes);
  // Experts with at most 2 tokens run on the CPU and are never copied: P(m > 2) of each.
  o.resident_expert_layers = 0;
  o.cpu_expert_max_tokens = 2;
  const double p_gpu =
      1 - std::pow(0.75, 8) - 8 * 0.25 * std::pow(0.75, 7) - 28 * 0.0625 * std::pow(0.75, 6);
  const OffloadCostModel cpu_small(synthetic_gpu_profile(), c, small_policy(), o);
  EXPECT_NEAR(cpu_small.gpu_expert_probability(8), p_gpu, 1e-12);
  const TaskGraph gc = cpu_small.step_graph(decode_step(8, 800));
  EXPECT_NEAR(sum_of(gc, "expert weights", &Task::bytes), 4 * 8 * p_gpu * kExpertBytes,
              1e-9 * kExpertBytes);
  EXPECT_GT(sum_of(gc, "CPU experts", &Task::seconds), 0);
  // The CPU's attention share moves q/k/v down and the output up: ω·n·(4096 + 2·1024) and
  // ω·n·4096 bf16 values, plus the embedding rows (fp32) up and the routing pairs down.
  EXPECT_NEAR(sum_of(g, "activation copies", &Task::bytes),
              4 * (8 * 6144 * 2 + 8 * 4096 * 2 + 8 * 2 * 8) + 8 * 4096 * 4, 1e-6);
}

TEST(OffloadCostModel, PcieBoundStepIsTheCopyChain) {
  // A slow link (1 GB/s): every other resource idles while the weights stream.
  const ModelConfig c = preset_config("mixtral-8x7b", 2);
  const OffloadCostModel m(synthetic_gpu_profile(1e9), c, small_policy(), streamed());
  const StepShape step = decode_step(4, 400);
  const TaskGraph g = m.step_graph(step);
  const double q = 1 - std::pow(0.75, 4);
  const double copy = q * kExpertBytes / 1e9 + q * 3 * kLaunchSeconds;
  EXPECT_DOUBLE_EQ(m.h2d_seconds(q * kExpertBytes, q * 3), copy);
  // The copies start at once (nothing gates the prefetch of the first experts) and run back to
  // back; only the last expert's GEMM follows the last copy.
  const double want = 2 * 8 * copy + m.gpu_expert_seconds(4);
  EXPECT_NEAR(g.critical_path_seconds(), want, 1e-9 * want);
  EXPECT_NEAR(m.step_seconds(step), want, 1e-9 * want);
  int copies_on_path = 0;
  for (int v : g.critical_path())
    if (g.tasks()[size_t(v)].group == "expert weights") ++copies_on_path;
  EXPECT_EQ(copies_on_path, 16);
  // The planner names it.
  const std::vector<PhaseBottleneck> why =
      explain(m, std::vector<WorkloadRequest>(4, WorkloadRequest{8, 4}));
  ASSERT_EQ(why.size(), 2u);
  EXPECT_EQ(why[1].phase, "decode");
  EXPECT_EQ(why[1].resource, Resource::kHostToDevice);
  EXPECT_NE(why[1].sentence().find("decode is bound by PCIe host-to-device bandwidth while "
                                   "streaming expert weights: "),
            std::string::npos)
      << why[1].sentence();
  EXPECT_GT(why[1].fraction, 0.9);
  EXPECT_GT(why[1].use.h2d_busy, 0.9);
}

TEST(OffloadCostModel, PrefetchWindowBoundsHowFarCopiesRunAhead) {
  // One layer whose attention (all on the GPU, ω = 0, over a long KV) takes longer than four
  // expert copies. With depth d the first d experts arrive during attention; each later copy
  // waits for a slot, freed when the expert d places earlier finishes. Copy c > GEMM g, so:
  //   step = A + 2g + (E - d)·c, A = when the routing reaches the host.
  const ModelConfig c = preset_config("mixtral-8x7b", 1);
  const StepShape step = decode_step(64, 4e7);
  auto step_for_depth = [&](int depth, double* A, double* copy, double* gemm) {
    OffloadPlan o = streamed(depth);
    o.cpu_attention_share = 0;
    const OffloadCostModel m(synthetic_gpu_profile(), c, small_policy(), o);
    const TaskGraph g = m.step_graph(step);
    const std::vector<double> finish = g.finish_times();
    for (size_t i = 0; i < g.tasks().size(); ++i)
      if (g.tasks()[i].name == "layer0.mb0.routing_d2h") *A = finish[i];
    const double q = m.gpu_expert_probability(64);
    *copy = m.h2d_seconds(q * kExpertBytes, q * 3);
    *gemm = m.gpu_expert_seconds(64);
    return g.critical_path_seconds();
  };
  double A = 0, copy = 0, gemm = 0;
  const double two = step_for_depth(2, &A, &copy, &gemm);
  ASSERT_GT(A, 4 * copy);  // the window, not the link, limits the run-ahead
  ASSERT_GT(copy, gemm);   // and the link is the slower stage afterwards
  EXPECT_NEAR(two, A + 2 * gemm + 6 * copy, 1e-9 * two);
  const double four = step_for_depth(4, &A, &copy, &gemm);
  EXPECT_NEAR(four, A + 2 * gemm + 4 * copy, 1e-9 * four);
  EXPECT_NEAR(two - four, 2 * copy, 1e-9 * two);
}

TEST(OffloadCostModel, StepSecondsIsTheGraphsTimeInEveryConfiguration) {
  // The search's fast path (finish times only) against the named graph, with every branch on:
  // a CPU attention share, GPU attention, resident and streamed layers, CPU experts, sampling.
  const ModelConfig c = preset_config("mixtral-8x7b", 3);
  OffloadPlan o = streamed(3);
  o.cpu_attention_share = 0.5;
  o.resident_expert_layers = 1;
  o.cpu_expert_max_tokens = 4;
  o.page_bytes = size_t(32) << 20;
  StepShape s;
  s.micro_batches = {{100, 900, 5000}, {37, 3000, 3000}, {5, 40, 40}};
  s.sampled = 40;
  for (double h2d : {1e9, 2e10, 1e12}) {
    const OffloadCostModel m(synthetic_gpu_profile(h2d), c, small_policy(), o);
    const TaskGraph g = m.step_graph(s);
    EXPECT_NEAR(m.step_seconds(s), pipeline_step_seconds(g), 1e-12 * m.step_seconds(s)) << h2d;
    EXPECT_GE(pipeline_step_seconds(g), g.critical_path_seconds());
    const ResourceUse u = resource_use(g);
    for (double busy : {u.gpu_busy, u.cpu_busy, u.h2d_busy, u.d2h_busy}) {
      EXPECT_GT(busy, 0) << h2d;
      EXPECT_LE(busy, 1 + 1e-12) << h2d;
    }
  }
}

TEST(OffloadCostModel, GpuMemoryByHand) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  Policy p = small_policy();
  p.kv_block_size = 16;
  OffloadPlan o = streamed(3);
  o.cpu_attention_share = 0.25;
  o.resident_expert_layers = 1;
  o.page_bytes = size_t(16) << 20;
  const GpuMemoryUse m = gpu_memory_use(c, p, o);
  const double H = 4096, kvd = 1024, L = 4;
  EXPECT_EQ(m.attention_weights, size_t(L * (2 * H * H + 2 * H * kvd) * 2));
  EXPECT_EQ(m.resident_experts, size_t(8 * kExpertBytes));
  // 336 MiB experts in 16 MiB pages: 21 pages each, 3 experts' worth of slots.
  EXPECT_EQ(pages_per_expert(c, o.page_bytes), 21);
  EXPECT_EQ(m.page_slots, size_t(3) * 21 * (size_t(16) << 20));
  // The GPU holds 3/4 of 64 blocks of 16 tokens × (4 layers × 2 × 1024 × 2 bytes), and a 4-byte
  // block table entry per block.
  EXPECT_EQ(gpu_kv_blocks(64, 0.25), 48);
  EXPECT_EQ(m.kv_cache, size_t(48) * (16 * 4 * 2 * 1024 * 2 + 4));
  // Whole blocks, rounded up; a share like 0.3 does not round up past the exact count.
  EXPECT_EQ(gpu_kv_blocks(10, 0.3), 7);
  EXPECT_EQ(gpu_kv_blocks(10, 0.35), 7);
  EXPECT_EQ(gpu_kv_blocks(10, 1.0), 0);
  EXPECT_EQ(gpu_kv_blocks(10, 0.0), 10);
  // Every layer resident: no page slots.
  o.resident_expert_layers = 4;
  EXPECT_EQ(gpu_memory_use(c, p, o).page_slots, 0u);
}

// Qwen2-57B-A14B cut to 3 layers, layer 1 dense: the GPU holds each MoE layer's shared expert
// and gate and the dense layer's MLP, routers only for MoE layers, and the q/k/v biases; a step
// runs each layer's dense MLP over every row, routes and runs experts only in MoE layers, and
// adds the biases and the gate in the micro-batch's chain.
TEST(OffloadCostModel, SharedExpertsDenseLayersAndBiases) {
  ModelConfig c = preset_config("qwen2-57b-a14b", 3);
  c.dense_layers = {1};
  const double H = 3584, E = 64, shared = 20480, dense = 18944, qd = 3584, kvd = 512;
  const GpuMemoryUse m = gpu_memory_use(c, small_policy(), streamed());
  EXPECT_EQ(m.dense_mlps, size_t(2 * (3 * H * shared * 2 + H * 2) + 3 * H * dense * 2));
  const double V = 151936;
  EXPECT_EQ(m.router_norms_head,
            size_t(2 * E * H * 2 + 3 * 2 * H * 4 + H * 4 + V * H * 2 + 3 * (qd + 2 * kvd) * 4));

  const Policy p = small_policy();  // b_e 256
  const OffloadCostModel model(synthetic_gpu_profile(), c, p, streamed());
  const int T = 300;
  const StepShape step = decode_step(T, 3000);
  const TaskGraph g = model.step_graph(step);
  auto find = [&](const std::string& name) -> const Task* {
    for (const Task& t : g.tasks())
      if (t.name == name) return &t;
    return nullptr;
  };
  for (const char* name :
       {"layer0.dense_mlp", "layer1.dense_mlp", "layer2.dense_mlp", "layer0.mb0.shared_expert_gate",
        "layer0.mb0.qkv_bias", "layer1.mb0.qkv_bias", "layer0.mb0.router", "layer2.expert63.gpu"})
    EXPECT_NE(find(name), nullptr) << name;
  for (const char* name : {"layer1.mb0.router", "layer1.mb0.shared_expert_gate",
                           "layer1.mb0.routing_d2h", "layer1.expert0.gpu", "layer0.mb0.o_bias"})
    EXPECT_EQ(find(name), nullptr) << name;
  // 300 rows in GEMMs of at most the device's rows per GEMM (B + the prefill chunk, 128, here
  // below 1024): 128, 128 and 44, 6·T·I·H FLOPs, the three matrices read once per GEMM.
  ASSERT_EQ(p.device_expert_rows(), 128);
  EXPECT_DOUBLE_EQ(find("layer0.dense_mlp")->flops, 6.0 * T * shared * H);
  EXPECT_DOUBLE_EQ(find("layer1.dense_mlp")->flops, 6.0 * T * dense * H);
  EXPECT_DOUBLE_EQ(find("layer1.dense_mlp")->bytes, 3 * 3.0 * dense * H * 2);
  EXPECT_DOUBLE_EQ(find("layer0.mb0.shared_expert_gate")->flops, 2.0 * T * H);
  EXPECT_NEAR(model.step_seconds(step), pipeline_step_seconds(g), 1e-12 * pipeline_step_seconds(g));
}

// DeepSeek-V3's FP8 projections and experts: each GEMM first dequantises W into the bf16 tile,
// one more pass over W on the device (1 byte read, 2 written a weight); the router and lm_head
// stay bf16 GEMMs.
TEST(OffloadCostModel, Fp8ProjectionsPayTheirDequantisationPass) {
  const ModelConfig fp8 = preset_config("deepseek-v3", 4);
  ASSERT_TRUE(fp8.fp8_weights);
  ModelConfig bf16 = fp8;
  bf16.fp8_weights = false;
  const OffloadCostModel with(synthetic_gpu_profile(), fp8, small_policy(), streamed());
  const OffloadCostModel without(synthetic_gpu_profile(), bf16, small_policy(), streamed());
  const int64_t n = 1536, k = 7168;  // q_a_proj
  EXPECT_DOUBLE_EQ(with.gpu_weight_gemm_seconds(64, n, k) - with.gpu_gemm_seconds(64, n, k),
                   3.0 * n * k / 1e12 + kLaunchSeconds);
  EXPECT_DOUBLE_EQ(without.gpu_weight_gemm_seconds(64, n, k), without.gpu_gemm_seconds(64, n, k));

  const StepShape step = decode_step(64, 640, 64);
  const TaskGraph g_fp8 = with.step_graph(step), g_bf16 = without.step_graph(step);
  auto task = [](const TaskGraph& g, const std::string& name) {
    for (const Task& t : g.tasks())
      if (t.name == name) return t;
    ADD_FAILURE() << "no task " << name;
    return Task{};
  };
  for (const char* name : {"layer0.mb0.q_a_proj", "layer0.mb0.kv_a_proj", "layer0.mb0.o_proj"}) {
    const Task a = task(g_fp8, name), b = task(g_bf16, name);
    EXPECT_GT(a.seconds, b.seconds) << name;
    EXPECT_DOUBLE_EQ(a.flops, b.flops) << name;
  }
  EXPECT_DOUBLE_EQ(task(g_fp8, "layer3.mb0.router").seconds,
                   task(g_bf16, "layer3.mb0.router").seconds);
  EXPECT_GT(with.gpu_expert_seconds(64), without.gpu_expert_seconds(64));
}

// DBRX: the clamp of q/k/v is one more pass over them; no dense MLP.
TEST(OffloadCostModel, DbrxClipIsAPassOverQkv) {
  const ModelConfig c = preset_config("dbrx", 2);
  const OffloadCostModel model(synthetic_gpu_profile(), c, small_policy(), streamed());
  const TaskGraph g = model.step_graph(decode_step(64, 640));
  double clip_bytes = -1;
  for (const Task& t : g.tasks()) {
    EXPECT_EQ(t.name.find("dense_mlp"), std::string::npos) << t.name;
    if (t.name == "layer1.mb0.clip_qkv") clip_bytes = t.bytes;
  }
  EXPECT_DOUBLE_EQ(clip_bytes, 64.0 * (6144 + 2 * 1024) * 8);
  EXPECT_EQ(gpu_memory_use(c, small_policy(), streamed()).dense_mlps, 0u);
}

// The KV blocks split between the pools: the host holds the rest of the GPU share's.
TEST(OffloadCostModel, HostHoldsTheCpuShareOfTheKvCache) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  Policy p = small_policy();
  p.kv_block_size = 16;
  p.kv_blocks = 64;
  const size_t block = 16 * 4 * 2 * 1024 * 2;  // 16 tokens × 4 layers × K|V × kv_dim × bf16
  OffloadPlan o = streamed(3);
  o.cpu_attention_share = 0.25;
  EXPECT_EQ(host_kv_blocks(64, 0.25), 16);
  EXPECT_EQ(host_memory_use(c, p, o).kv_cache, 16 * block);
  EXPECT_EQ(host_kv_blocks(10, 0.3), 3);
  EXPECT_EQ(host_kv_blocks(10, 1.0), 10);
  EXPECT_EQ(host_kv_blocks(10, 0.0), 0);
  // Without the GPU pipeline the host holds every block.
  EXPECT_EQ(host_memory_use(c, p, OffloadPlan{}).kv_cache, 64 * block);
  EXPECT_EQ(host_memory_use(c, p).kv_cache, 64 * block);
}

// With the experts on disk a streamed layer's reads gate its copies: on a slow disk, the reads
// of both layers run back to back on the critical path, the second layer's first copy starts
// only once its reads are done, and the planner names the disk. A resident layer reads nothing
// during the step (its experts were read at start-up).
TEST(OffloadCostModel, DiskReadsGateTheStreamedLayersCopies) {
  const ModelConfig c = preset_config("mixtral-8x7b", 2);
  HardwareProfile hw = synthetic_gpu_profile();
  hw.disk_bytes_per_s = 1e8;
  Policy p = small_policy();
  p.pool_experts = 4;
  const OffloadCostModel m(hw, c, p, streamed());
  const StepShape step = decode_step(4, 400);
  const TaskGraph g = m.step_graph(step);
  const Task reads = *CpuCostModel(hw, c, p).disk_read_task(4);
  ASSERT_GT(reads.bytes, 0);
  const std::vector<double> finish = g.finish_times();
  auto finish_of = [&](const std::string& name) {
    for (size_t i = 0; i < g.tasks().size(); ++i)
      if (g.tasks()[i].name == name) return finish[i];
    ADD_FAILURE() << "no task " << name;
    return 0.0;
  };
  int disk_tasks = 0;
  for (const Task& t : g.tasks())
    if (t.resource == Resource::kDisk) {
      ++disk_tasks;
      EXPECT_DOUBLE_EQ(t.bytes, reads.bytes) << t.name;
    }
  EXPECT_EQ(disk_tasks, 2);
  EXPECT_DOUBLE_EQ(finish_of("layer1.expert_reads"), 2 * reads.seconds);
  EXPECT_GE(finish_of("layer1.expert0.pages_h2d"), 2 * reads.seconds);
  EXPECT_GT(g.critical_path_seconds(), 2 * reads.seconds);
  EXPECT_NEAR(m.step_seconds(step), pipeline_step_seconds(g), 1e-12 * m.step_seconds(step));
  const std::vector<PhaseBottleneck> why =
      explain(m, std::vector<WorkloadRequest>(4, WorkloadRequest{8, 4}));
  ASSERT_EQ(why.size(), 2u);
  EXPECT_EQ(why[1].resource, Resource::kDisk);
  EXPECT_NE(why[1].sentence().find("decode is bound by the disk's O_DIRECT read bandwidth in "
                                   "expert reads from disk"),
            std::string::npos)
      << why[1].sentence();

  OffloadPlan resident = streamed();
  resident.resident_expert_layers = 2;
  const TaskGraph all_resident = OffloadCostModel(hw, c, p, resident).step_graph(step);
  for (const Task& t : all_resident.tasks()) EXPECT_NE(t.resource, Resource::kDisk) << t.name;
}

// The device's expert cache keeps a fixed part of the streamed experts: a chosen expert is kept
// with the probability of that part, and is then neither copied nor read from disk.
TEST(OffloadCostModel, TheDeviceCacheSavesItsShareOfCopiesAndDiskReads) {
  const ModelConfig c = preset_config("mixtral-8x7b", 2);  // 2 streamed layers of 8 experts
  HardwareProfile hw = synthetic_gpu_profile();
  hw.disk_bytes_per_s = 1e8;
  Policy p = small_policy();
  p.pool_experts = 4;
  const StepShape step = decode_step(4, 400);
  OffloadPlan cached = streamed();
  cached.cache_pages = 3 * 4 + 2;  // 4 whole experts of 16 (and 2 pages that hold no expert)
  const OffloadCostModel without(hw, c, p, streamed()), with(hw, c, p, cached);
  EXPECT_EQ(without.device_cache_hit(), 0);
  EXPECT_DOUBLE_EQ(with.device_cache_hit(), 0.25);
  auto bytes_on = [&](const OffloadCostModel& m, Resource r) {
    double bytes = 0;
    const TaskGraph g = m.step_graph(step);
    for (const Task& t : g.tasks())
      if (t.resource == r && (r != Resource::kHostToDevice || t.name.ends_with("pages_h2d")))
        bytes += t.bytes;
    return bytes;
  };
  const double copied = bytes_on(without, Resource::kHostToDevice);
  ASSERT_GT(copied, 0);
  EXPECT_NEAR(bytes_on(with, Resource::kHostToDevice), 0.75 * copied, 1e-9 * copied);
  // The pool's own share of hits adds to the device's.
  const CpuCostModel cpu(hw, c, p);
  const double E = c.num_experts, k = c.experts_per_token;
  const double used = E * (1 - std::pow(1 - k / E, 4.0));
  const double pool_hit = std::max(0.0, p.pool_experts - 2 * used) / (2 * E);
  const double file_bytes = used * double(expert_file_bytes(c));
  EXPECT_NEAR(cpu.disk_read_task(4)->bytes, file_bytes * (1 - pool_hit), 1e-6 * file_bytes);
  EXPECT_NEAR(bytes_on(with, Resource::kDisk), 2 * file_bytes * (1 - pool_hit - 0.25),
              1e-6 * file_bytes);
  EXPECT_LT(with.step_seconds(step), without.step_seconds(step));
}

// The planner sizes the device's cache as the executor does: what the budget leaves beyond the
// margin, none when asked for none (as on the stand-in), the pages asked for when fixed.
TEST(OffloadPlanner, SizesTheDeviceCacheFromWhatTheBudgetLeaves) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  const HardwareProfile hw = synthetic_gpu_profile(1e10);
  const auto work = uniform_workload(4, 64, 16);
  const MemoryLimits limits{size_t(256) << 30, size_t(24) << 30};
  OffloadConstraints fixed;
  fixed.resident_expert_layers = 0;
  const Plan plan = plan_policy(hw, c, Policy{}, work, limits, fixed);
  ASSERT_TRUE(plan.offload.gpu);
  const size_t budget = size_t(24) << 30, used = plan.chosen.gpu_memory.total();
  const size_t left = budget - used - std::max(size_t(256) << 20, budget / 10);
  // At most the streamed pages (4 layers of 8 experts of 3 pages) beyond the prefetch window.
  const int beyond_window = 4 * 8 * 3 - 3 * plan.offload.prefetch_depth;
  EXPECT_EQ(plan.offload.cache_pages,
            std::min(beyond_window, int(left / plan.offload.page_bytes)));
  EXPECT_GT(plan.offload.cache_pages, 0);
  fixed.cache_pages = 0;
  const Plan none = plan_policy(hw, c, Policy{}, work, limits, fixed);
  EXPECT_EQ(none.offload.cache_pages, 0);
  EXPECT_GE(plan.chosen.prediction.decode_tokens_per_s(),
            none.chosen.prediction.decode_tokens_per_s());
  fixed.cache_pages = 5;
  EXPECT_EQ(plan_policy(hw, c, Policy{}, work, limits, fixed).offload.cache_pages, 5);
}

TEST(OffloadPlanner, PrefersMoreResidentLayersWhenMemoryAllows) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  const HardwareProfile hw = synthetic_gpu_profile(1e10);
  const auto work = uniform_workload(32, 64, 16);
  const Plan big = plan_policy(hw, c, Policy{}, work, {size_t(256) << 30, size_t(64) << 30});
  const Plan small = plan_policy(hw, c, Policy{}, work, {size_t(256) << 30, size_t(8) << 30});
  ASSERT_TRUE(big.offload.gpu);
  EXPECT_EQ(big.offload.resident_expert_layers, 4);  // 4 × 2.6 GiB of experts fit in 64 GiB
  EXPECT_LT(small.offload.resident_expert_layers, big.offload.resident_expert_layers);
  EXPECT_LE(small.chosen.gpu_memory.total(), size_t(8) << 30);
  EXPECT_LE(big.chosen.gpu_memory.total(), size_t(64) << 30);
  EXPECT_GT(big.chosen.prediction.total_tokens_per_s(),
            small.chosen.prediction.total_tokens_per_s());
  EXPECT_EQ(big.offload.cpu_attention_share, big.chosen.offload.cpu_attention_share);
}

// The weights larger than host memory, with a GPU: the planner plans the GPU pipeline with the
// experts on disk, gives the pool what the rest leaves of host memory, and stays within it.
TEST(OffloadPlanner, PlansTheGpuPipelineWithTheExpertsOnDisk) {
  const ModelConfig c = preset_config("mixtral-8x7b", 4);
  HardwareProfile hw = synthetic_gpu_profile(1e10);
  hw.disk_bytes_per_s = 2e9;
  const size_t host = model_weight_bytes(c) / 2;
  ASSERT_TRUE(experts_stay_on_disk(c, host));
  const MemoryLimits limits{host, size_t(16) << 30, true};
  const Plan plan = plan_policy(hw, c, Policy{}, uniform_workload(32, 64, 16), limits);
  ASSERT_TRUE(plan.offload.gpu);
  EXPECT_GE(plan.chosen.policy.pool_experts, kMinPoolExperts);
  EXPECT_LE(plan.chosen.memory.total(), host);
  EXPECT_LE(plan.chosen.gpu_memory.total(), size_t(16) << 30);
  // The pool took what the rest left: one more expert would not fit.
  Policy more = plan.chosen.policy;
  ++more.pool_experts;
  EXPECT_GT(host_memory_use(c, more, plan.offload).total(), host);
}

TEST(OffloadPlanner, TooLittleGpuMemoryNamesTheMinimum) {
  const ModelConfig c = preset_config("mixtral-8x7b", 32);
  const HardwareProfile hw = synthetic_gpu_profile();
  const auto work = uniform_workload(8, 64, 8);
  // The minimum: ω = 1 (no KV on the GPU), no resident experts, two experts' pages of one
  // matrix each, the smallest step (B = 1, chunk 16).
  Policy least;
  least.batch = 1, least.attn_micro_batch = 16, least.expert_batch = 16, least.prefill_chunk = 16;
  least.kv_blocks = (64 + 8 + 15) / 16;
  const size_t need = gpu_memory_use(c, least, streamed(2)).total();
  try {
    plan_policy(hw, c, Policy{}, work, {size_t(256) << 30, size_t(1) << 30});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("needs at least " + human_bytes(double(need)) + " GPU memory"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("2 experts' page slots"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got 1.00 GiB"), std::string::npos) << msg;
  }
  // Just enough plans.
  EXPECT_NO_THROW(plan_policy(hw, c, Policy{}, work, {size_t(256) << 30, need}));
  // No GPU in the profile: a clear error, not a CPU plan.
  HardwareProfile cpu_only = hw;
  cpu_only.gpu.reset();
  EXPECT_THROW(
      {
        try {
          plan_policy(cpu_only, c, Policy{}, work, {size_t(256) << 30, size_t(24) << 30});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("has no GPU section"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

TEST(OffloadPlanner, GpuProfileJsonRoundTrip) {
  const HardwareProfile p = synthetic_gpu_profile();
  const HardwareProfile q = profile_from_json(to_json(p), "gpu.json");
  ASSERT_TRUE(q.gpu);
  EXPECT_EQ(q.gpu->name, "synthetic GPU");
  EXPECT_DOUBLE_EQ(q.gpu->memory_bytes_per_s, 1e12);
  EXPECT_DOUBLE_EQ(q.gpu->h2d_pinned_bytes_per_s, 2e10);
  EXPECT_DOUBLE_EQ(q.gpu->gemm_seconds(100, 4096, 4096), p.gpu->gemm_seconds(100, 4096, 4096));
  EXPECT_DOUBLE_EQ(q.gpu->gemm_peak_flops(), 1e14);
}

}  // namespace
}  // namespace sluice
