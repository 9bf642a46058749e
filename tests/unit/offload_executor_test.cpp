// The offload executor on the CPU stand-in device (HostMath) against the CPU engine: the same
// scheduler, KV cache and sampling, the layers run through the CGOPipe step pipeline with
// experts streamed through a small page pool, some experts on the CPU path, attention on the
// host (ω = 1) or shared with the device's KV pool (ω < 1). HostMath makes the same kernel calls at
// the same rounding points as the CPU engine, so the two agree to the last bit except where the
// order of additions differs.
#include "engine/offload_executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/offload_layout.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#include "runtime/planner/gpu_kv_blocks.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

using testing::relative_max_error;

constexpr int kNew = 24;
using testing::kPromptLengths;
using testing::prompt_of;

Policy test_policy(Precision precision) {
  return testing::exercising_policy(precision, kNew);
}

struct EngineRun {
  std::map<int64_t, Completion> done;
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;  // (request, position) -> row
  EngineStats stats;
  int mixed_steps = 0;      // steps with both prefill and decode tokens
  int64_t max_active = 0;   // most sequences running at once
  double max_kv_usage = 0;  // most of the KV blocks in use, as the progress reports it
};

// Runs the test's requests; `observe`: records every sampled row's logits (which makes them
// come back to the host whatever the device could pick there).
EngineRun run(BatchEngine& engine, const ModelConfig& c, bool observe = true) {
  EngineRun out;
  if (observe)
    engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
      out.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
    });
  int64_t prefill = 0, decode = 0;
  engine.set_step_observer([&](const EngineStats& s, const BatchEngine::Progress& progress) {
    out.mixed_steps += s.prefill_tokens > prefill && s.decode_tokens > decode;
    out.max_active = std::max(out.max_active, progress.active);
    out.max_kv_usage = std::max(out.max_kv_usage, progress.kv_usage);
    prefill = s.prefill_tokens, decode = s.decode_tokens;
  });
  std::vector<Request> requests = testing::prompt_length_requests(c.vocab_size, kNew);
  engine.run(requests, [&](Completion&& done) { out.done[done.id] = std::move(done); });
  out.stats = engine.stats();
  return out;
}

// The offload engine on the CPU stand-in device of `budget` bytes, through run().
EngineRun run_on_standin(const Model& m, const Policy& p, const OffloadSettings& settings,
                         size_t budget = size_t(1) << 30, bool observe = true) {
  offload::CpuStandinDevice device(budget);
  offload::HostMath math;
  BatchEngine engine(m, p, EngineDevice{&device, &math, settings});
  return run(engine, m.config, observe);
}

struct Comparison {
  double worst = 0;
  int positions = 0, same_argmax = 0, bitwise = 0;
};

// Every request finished with the same tokens, and per sampled position the logits compared.
Comparison compare(const EngineRun& got, const EngineRun& want) {
  Comparison c;
  EXPECT_EQ(got.done.size(), std::size(kPromptLengths));
  for (const auto& [id, completion] : want.done) {
    auto it = got.done.find(id);
    if (it == got.done.end()) {
      ADD_FAILURE() << "request " << id << " did not finish";
      continue;
    }
    EXPECT_EQ(it->second.tokens, completion.tokens) << "request " << id;
  }
  for (const auto& [key, row] : want.logits) {
    auto it = got.logits.find(key);
    if (it == got.logits.end()) {
      ADD_FAILURE() << "no logits for request " << key.first << " position " << key.second;
      continue;
    }
    c.worst = std::max(c.worst, relative_max_error(it->second, row));
    c.same_argmax += argmax(it->second) == argmax(row);
    c.bitwise += it->second == row;
    ++c.positions;
  }
  return c;
}

using Case = testing::TinyModelCase;

class OffloadEngine : public ::testing::TestWithParam<Case> {
 protected:
  Model model() const {
    ModelConfig config = preset_config("tiny-mixtral");
    GetParam().edit(config);
    return make_random_model(config, 42);
  }
};

// Multi-head latent attention runs on the host only: a GPU share of its attention (ω < 1) is
// refused by name. Returns whether the model has it (the GPU-share tests then stop there).
bool refuses_gpu_share(const Model& m) {
  if (m.config.attention != AttentionKind::kLatent) return false;
  OffloadSettings settings{0, 6, 0};
  settings.cpu_attention_share = 0.5;
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  EXPECT_ERROR_MENTIONS(BatchEngine(m, testing::exercising_policy(Precision::kF32, kNew),
                                    EngineDevice{&device, &math, settings}),
                        "cpu_attention_share", "multi-head latent attention");
  return true;
}

// f32 precision, 3 page slots (one expert: every page is streamed and its slot reused), experts
// with at most 2 tokens on the CPU. Tokens identical; logits equal up to the order in which CPU
// experts' outputs join the residual (after the device's experts, not in expert id order). That
// reordering changes fp32 sums in the last bit, and a K/V element that then rounds to the other
// bf16 neighbour in the KV cache moves logits by up to ~6e-4 relative (batch_engine_test), hence
// the engine tests' 1e-3; measured here ~2e-5 at worst.
TEST_P(OffloadEngine, Fp32EqualsTheCpuEngineWithStreamedPagesAndCpuExperts) {
  const Model m = model();
  const Policy p = test_policy(Precision::kF32);
  BatchEngine cpu_engine(m, p);
  const EngineRun want = run(cpu_engine, m.config);

  const OffloadSettings settings{0, 3, 2};
  const size_t budget = offload_footprint(m.config, p, settings).minimum();
  offload::CpuStandinDevice device(budget);
  offload::HostMath math;
  BatchEngine engine(m, p, EngineDevice{&device, &math, settings});
  const EngineRun got = run(engine, m.config);

  const Comparison c = compare(got, want);
  std::printf("f32, 3 slots, CPU experts: %d positions, %d bitwise equal, worst %.3g\n",
              c.positions, c.bitwise, c.worst);
  EXPECT_LT(c.worst, 1e-3);
  EXPECT_EQ(c.same_argmax, c.positions);
  const EngineStats& s = got.stats;
  EXPECT_GT(s.device_pages_copied, 3) << "pages were not streamed through the 3 slots";
  EXPECT_GT(s.device_cpu_experts, 0) << "no expert ran on the CPU path";
  EXPECT_GT(s.device_gpu_experts, 0);
  EXPECT_GT(got.mixed_steps, 0) << "no step mixed prefill and decode";
  EXPECT_GE(s.device_bytes_to_device,
            double(s.device_pages_copied) * double(expert_matrix_bytes(m.config)));
  EXPECT_GT(s.device_bytes_to_host, 0);
  // The budget was exactly the minimum footprint; it was used to the byte and never passed.
  EXPECT_EQ(device.budget().peak(), budget);
  EXPECT_EQ(s.device_peak_bytes, budget);
  EXPECT_EQ(device.budget().used(), budget);  // held until the engine goes
  // The same work was accounted as on the CPU engine.
  EXPECT_EQ(s.expert_tokens, want.stats.expert_tokens);
  EXPECT_EQ(s.expert_gemm_calls, want.stats.expert_gemm_calls);
  EXPECT_DOUBLE_EQ(s.flops, want.stats.flops);
}

// With every expert on the device they run in the CPU engine's order: the same numbers bit for
// bit. The pages stream with a prefetch window of two experts (6 slots).
TEST_P(OffloadEngine, Fp32AllExpertsOnTheDeviceIsBitwiseTheCpuEngine) {
  const Model m = model();
  const Policy p = test_policy(Precision::kF32);
  BatchEngine cpu_engine(m, p);
  const EngineRun want = run(cpu_engine, m.config);
  const EngineRun got = run_on_standin(m, p, {0, 6, 0});
  const Comparison c = compare(got, want);
  EXPECT_EQ(c.bitwise, c.positions);
  EXPECT_EQ(got.stats.device_cpu_experts, 0);
  EXPECT_GT(got.stats.device_pages_copied, 6);
}

// bf16 precision (the fast path): the tolerance of the bf16 engine tests (1e-2 relative, same
// argmax everywhere); in practice the rounding points are the CPU engine's, so it is far closer.
TEST_P(OffloadEngine, Bf16MatchesTheCpuEngine) {
  const Model m = model();
  const Policy p = test_policy(Precision::kBf16);
  BatchEngine cpu_engine(m, p);
  const EngineRun want = run(cpu_engine, m.config);
  const EngineRun got = run_on_standin(m, p, {0, 4, 3});
  const Comparison c = compare(got, want);
  std::printf("bf16, 4 slots, CPU experts: %d positions, %d bitwise equal, worst %.3g\n",
              c.positions, c.bitwise, c.worst);
  EXPECT_LT(c.worst, 1e-2);
  EXPECT_EQ(c.same_argmax, c.positions);
  EXPECT_GT(got.stats.device_cpu_experts, 0);
}

// Resident expert layers (none, some, all of them, evenly spaced) with the lm_head on the device
// and on the host: the same tokens as the CPU engine, and with every expert on the device in f32
// the same numbers bit for bit (HostMath's final norm and lm_head are the CPU engine's calls).
// Only the streamed layers' pages are copied; with every layer resident, none is and no slot is
// allocated. Each budget is the footprint to the byte, so the peak says what was allocated.
TEST_P(OffloadEngine, ResidentExpertLayersAndDeviceLmHeadEqualTheCpuEngine) {
  const Model m = model();
  const int L = m.config.num_layers;
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    const Policy p = test_policy(precision);
    BatchEngine cpu_engine(m, p);
    const EngineRun want = run(cpu_engine, m.config);
    int64_t all_streamed_pages = -1;
    for (int resident : {0, 1, L})
      for (LmHeadPlace lm : {LmHeadPlace::kDevice, LmHeadPlace::kHost}) {
        SCOPED_TRACE(::testing::Message()
                     << "f32 " << (precision == Precision::kF32) << ", resident " << resident
                     << " of " << L << ", lm_head on the device " << (lm == LmHeadPlace::kDevice));
        OffloadSettings settings{0, 6, 0};
        settings.resident_expert_layers = resident;
        settings.lm_head = lm;
        const OffloadFootprint f = offload_footprint(m.config, p, settings);
        const size_t budget = f.with_slots(resident == L ? 0 : 6);
        const EngineRun got = run_on_standin(m, p, settings, budget);
        const Comparison c = compare(got, want);
        if (precision == Precision::kF32) {
          EXPECT_EQ(c.bitwise, c.positions);
        } else {
          EXPECT_LT(c.worst, 1e-2);
          EXPECT_EQ(c.same_argmax, c.positions);
        }
        EXPECT_EQ(got.stats.device_peak_bytes, budget);
        EXPECT_EQ(got.stats.expert_tokens, want.stats.expert_tokens);
        EXPECT_DOUBLE_EQ(got.stats.flops, want.stats.flops);
        const int64_t pages = got.stats.device_pages_copied;
        if (resident == 0) {
          all_streamed_pages = pages;
          EXPECT_GT(pages, 0);
        } else if (resident == L) {
          EXPECT_EQ(pages, 0);
          EXPECT_EQ(f.min_slots, 0);
        } else {
          EXPECT_GT(pages, 0);
          EXPECT_LT(pages, all_streamed_pages);
        }
      }
  }
}

// CPU experts apply to streamed layers only: a resident layer's experts run on the device.
TEST_P(OffloadEngine, CpuExpertsSkipResidentLayers) {
  const Model m = model();
  const Policy p = test_policy(Precision::kF32);
  BatchEngine cpu_engine(m, p);
  const EngineRun want = run(cpu_engine, m.config);
  OffloadSettings settings{0, 3, 2};
  settings.resident_expert_layers = m.config.num_layers;
  const EngineRun got = run_on_standin(m, p, settings);
  const Comparison c = compare(got, want);
  EXPECT_EQ(c.bitwise, c.positions);  // no CPU expert: the CPU engine's order of additions
  EXPECT_EQ(got.stats.device_cpu_experts, 0);
  EXPECT_GT(got.stats.device_gpu_experts, 0);
  EXPECT_EQ(got.stats.device_pages_copied, 0);
}

// The GPU share of attention (ω < 1): a sequence's attention runs on the device over the device
// KV pool (HostMath: kernels/cpu's paged attention over the pool's memory) or on the host over
// the engine's cache, for the whole sequence. ω = 0 (all on the device), 0.5 (both shares in the
// same micro-batches) and 1 (all on the host), with prefill and decode mixed. Every expert on the
// device: in f32 the CPU engine's numbers bit for bit, since both shares make the CPU engine's
// kernel calls on the same bf16 K/V. With CPU experts and 3 slots at the minimum budget: the
// tolerance of the test above. Each budget is the footprint (the KV pool included) to the byte.
TEST_P(OffloadEngine, GpuShareOfAttentionEqualsTheCpuEngine) {
  const Model m = model();
  if (refuses_gpu_share(m)) return;
  const int L = m.config.num_layers;
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    const Policy p = test_policy(precision);
    BatchEngine cpu_engine(m, p);
    const EngineRun want = run(cpu_engine, m.config);
    const int64_t rows = want.stats.prefill_tokens + want.stats.decode_tokens;
    for (double omega : {0.0, 0.5, 1.0})
      for (bool cpu_experts : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "f32 " << (precision == Precision::kF32) << ", omega "
                                          << omega << ", CPU experts " << cpu_experts);
        OffloadSettings settings{0, cpu_experts ? 3 : 6, cpu_experts ? 2 : 0};
        settings.cpu_attention_share = omega;
        const OffloadFootprint f = offload_footprint(m.config, p, settings);
        EXPECT_EQ(f.kv_pool > 0, omega < 1);
        const size_t budget = f.with_slots(settings.page_slots);
        offload::CpuStandinDevice device(budget);
        offload::HostMath math;
        BatchEngine engine(m, p, EngineDevice{&device, &math, settings});
        const EngineRun got = run(engine, m.config);
        const Comparison c = compare(got, want);
        std::printf("omega %.1f, f32 %d, CPU experts %d: %d positions, %d bitwise, worst %.3g\n",
                    omega, precision == Precision::kF32, cpu_experts, c.positions, c.bitwise,
                    c.worst);
        if (precision == Precision::kF32 && !cpu_experts) {
          EXPECT_EQ(c.bitwise, c.positions);
        } else {
          EXPECT_LT(c.worst, precision == Precision::kF32 ? 1e-3 : 1e-2);
          EXPECT_EQ(c.same_argmax, c.positions);
        }
        EXPECT_GT(got.mixed_steps, 0);
        const EngineStats& s = got.stats;
        EXPECT_EQ(s.device_peak_bytes, budget);
        EXPECT_EQ(device.budget().used(), budget);
        // The same attention work accounted, wherever it ran.
        EXPECT_DOUBLE_EQ(s.flops, want.stats.flops);
        EXPECT_DOUBLE_EQ(s.kv_bytes, want.stats.kv_bytes);
        if (omega == 0) {
          EXPECT_EQ(s.device_gpu_attention_rows, rows * L);
        } else if (omega == 1) {
          EXPECT_EQ(s.device_gpu_attention_rows, 0);
        } else {
          EXPECT_GT(s.device_gpu_attention_rows, rows * L / 4);
          EXPECT_LT(s.device_gpu_attention_rows, rows * L * 3 / 4);
        }
      }
  }
}

// Only the host share's q/k/v cross the link: with every sequence's attention on the device,
// fewer bytes go to the host than with all on the host (the routing still does).
TEST_P(OffloadEngine, GpuShareKeepsItsQkvOnTheDevice) {
  const Model m = model();
  if (refuses_gpu_share(m)) return;
  const Policy p = test_policy(Precision::kF32);
  EngineStats stats[2];
  for (int i = 0; i < 2; ++i) {
    OffloadSettings settings{0, 6, 0};
    settings.cpu_attention_share = i;  // 0: all on the device, 1: all on the host
    stats[i] = run_on_standin(m, p, settings).stats;
  }
  const ModelConfig& c = m.config;
  // Exactly the q/k/v of every row of every layer less.
  const double rows = double(stats[0].prefill_tokens + stats[0].decode_tokens);
  EXPECT_GT(rows, 0);
  EXPECT_DOUBLE_EQ(stats[1].device_bytes_to_host - stats[0].device_bytes_to_host,
                   rows * c.num_layers * double(c.q_dim() + 2 * c.kv_dim()) * 4);
}

// Greedy requests with the lm_head on the device and nobody reading the logits: the device picks
// each sampled row's token, the CPU engine's token, and only the tokens come back — S·4 bytes a
// step instead of S·V·4, one sampled row per generated token.
TEST_P(OffloadEngine, GreedyTokensArePickedOnTheDevice) {
  const Model m = model();
  const Policy p = test_policy(Precision::kF32);
  BatchEngine cpu_engine(m, p);
  const EngineRun want = run(cpu_engine, m.config, /*observe=*/false);
  OffloadSettings settings{0, 6, 0};
  settings.lm_head = LmHeadPlace::kDevice;
  const EngineRun got = run_on_standin(m, p, settings, size_t(1) << 30, /*observe=*/false);
  const EngineRun observed = run_on_standin(m, p, settings);
  ASSERT_EQ(got.done.size(), want.done.size());
  int64_t generated = 0;
  for (const auto& [id, done] : want.done) {
    EXPECT_EQ(got.done.at(id).tokens, done.tokens) << "request " << id;
    EXPECT_EQ(observed.done.at(id).tokens, done.tokens) << "request " << id;
    generated += int64_t(done.tokens.size());
  }
  EXPECT_DOUBLE_EQ(observed.stats.device_bytes_to_host - got.stats.device_bytes_to_host,
                   double(generated) * (m.config.vocab_size - 1) * 4);
}

// The Scheduler's two KV pools: a sequence joins the GPU share only when the device pool has room
// for every block it will hold, else the host pool takes it if it has room, else it waits. The
// test's sequences reserve 7 to 15 blocks of 4 tokens. 32 KV blocks at ω = 0.5 are 16 in the
// host cache and 16 in the device pool, each of which holds one of the longest sequences. The
// output is the CPU engine's whatever the split, the device pool never overflows (its books are a
// PagedKvCache that refuses to), and the host holds only its 16 blocks: it alone (the CPU engine
// with 16 blocks) runs fewer sequences at once than both pools together.
TEST_P(OffloadEngine, GpuShareAdmitsOnlyWhatItsKvPoolHolds) {
  const Model m = model();
  if (refuses_gpu_share(m)) return;
  Policy p = test_policy(Precision::kF32);
  p.kv_blocks = 32;
  BatchEngine cpu_engine(m, p);
  const EngineRun want = run(cpu_engine, m.config);
  OffloadSettings settings{0, 6, 0};
  settings.cpu_attention_share = 0.5;
  const EngineRun got = run_on_standin(m, p, settings);
  const Comparison c = compare(got, want);
  EXPECT_EQ(c.bitwise, c.positions);
  std::printf(
      "pools of %lld host and %lld device blocks: %lld rows attended on the device, %lld device "
      "turns went to the host\n",
      (long long)host_kv_blocks(p.kv_blocks, 0.5), (long long)gpu_kv_blocks(p.kv_blocks, 0.5),
      (long long)got.stats.device_gpu_attention_rows, (long long)got.stats.device_gpu_share_full);
  EXPECT_EQ(host_kv_blocks(p.kv_blocks, 0.5), 16);
  EXPECT_EQ(got.stats.kv_cache_bytes, want.stats.kv_cache_bytes / 2);
  EXPECT_GT(got.stats.device_gpu_attention_rows, 0);
  Policy host_only = p;
  host_only.kv_blocks = 16;
  BatchEngine host_engine(m, host_only);
  const EngineRun alone = run(host_engine, m.config);
  std::printf("at most %lld sequences at once with both pools, %lld with the host's alone\n",
              (long long)got.max_active, (long long)alone.max_active);
  EXPECT_GT(got.max_active, alone.max_active);
  // The KV use counts both pools' blocks: never more than all of them. The peak is taken with
  // the step's blocks appended, the progress after its sequences retired.
  EXPECT_LE(got.stats.peak_kv_usage, 1.0);
  EXPECT_GT(got.max_kv_usage, 0.0);
  EXPECT_GE(got.stats.peak_kv_usage, got.max_kv_usage);
}

// The KV cache as the run uses it: with multi-head latent attention every (token, layer) stores
// the normalised latent and the rotated RoPE key only, (kv_lora_rank + qk_rope_head_dim) × 2
// bytes in bf16 — read from the cache's own writes and pool size, on the CPU engine and on the
// stand-in device's host cache. Mixtral's for contrast: K and V of every KV head.
TEST(KvCacheBytes, LatentCacheStoresTheLatentAndTheRopeKeyOnly) {
  for (const char* preset :
       {"tiny-deepseek-v2-lite", "tiny-deepseek-v2", "tiny-deepseek-v3", "tiny-mixtral"}) {
    SCOPED_TRACE(preset);
    const Model m = make_random_model(preset_config(preset), 42);
    const ModelConfig& c = m.config;
    const Policy p = test_policy(Precision::kBf16);
    const int64_t per_token_layer = c.attention == AttentionKind::kLatent
                                        ? int64_t(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) * 2
                                        : int64_t(2) * c.num_kv_heads * c.head_dim * 2;
    BatchEngine cpu_engine(m, p);
    const EngineStats cpu = run(cpu_engine, c).stats;
    const EngineStats standin = run_on_standin(m, p, {0, 6, 0}).stats;
    for (const EngineStats* s : {&cpu, &standin}) {
      // Every prompt and generated token but each request's last went through every layer.
      EXPECT_EQ(s->kv_stored_token_layers,
                (s->prefill_tokens + s->decode_tokens) * int64_t(c.num_layers));
      ASSERT_GT(s->kv_stored_token_layers, 0);
      EXPECT_EQ(s->kv_stored_bytes, s->kv_stored_token_layers * per_token_layer);
      EXPECT_EQ(int64_t(s->kv_cache_bytes),
                p.kv_blocks * p.kv_block_size * int64_t(c.num_layers) * per_token_layer);
    }
    EXPECT_EQ(int64_t(kv_bytes_per_token(c)), per_token_layer * c.num_layers);
    if (c.attention == AttentionKind::kLatent)
      std::printf("%s: %lld bytes per token and layer in the KV cache (K and V would be %lld)\n",
                  preset, (long long)(cpu.kv_stored_bytes / cpu.kv_stored_token_layers),
                  (long long)(2LL * c.num_heads * (c.head_dim + c.mla.v_head_dim)));
  }
}

// ω outside [0, 1] is refused, naming the field.
TEST(OffloadEngineBudget, CpuAttentionShareOutsideZeroToOneIsRefused) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 42);
  OffloadSettings settings{0, 6, 0};
  settings.cpu_attention_share = 1.5;
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  try {
    BatchEngine engine(m, test_policy(Precision::kF32), EngineDevice{&device, &math, settings});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_attention_share"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, OffloadEngine, ::testing::ValuesIn(testing::family_cases()),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// A budget one byte under the minimum footprint is refused, naming the minimum. By default the
// lm_head goes on the device only when the budget has room for it: the minimum is the footprint
// with the lm_head on the host, and the footprint with it on the device puts it there.
TEST(OffloadEngineBudget, TooSmallGpuMemNamesTheMinimum) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 1);
  const Policy p = test_policy(Precision::kBf16);
  OffloadSettings host_lm;
  host_lm.lm_head = LmHeadPlace::kHost;
  const size_t minimum = offload_footprint(m.config, p, host_lm).minimum();
  const size_t with_lm_head = offload_footprint(m.config, p, {}).minimum();
  EXPECT_GT(with_lm_head, minimum);
  DeviceOptions o;
  o.kind = DeviceKind::kStandin;
  o.gpu_mem = std::to_string(minimum - 1);
  const std::string named = fmt::format("({} bytes)", minimum);
  EXPECT_ERROR_MENTIONS((BatchEngine{m, p, o}), "--gpu-mem", "needs at least", named.c_str());
  o.gpu_mem = std::to_string(minimum);
  BatchEngine fits(m, p, o);  // the minimum itself is enough: 3 page slots, lm_head on the host
  const EngineRun r = run(fits, m.config);
  EXPECT_EQ(r.done.size(), std::size(kPromptLengths));
  EXPECT_EQ(r.stats.device_peak_bytes, minimum);
  o.gpu_mem = std::to_string(with_lm_head);
  BatchEngine lm_fits(m, p, o);
  const EngineRun lr = run(lm_fits, m.config);
  EXPECT_EQ(lr.stats.device_peak_bytes, with_lm_head);
  EXPECT_EQ(lr.done.size(), std::size(kPromptLengths));
  for (const auto& [id, done] : r.done) EXPECT_EQ(lr.done.at(id).tokens, done.tokens);
  // Asked for on the device, a budget without room for it is an error.
  o.gpu_mem = std::to_string(with_lm_head - 1);
  o.settings.lm_head = LmHeadPlace::kDevice;
  const std::string named_lm = fmt::format("({} bytes)", with_lm_head);
  EXPECT_ERROR_MENTIONS((BatchEngine{m, p, o}), "--gpu-mem", "lm_head", named_lm.c_str());
}

// The minimum counts the resident layers' experts, and with every layer resident no page slot.
TEST(OffloadEngineBudget, MinimumCountsResidentExperts) {
  ModelConfig four = preset_config("tiny-mixtral");
  four.num_layers = 4;
  const Model m = make_random_model(four, 1);
  const Policy p = test_policy(Precision::kBf16);
  const ModelConfig& c = m.config;
  const size_t layer_experts = size_t(3) * c.num_experts * expert_matrix_bytes(c);
  OffloadSettings s;
  s.lm_head = LmHeadPlace::kHost;
  const size_t none = offload_footprint(c, p, s).minimum();
  s.resident_expert_layers = 2;
  const OffloadFootprint two = offload_footprint(c, p, s);
  EXPECT_EQ(two.resident_experts, 2 * layer_experts);
  EXPECT_EQ(two.minimum(), none + 2 * layer_experts);
  s.resident_expert_layers = 4;
  const OffloadFootprint all = offload_footprint(c, p, s);
  EXPECT_EQ(all.min_slots, 0);
  EXPECT_EQ(all.minimum(), none + 4 * layer_experts - 3 * all.page_bytes);

  DeviceOptions o;
  o.kind = DeviceKind::kStandin;
  o.settings.resident_expert_layers = 2;
  o.gpu_mem = std::to_string(two.minimum() - 1);
  const std::string named = fmt::format("({} bytes)", two.minimum());
  EXPECT_ERROR_MENTIONS((BatchEngine{m, p, o}), "--gpu-mem", named.c_str(),
                        "resident experts of 2 layers", "--resident-expert-layers");
  o.settings.resident_expert_layers = 5;
  o.gpu_mem.clear();
  EXPECT_ERROR_MENTIONS((BatchEngine{m, p, o}), "resident_expert_layers", "expected 0 to 4",
                        "got 5");
}

TEST(OffloadEngineBudget, PagesSmallerThanAnExpertMatrixAreRefused) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 1);
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  const size_t matrix = expert_matrix_bytes(m.config);
  const std::string named = std::to_string(matrix);
  EXPECT_ERROR_MENTIONS(
      (BatchEngine{m, test_policy(Precision::kBf16), EngineDevice{&device, &math, {matrix - 2}}}),
      "page_bytes", named.c_str());
  EXPECT_EQ(device.budget().used(), 0u);  // nothing left allocated after the failure
}

// The command line: --device standin runs the offload path and prints what --device cpu prints;
// a --gpu-mem below the minimum is one clear error line.
class OffloadCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r = testing::run_command(
        testing::sluice_command("make-model --preset tiny-mixtral --out " +
                                (dir_->path() / "tiny").string() + " --seed 5"));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string generate(const std::string& extra) {
    return testing::sluice_command("generate --model " + (dir_->path() / "tiny").string() +
                                   " --prompt 'The river' --max-new-tokens 12 --temperature 0 "
                                   "--precision f32 --threads 2 " +
                                   extra);
  }
  static testing::TempDir* dir_;
};
testing::TempDir* OffloadCli::dir_ = nullptr;

TEST_F(OffloadCli, StandinDeviceGeneratesWhatTheCpuGenerates) {
  const auto cpu = testing::run_command(generate("--device cpu"), /*with_stderr=*/false);
  const auto standin = testing::run_command(
      generate("--device standin --gpu-mem 64MiB --page-slots 3 --cpu-expert-max-tokens 1"),
      /*with_stderr=*/false);
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  ASSERT_EQ(standin.status, 0) << standin.output;
  EXPECT_FALSE(cpu.output.empty());
  EXPECT_EQ(standin.output, cpu.output);
  // The one sequence's attention on the device (ω = 0), and an ω outside [0, 1] refused.
  const auto gpu_attention = testing::run_command(
      generate("--device standin --gpu-mem 64MiB --cpu-attention-share 0"), /*with_stderr=*/false);
  ASSERT_EQ(gpu_attention.status, 0) << gpu_attention.output;
  EXPECT_EQ(gpu_attention.output, cpu.output);
  const auto bad = testing::run_command(generate("--device standin --cpu-attention-share 1.5"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--cpu-attention-share"), std::string::npos) << bad.output;
}

TEST_F(OffloadCli, TooSmallGpuMemIsOneClearError) {
  const auto r = testing::run_command(generate("--device standin --gpu-mem 16KiB"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --gpu-mem: the offload executor needs at least"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace sluice
