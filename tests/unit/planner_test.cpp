// The planner: task-graph critical paths, the cost model's bytes and FLOPs against hand
// arithmetic, the scheduler replay against the real Scheduler, profile JSON, and the search.
#include "runtime/planner/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels_revision.h"
#include "model/presets.h"
#include "runtime/kv_cache.h"
#include "runtime/planner/cost_model.h"
#include "runtime/planner/profiler.h"
#include "runtime/planner/roofline_svg.h"
#include "runtime/planner/workload_file.h"
#include "runtime/planner/workload_sim.h"
#include "runtime/scheduler.h"
#include "test_util.h"

namespace sluice {
namespace {

Task task(const std::string& name, double seconds, std::vector<int> deps = {},
          Resource r = Resource::kCpu) {
  Task t;
  t.name = name;
  t.seconds = seconds;
  t.deps = std::move(deps);
  t.resource = r;
  return t;
}

TEST(TaskGraph, CriticalPathOfParallelResources) {
  // load(2) ─┬─ gpu_gemm(3) ──┬─ combine(1)
  //          └─ h2d_copy(5) ──┘      and an independent cpu_attention(4) after load.
  TaskGraph g;
  const int load = g.add(task("load", 2));
  const int gemm = g.add(task("gpu_gemm", 3, {load}, Resource::kGpu));
  const int copy = g.add(task("h2d_copy", 5, {load}, Resource::kHostToDevice));
  g.add(task("cpu_attention", 4, {load}));
  const int combine = g.add(task("combine", 1, {gemm, copy}));
  EXPECT_DOUBLE_EQ(g.critical_path_seconds(), 2 + 5 + 1);
  EXPECT_EQ(g.critical_path(), (std::vector<int>{load, copy, combine}));
  const std::vector<double> finish = g.finish_times();
  EXPECT_DOUBLE_EQ(finish[size_t(gemm)], 5);
  EXPECT_DOUBLE_EQ(finish[3], 6);
}

TEST(TaskGraph, ChainIsTheSumAndBadEdgesFail) {
  TaskGraph g;
  for (double s : {1.0, 2.5, 0.5}) g.chain(task("t", s));
  EXPECT_DOUBLE_EQ(g.critical_path_seconds(), 4.0);
  EXPECT_THROW(g.add(task("late", 1, {7})), Error);
  EXPECT_THROW(g.add(task("negative", -1)), Error);
}

// A profile whose numbers make hand arithmetic easy: 1e10 B/s, 1e12 FLOP/s, and GEMM curves
// that follow the roofline exactly.
HardwareProfile round_profile() {
  HardwareProfile p = quick_profile(1e10, 1e12);
  p.attention_bytes_per_s = 5e9;
  p.attention_flops = 1e11;
  p.elementwise_bytes_per_s = 2e10;
  return p;
}

TEST(HardwareProfile, CurveInterpolatesAndExtrapolatesProportionally) {
  GemmCurve c{"x", "bf16", 100, 100, {{1, 1.0}, {3, 2.0}, {5, 6.0}}};
  EXPECT_DOUBLE_EQ(c.seconds_at(0.5), 1.0);
  EXPECT_DOUBLE_EQ(c.seconds_at(2), 1.5);
  EXPECT_DOUBLE_EQ(c.seconds_at(4), 4.0);
  EXPECT_DOUBLE_EQ(c.seconds_at(10), 12.0);
  HardwareProfile p;
  p.cpu_gemm = {c, GemmCurve{"big", "bf16", 1000, 1000, {{1, 50.0}}}};
  // 200×100 is nearer to 100×100 than to 1000×1000: the small curve, times 2.
  EXPECT_DOUBLE_EQ(p.gemm_seconds(int64_t(2), 200, 100, "bf16"), 3.0);
  EXPECT_THROW(p.gemm_seconds(int64_t(2), 200, 100, "f32"), Error);
}

TEST(HardwareProfile, JsonRoundTripAndNamedErrors) {
  HardwareProfile p = round_profile();
  p.disk_bytes_per_s = 1.5e9;
  p.quant_gemm.points = {{16, 1.9, 3.2}, {128, 1.3, 2.1}};
  const nlohmann::json j = to_json(p);
  EXPECT_TRUE(j["gpu"].is_null());
  const HardwareProfile q = profile_from_json(j, "p.json");
  EXPECT_DOUBLE_EQ(q.disk_bytes_per_s, 1.5e9);
  ASSERT_EQ(q.quant_gemm.points.size(), 2u);
  EXPECT_EQ(q.quant_gemm.points[0].m, 16);
  EXPECT_DOUBLE_EQ(q.quant_gemm.points[0].int8, 1.9);
  EXPECT_DOUBLE_EQ(q.quant_gemm.points[0].int4, 3.2);
  EXPECT_EQ(q.quant_gemm.points[1].m, 128);
  EXPECT_DOUBLE_EQ(q.quant_gemm.points[1].int8, 1.3);
  EXPECT_DOUBLE_EQ(q.quant_gemm.points[1].int4, 2.1);
  ASSERT_EQ(q.cpu_gemm.size(), p.cpu_gemm.size());
  EXPECT_DOUBLE_EQ(q.gemm_seconds(int64_t(64), 4096, 4096, "bf16"),
                   p.gemm_seconds(int64_t(64), 4096, 4096, "bf16"));
  nlohmann::json broken = j;
  broken.erase("dram_bytes_per_s");
  try {
    profile_from_json(broken, "p.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("p.json: field 'dram_bytes_per_s'"), std::string::npos)
        << e.what();
  }
  for (const char* bad : {R"([{"m": 128, "int8": 1.3, "int4": 2.1}, {"m": 16, "int8": 1.9,
                              "int4": 3.2}])",
                          R"([{"m": 16, "int8": 1.9}])", R"({"int8": 1.3})"}) {
    nlohmann::json unordered = j;
    unordered["quant_gemm_speedups"] = nlohmann::json::parse(bad);
    try {
      profile_from_json(unordered, "p.json");
      FAIL() << "expected an error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("p.json: field 'quant_gemm_speedups'"),
                std::string::npos)
          << e.what();
    }
  }
}

// The quick profile follows the roofline except where GEMMs measured at small m were slower:
// their times, scaled by weight size, and never falling as m grows.
TEST(HardwareProfile, QuickProfileKeepsTheSlowerSmallMSamples) {
  const double w = 2.0 * 14336 * 4096;  // expert weight bytes: 11.7 ms at 1e10 B/s
  const GemmCurve samples{
      "expert", "bf16", 14336, 4096, {{1, 2 * w / 1e10}, {4, 2 * w / 1e10}, {16, 0.5 * w / 1e10}}};
  const HardwareProfile p = quick_profile(1e10, 1e12, 0, samples);  // ridge at m = 100
  const GemmCurve& expert = p.curve_for(14336, 4096, "bf16");
  EXPECT_DOUBLE_EQ(expert.seconds_at(1), 2 * w / 1e10);  // the sample: slower than the roofline
  EXPECT_DOUBLE_EQ(expert.seconds_at(4), 2 * w / 1e10);
  // At 16 the sample is faster than the roofline, and the roofline than m = 4: m = 4's time.
  EXPECT_DOUBLE_EQ(expert.seconds_at(16), 2 * w / 1e10);
  EXPECT_DOUBLE_EQ(expert.seconds_at(4096), 2.0 * 4096 * 14336 * 4096 / 1e12);  // compute bound
  // Another weight shape: the samples scaled by its weight size.
  const GemmCurve& attention = p.curve_for(4096, 4096, "bf16");
  EXPECT_DOUBLE_EQ(attention.seconds_at(1), 2 * w / 1e10 * (4096.0 / 14336.0));
  EXPECT_DOUBLE_EQ(p.curve_for(14336, 4096, "f32").seconds_at(1), 2 * w / 1e10);
  // Without samples, the plain roofline.
  EXPECT_DOUBLE_EQ(quick_profile(1e10, 1e12).curve_for(14336, 4096, "bf16").seconds_at(1),
                   w / 1e10);
}

// The ISA level, the CPU model and the instruction ceilings survive the JSON round trip; a
// profile written before they existed still loads, and its compute ceiling is the GEMM peak.
TEST(HardwareProfile, InstructionCeilingsRoundTripAndOlderProfilesLoad) {
  HardwareProfile p = round_profile();
  p.cpu_model = "AMD EPYC 7B13";
  p.isa_level = "avx2";
  p.instructions = {.fp32_fma_flops = 1.9e11,
                    .bf16_flops = 1.9e11,
                    .int8_ops = 3.9e11,
                    .fp32_instruction = "avx2 vfmadd231ps ymm",
                    .bf16_instruction = "avx2 vfmadd231ps ymm",
                    .int8_instruction = "avx2 vpmaddubsw+vpmaddwd+vpaddd ymm"};
  const nlohmann::json j = to_json(p);
  const HardwareProfile q = profile_from_json(j, "p.json");
  EXPECT_EQ(q.cpu_model, "AMD EPYC 7B13");
  EXPECT_EQ(q.isa_level, "avx2");
  EXPECT_DOUBLE_EQ(q.instructions.fp32_fma_flops, 1.9e11);
  EXPECT_DOUBLE_EQ(q.instructions.bf16_flops, 1.9e11);
  EXPECT_DOUBLE_EQ(q.instructions.int8_ops, 3.9e11);
  EXPECT_EQ(q.instructions.int8_instruction, "avx2 vpmaddubsw+vpmaddwd+vpaddd ymm");
  EXPECT_DOUBLE_EQ(q.compute_ceiling_flops("bf16"), 1.9e11);
  EXPECT_DOUBLE_EQ(q.compute_ceiling_flops("f32"), 1.9e11);

  nlohmann::json older = j;
  older.erase("isa_level");
  older.erase("instruction_ceilings");
  const HardwareProfile o = profile_from_json(older, "old.json");
  EXPECT_EQ(o.isa_level, "");
  EXPECT_FALSE(o.instructions.measured());
  EXPECT_DOUBLE_EQ(o.compute_ceiling_flops("bf16"), o.gemm_peak_flops);

  nlohmann::json broken = j;
  broken["instruction_ceilings"].erase("int8_ops");
  try {
    profile_from_json(broken, "p.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("p.json: field 'instruction_ceilings'"), std::string::npos)
        << e.what();
  }
}

// Instruction peaks of a made-up machine: fp32 FMA and bf16 at `bf16`, int8 at `int8`.
InstructionCeilings made_up_peaks(double bf16, double int8) {
  return {.fp32_fma_flops = bf16,
          .bf16_flops = bf16,
          .int8_ops = int8,
          .fp32_instruction = "f",
          .bf16_instruction = "b",
          .int8_instruction = "i"};
}

// The bound a GEMM is called by is the machine's: a GEMM over sluice's own GEMM peak in
// FLOPs but under the instruction peak reads its weights longer than the machine computes.
TEST(CostModel, BoundWordsUseTheInstructionCeilingNotTheGemmPeak) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  Policy p;
  p.expert_batch = 1024;
  HardwareProfile hw = round_profile();  // 1e10 B/s, GEMM peak 1e12: ridge at m = 100
  const Task by_gemm_peak = CpuCostModel(hw, c, p).gemm_task("q", "g", 400, 4096, 4096);
  EXPECT_EQ(by_gemm_peak.bound, Bound::kCompute);
  hw.instructions = made_up_peaks(1e13, 2e13);  // ridge at m = 1000
  const Task by_ceiling = CpuCostModel(hw, c, p).gemm_task("q", "g", 400, 4096, 4096);
  EXPECT_EQ(by_ceiling.bound, Bound::kMemory);
  // The time is still sluice's: its curve, never under its own peak.
  EXPECT_DOUBLE_EQ(by_ceiling.seconds, by_gemm_peak.seconds);
}

// With int8 experts, an expert GEMM reads the int8 values and scales, and runs at the bf16 time
// scaled by the int8 : bf16 instruction peak ratio (2 here): half the time where compute binds,
// the int8 bytes' time where memory does. The attention projections stay bf16.
TEST(CostModel, Int8ExpertGemmsReadTheirBytesAtTheInt8Peak) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  Policy p;
  p.expert_batch = 1024;
  HardwareProfile hw = round_profile();  // DRAM 1e10 B/s, GEMM peak 1e12
  hw.instructions = made_up_peaks(1e12, 2e12);
  const int64_t I = c.expert_intermediate_size, H = c.hidden_size;
  const double overhead = hw.call_overhead_seconds;
  ModelConfig q = c;
  q.expert_quant = {ExpertDtype::kInt8, 128};
  const CpuCostModel bf16_model(hw, c, p), int8_model(hw, q, p);

  const Task bf16 = bf16_model.mlp_gemm_task("e", "g", 400, I, H);
  const Task int8 = int8_model.mlp_gemm_task("e", "g", 400, I, H);
  EXPECT_EQ(int8.flops, bf16.flops);
  EXPECT_DOUBLE_EQ(int8.bytes, double(cpu::quant_bytes(cpu::QuantFormat::kInt8, I, H, 128)) +
                                   4.0 * 400 * double(H) + 4.0 * 400 * double(I));
  EXPECT_EQ(int8.bound, Bound::kCompute);
  EXPECT_NEAR(int8.seconds - overhead, (bf16.seconds - overhead) / 2, 1e-12);

  const Task one_row = int8_model.mlp_gemm_task("e", "g", 1, I, H);
  EXPECT_EQ(one_row.bound, Bound::kMemory);
  EXPECT_NEAR(one_row.seconds - overhead, one_row.bytes / hw.dram_bytes_per_s, 1e-12);

  EXPECT_DOUBLE_EQ(int8_model.gemm_task("q", "g", 400, 4096, H).seconds,
                   bf16_model.gemm_task("q", "g", 400, 4096, H).seconds);

  // Where the profile measured the quantized GEMMs, their speedups replace the peaks' ratio.
  hw.quant_gemm.points = {{128, 1.25, 1.6}};
  ModelConfig q4 = c;
  q4.expert_quant = {ExpertDtype::kInt4, 128};
  const Task measured8 = CpuCostModel(hw, q, p).mlp_gemm_task("e", "g", 400, I, H);
  const Task measured4 = CpuCostModel(hw, q4, p).mlp_gemm_task("e", "g", 400, I, H);
  EXPECT_NEAR(measured8.seconds - overhead, (bf16.seconds - overhead) / 1.25, 1e-12);
  EXPECT_NEAR(measured4.seconds - overhead, (bf16.seconds - overhead) / 1.6, 1e-12);

  // With points at m = 16 and 128: the first below 16, the last above 128, and between them in
  // log m (m = 45.25 lies halfway).
  hw.quant_gemm.points = {{16, 2.0, 3.0}, {128, 1.25, 1.6}};
  const CpuCostModel per_m(hw, q, p);
  auto int8_at = [&](double m) { return per_m.mlp_gemm_task("e", "g", m, I, H).seconds; };
  auto bf16_at = [&](double m) { return bf16_model.mlp_gemm_task("e", "g", m, I, H).seconds; };
  EXPECT_NEAR(int8_at(400) - overhead, (bf16_at(400) - overhead) / 1.25, 1e-12);
  EXPECT_DOUBLE_EQ(hw.quant_gemm.at(false, 16), 2.0);
  EXPECT_DOUBLE_EQ(hw.quant_gemm.at(false, 8), 2.0);
  EXPECT_DOUBLE_EQ(hw.quant_gemm.at(true, 4), 3.0);
  EXPECT_DOUBLE_EQ(hw.quant_gemm.at(true, 128), 1.6);
  EXPECT_NEAR(hw.quant_gemm.at(false, std::sqrt(16.0 * 128.0)), 1.625, 1e-12);
  const Task decode = per_m.mlp_gemm_task("e", "g", 16, I, H);
  EXPECT_NEAR(decode.seconds - overhead,
              std::max({hw.gemm_seconds(16.0, I, H, "bf16") / 2.0,
                        decode.flops / (hw.gemm_peak_flops * 2.0),
                        decode.bytes / hw.dram_bytes_per_s}),
              1e-12);
}

// SLUICE_ISA=avx2 on an AVX-512 machine never reads the avx512 profile: the path names the level.
TEST(ProfileCache, PathNamesTheIsaLevel) {
  for (cpu::IsaLevel level : cpu::isa_levels_up_to_current()) {
    cpu::ScopedIsaLevel at(level);
    const std::string name = profile_cache_path(this_machine(), 0).filename().string();
    EXPECT_EQ(name, "profile-" + this_machine().key() + "-" + cpu::isa_name(level) + ".json");
    const int threads = this_machine().cores + 1;  // not all cores: the name says how many
    EXPECT_EQ(profile_cache_path(this_machine(), threads).filename().string(),
              "profile-" + this_machine().key() + "-" + cpu::isa_name(level) + "-t" +
                  std::to_string(threads) + ".json");
  }
}

// A profile cached by a build whose kernels had another revision is not used (`bench` and
// `plan` would predict from the old kernels' speed); one of this build's is.
TEST(ProfileCache, AProfileOfOtherKernelsIsNotUsed) {
  testing::TempDir dir;
  const char* before = std::getenv("XDG_CACHE_HOME");
  const std::string saved = before ? before : "";
  setenv("XDG_CACHE_HOME", dir.path().c_str(), 1);
  HardwareProfile p;
  p.dram_bytes_per_s = 2e10, p.gemm_peak_flops = 3e11;
  for (int revision : {0, cpu::kKernelsRevision - 1, cpu::kKernelsRevision}) {
    p.kernels_revision = revision;
    std::ofstream(profile_cache_path(this_machine(), 0)) << to_json(p).dump();
    const std::optional<HardwareProfile> loaded = load_cached_profile(0);
    EXPECT_EQ(loaded.has_value(), revision == cpu::kKernelsRevision) << "revision " << revision;
    if (loaded) {
      EXPECT_EQ(loaded->dram_bytes_per_s, 2e10);
    }
  }
  if (before)
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
}

TEST(CostModel, OneLayerBytesAndFlopsByHand) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  Policy p;
  p.batch = 8, p.attn_micro_batch = 8, p.expert_batch = 1024, p.prefill_chunk = 8, p.kv_blocks = 64;
  const HardwareProfile hw = round_profile();
  const CpuCostModel m(hw, c, p);
  // One decode micro-batch of 8 sequences, each attending to 100 positions.
  StepShape step;
  step.micro_batches = {MicroBatchShape{8, 800, 800}};
  step.sampled = 8;
  const TaskGraph g = m.step_graph(step);
  auto find = [&](const std::string& name) -> const Task& {
    for (const Task& t : g.tasks())
      if (t.name == name) return t;
    throw std::runtime_error("no task " + name);
  };
  const double H = 4096, qd = 4096, kvd = 1024, I = 14336, n = 8;
  const Task& q = find("layer0.mb0.q_proj");
  EXPECT_DOUBLE_EQ(q.flops, 2 * n * qd * H);
  EXPECT_DOUBLE_EQ(q.bytes, 2 * qd * H + n * H * 2 + 4 * n * qd);
  EXPECT_EQ(q.bound, Bound::kMemory);  // 268 MFLOP / 1e12 < 33.7 MB / 1e10
  EXPECT_DOUBLE_EQ(q.seconds, std::max({hw.gemm_seconds(8.0, 4096, 4096, "bf16"), q.flops / 1e12,
                                        q.bytes / 1e10}));
  EXPECT_DOUBLE_EQ(find("layer0.mb0.k_proj").flops, 2 * n * kvd * H);
  // Attention: K and V of 800 positions, bf16, 8 KV heads × 128; 4 FLOPs per (row, key, element).
  const Task& a = find("layer0.mb0.attention");
  EXPECT_DOUBLE_EQ(a.bytes, 800 * kvd * 2 * 2);
  EXPECT_DOUBLE_EQ(a.flops, 4 * 800 * qd);
  EXPECT_DOUBLE_EQ(a.seconds, std::max(a.bytes / 5e9, a.flops / 1e11));
  // Router always in fp32: x is read as 4-byte floats.
  EXPECT_DOUBLE_EQ(find("layer0.mb0.router").bytes, 2 * 8 * H + n * H * 4 + 4 * n * 8);
  // Experts: 8 tokens × top-2 of 8 → Binomial(8, 1/4) tokens each; expected FLOPs are exact
  // (linear in m) and expected weight reads count only experts that got a token.
  const double p_idle = std::pow(0.75, 8);
  const Task& gate = find("layer0.expert3.gate");
  EXPECT_NEAR(gate.flops, 2 * (8 * 0.25) * I * H, 1e-6 * gate.flops);
  EXPECT_NEAR(gate.bytes, (1 - p_idle) * 2 * I * H + 2.0 * (H * 2 + 4 * I), 1e-6 * gate.bytes);
  double expert_flops = 0;
  for (const Task& t : g.tasks())
    if (t.group == "expert GEMMs") expert_flops += t.flops;
  EXPECT_NEAR(expert_flops, n * 2 * 6 * I * H, 1e-6 * expert_flops);  // k=2 experts, 3 GEMMs
  const Task& head = find("lm_head");
  EXPECT_DOUBLE_EQ(head.flops, 2 * n * 32000 * H);
}

TEST(CostModel, OneDecodeTokenReadsTwoExpertsNotEightQuarters) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  Policy p;
  p.expert_batch = 64;
  const CpuCostModel m(round_profile(), c, p);
  double weight_bytes = 0;
  for (int e = 0; e < c.num_experts; ++e)
    for (const Task& t : m.expert_tasks(e, 1))
      if (t.group == "expert GEMMs") weight_bytes += t.bytes;
  const double one_expert = 3.0 * 2 * 14336 * 4096;
  EXPECT_NEAR(weight_bytes, 2 * one_expert, 0.001 * one_expert);
  // Chunking by b_e: 200 tokens in GEMMs of at most 64 rows cost as 64+64+64+8.
  const auto dist = m.tokens_per_expert_distribution(800);
  double total = 0, mean = 0;
  for (auto [k, pk] : dist) total += pk, mean += k * pk;
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_NEAR(mean, 200.0, 1e-6);
}

TEST(CostModel, StepSecondsEqualsCriticalPathOfTheGraph) {
  ModelConfig c = preset_config("mixtral-8x7b", 2);
  Policy p;
  p.expert_batch = 128;
  const CpuCostModel m(round_profile(), c, p);
  StepShape s;
  s.micro_batches = {{100, 900, 5000}, {37, 3000, 3000}};
  s.sampled = 40;
  EXPECT_NEAR(m.step_seconds(s), m.step_graph(s).critical_path_seconds(), 1e-9 * m.step_seconds(s));
}

// The replay's step shapes are the real Scheduler's plans over a KV cache with storage: same
// token counts, micro-batches and sampled rows, step by step (the storage-less cache must admit
// and release exactly as the real one does).
TEST(WorkloadSim, MatchesScheduler) {
  Policy p;
  p.batch = 5, p.attn_micro_batch = 12, p.prefill_chunk = 20, p.expert_batch = 16;
  p.kv_block_size = 4, p.kv_blocks = 30;
  const std::vector<std::pair<int, int>> lengths = {{9, 3},  {17, 5}, {3, 8},  {25, 2}, {6, 6},
                                                    {11, 1}, {2, 9},  {30, 4}, {5, 5}};
  const int max_positions = 40;
  std::vector<WorkloadRequest> work;
  for (auto [prompt, gen] : lengths) work.push_back({prompt, gen});
  struct Summary {
    int prefill, decode, sampled;
    std::vector<int> micro_batches;
    bool operator==(const Summary&) const = default;
  };
  std::vector<Summary> simulated;
  replay_schedule(p, max_positions, 0, work, [&](const StepShape& s) {
    Summary sum{s.prefill_tokens, s.decode_tokens, s.sampled, {}};
    for (const auto& mb : s.micro_batches) sum.micro_batches.push_back(mb.tokens);
    std::sort(sum.micro_batches.begin(), sum.micro_batches.end());
    simulated.push_back(sum);
  });

  KvCacheConfig kc;
  kc.n_layers = 1, kc.kv_heads = 1, kc.head_dim = 8, kc.block_size = 4, kc.total_blocks = 30;
  PagedKvCache kv(kc);
  Scheduler sched(p, kv, max_positions);
  for (size_t i = 0; i < lengths.size(); ++i) {
    Request r;
    r.id = int64_t(i);
    r.prompt.assign(size_t(lengths[i].first), 5);
    r.max_new_tokens = lengths[i].second;
    r.ignore_eos = true;
    sched.submit(std::move(r));
  }
  std::vector<Summary> real;
  while (!sched.done()) {
    StepPlan plan = sched.plan_step();
    Summary sum{plan.prefill_tokens, plan.decode_tokens, 0, {}};
    int begin = 0;
    for (int end : plan.micro_batch_end) {
      int tokens = 0;
      for (int i = begin; i < end; ++i) tokens += plan.items[size_t(i)].count;
      sum.micro_batches.push_back(tokens);
      begin = end;
    }
    for (const StepItem& it : plan.items) sum.sampled += it.sample ? 1 : 0;
    std::sort(sum.micro_batches.begin(), sum.micro_batches.end());
    real.push_back(sum);
    sched.complete_step(plan, std::vector<int>(size_t(sum.sampled), 6));
  }
  ASSERT_EQ(simulated.size(), real.size());
  for (size_t i = 0; i < real.size(); ++i) EXPECT_TRUE(simulated[i] == real[i]) << "step " << i;
}

TEST(WorkloadSim, PredictionSplitsTimeLikeTheEngine) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  Policy p;
  p.batch = 4, p.attn_micro_batch = 64, p.prefill_chunk = 64, p.expert_batch = 256,
  p.kv_blocks = 64;
  const CpuCostModel m(round_profile(), c, p);
  const Prediction pr = predict_workload(m, uniform_workload(4, 32, 5));
  EXPECT_EQ(pr.prefill_tokens, 4 * 32);
  EXPECT_EQ(pr.decode_tokens, 4 * 4);  // the first token of each comes from its last prefill row
  EXPECT_EQ(pr.generated_tokens, 4 * 5);
  EXPECT_NEAR(pr.prefill_seconds + pr.decode_seconds, pr.total_seconds, 1e-12);
  EXPECT_EQ(pr.steps, 2 + 4);  // 128 prompt tokens in chunks of 64, then 4 decode steps
}

TEST(Planner, TooLittleMemorySaysWhatWouldFit) {
  ModelConfig c = preset_config("mixtral-8x7b", 4);
  try {
    plan_policy(round_profile(), c, Policy{}, uniform_workload(8, 128, 16),
                MemoryLimits{size_t(8) << 30, 0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("needs at least 11.3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got 8.00 GiB"), std::string::npos) << msg;
  }
}

TEST(Planner, WeightBoundMachinePrefersTheLargestBatchAndKeepsUserFields) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  // Slow memory, fast compute: every weight read must be shared by as many tokens as possible.
  const HardwareProfile hw = quick_profile(1e9, 1e13);
  const auto work = uniform_workload(64, 32, 32);
  Policy user;
  user.expert_batch = 512;
  const Plan plan = plan_policy(hw, c, user, work, MemoryLimits{size_t(64) << 30, 0});
  EXPECT_EQ(plan.chosen.policy.batch, 64);
  EXPECT_EQ(plan.chosen.policy.expert_batch, 512);
  for (const PlannedPolicy& r : plan.runners_up) {
    EXPECT_EQ(r.policy.expert_batch, 512);
    EXPECT_LE(r.prediction.total_tokens_per_s(), plan.chosen.prediction.total_tokens_per_s());
  }
  // Its decode bottleneck is reading expert weights from DRAM.
  ASSERT_EQ(plan.bottlenecks.size(), 2u);
  EXPECT_EQ(plan.bottlenecks[1].phase, "decode");
  EXPECT_EQ(plan.bottlenecks[1].group, "expert GEMMs");
  EXPECT_EQ(plan.bottlenecks[1].bound, Bound::kMemory);
  // A small host limit forces a smaller batch, never an over-budget one.
  const size_t tight = model_weight_bytes(c) + (size_t(40) << 20);
  const Plan small = plan_policy(hw, c, Policy{}, work, MemoryLimits{tight, 0});
  EXPECT_LE(small.chosen.memory.total(), tight);
}

TEST(Planner, RooflineSvgHasCeilingsAndPoints) {
  ModelConfig c = preset_config("mixtral-8x7b", 1);
  const HardwareProfile hw = round_profile();
  const Plan plan =
      plan_policy(hw, c, Policy{}, uniform_workload(16, 64, 8), MemoryLimits{size_t(64) << 30, 0});
  const CpuCostModel m(hw, c, plan.chosen.policy);
  const auto points = roofline_points(m, plan.bottlenecks);
  ASSERT_FALSE(points.empty());
  for (const RooflinePoint& pt : points) EXPECT_LE(pt.flops_per_s, 1e12 * (1 + 1e-9)) << pt.label;
  const std::string svg = roofline_svg(hw, points, "t");
  EXPECT_NE(svg.find("GEMM peak 1000 GFLOP/s"), std::string::npos);
  EXPECT_NE(svg.find("DRAM 10.0 GB/s"), std::string::npos);
  EXPECT_NE(svg.find("decode: expert GEMMs"), std::string::npos);
  // With instruction peaks, the roof is the machine's and sluice's GEMM peak is drawn below it.
  HardwareProfile machine = hw;
  machine.instructions = {.fp32_fma_flops = 1e13,
                          .bf16_flops = 1e13,
                          .int8_ops = 2e13,
                          .fp32_instruction = "avx2 vfmadd231ps ymm",
                          .bf16_instruction = "avx2 vfmadd231ps ymm",
                          .int8_instruction = "avx2 vpmaddubsw+vpmaddwd+vpaddd ymm"};
  const std::string roofs = roofline_svg(machine, points, "t");
  EXPECT_NE(roofs.find("bf16 ceiling 10000 GFLOP/s (avx2 vfmadd231ps ymm)"), std::string::npos);
  EXPECT_NE(roofs.find("sluice GEMM peak 1000 GFLOP/s"), std::string::npos);
}

TEST(WorkloadFile, JsonlAndTextEstimates) {
  const testing::TempDir tmp;
  const std::filesystem::path& dir = tmp.path();
  {
    std::ofstream j(dir / "in.jsonl");
    j << R"({"prompt": "12345678", "max_tokens": 7})"
      << "\n\n"
      << R"({"messages": [{"role": "user", "content": "abcd"}]})"
      << "\n";
    std::ofstream t(dir / "in.txt");
    t << "one two three four\n";
    std::ofstream bad(dir / "bad.jsonl");
    bad << R"({"text": "x"})"
        << "\n";
  }
  const auto w = workload_from_file(dir / "in.jsonl", 50);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].prompt_tokens, 2);
  EXPECT_EQ(w[0].new_tokens, 7);
  EXPECT_EQ(w[1].prompt_tokens, 5);  // (4 + 16 chars of template markup) / 4
  EXPECT_EQ(w[1].new_tokens, 50);
  EXPECT_EQ(workload_from_file(dir / "in.txt", 3)[0].prompt_tokens, 5);
  EXPECT_THROW(workload_from_file(dir / "bad.jsonl", 3), Error);
}

}  // namespace
}  // namespace sluice
