// The offload path with the routed experts on disk (--host-mem below the weights, --device): an
// expert goes disk → a slot of the host page pool → a device page slot, and the pool slot is
// freed once the copy is done. On the CPU stand-in device, a pool of 3 experts gives the tokens
// and logits of the same model held in memory on the same device, bit for bit (the same bytes
// reach the same kernels), with experts streamed and resident, and with small experts on the CPU
// (which read theirs from the pool too); the device copies only the pages of experts it runs; the
// pool's books add up. Every kind of expert the pool reads: bf16, int8, int4, FP8 and stored
// transposed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "disk_cases.h"
#include "engine/batch_engine.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

using testing::DiskCase;

constexpr int kNew = 5;

struct DeviceRun {
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;
  std::map<int64_t, std::vector<int>> tokens;
  EngineStats stats;
};

DeviceRun on_standin(const Model& m, int pool_experts, const OffloadSettings& s) {
  Policy p = testing::exercising_policy(Precision::kBf16, kNew);
  p.pool_experts = pool_experts;
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  BatchEngine engine(m, p, EngineDevice{&device, &math, s});
  DeviceRun out;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    out.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  std::vector<Request> requests = testing::prompt_length_requests(m.config.vocab_size, kNew);
  engine.run(requests, [&](Completion&& done) { out.tokens[done.id] = done.tokens; });
  out.stats = engine.stats();
  return out;
}

// Logit rows of `want` that `got` does not have bit for bit (or at all).
int rows_that_differ(const DeviceRun& got, const DeviceRun& want) {
  int differ = int(want.logits.size()) - int(got.logits.size());
  for (const auto& [key, row] : want.logits) {
    auto it = got.logits.find(key);
    differ += it == got.logits.end() || it->second != row;
  }
  return std::abs(differ);
}

class OffloadDisk : public ::testing::TestWithParam<DiskCase> {};

TEST_P(OffloadDisk, APoolOfThreeExpertsGivesTheNumbersOfTheModelInMemory) {
  const testing::CheckpointTwice models(GetParam(), 21);
  const Model &in_memory = models.in_memory, &on_disk = models.on_disk;
  ASSERT_TRUE(on_disk.expert_files);
  for (int resident : {0, 1})
    for (int cpu_max : {0, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << "resident " << resident << ", cpu experts ≤ " << cpu_max);
      OffloadSettings s{0, 6, cpu_max};
      s.resident_expert_layers = resident;
      const DeviceRun want = on_standin(in_memory, 0, s);
      const DeviceRun got = on_standin(on_disk, 3, s);
      // With CPU experts the two runs may place a small expert differently (below), and the
      // CPU's sum differs from the device's in the last bits: the bf16 engine tolerance then.
      if (cpu_max == 0) {
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_EQ(rows_that_differ(got, want), 0) << "of " << want.logits.size() << " rows";
      } else {
        ASSERT_EQ(got.logits.size(), want.logits.size());
        for (const auto& [key, row] : want.logits)
          EXPECT_LT(testing::relative_max_error(got.logits.at(key), row), 1e-2);
      }
      // In memory, pages are copied ahead across layers, before the next layer's routing says
      // whether their experts run on the device (a small expert whose pages are there runs on
      // the device); from disk, only once it has: no copy is wasted (below), and more small
      // experts run on the CPU.
      const EngineStats &g = got.stats, &w = want.stats;
      EXPECT_EQ(g.device_gpu_experts + g.device_cpu_experts,
                w.device_gpu_experts + w.device_cpu_experts);
      if (cpu_max == 0) {
        EXPECT_EQ(g.device_gpu_experts, w.device_gpu_experts);
      }
      EXPECT_GT(g.device_pages_copied, 0);
      if (resident == 0) {  // every page a GPU expert read was copied once, or kept from before
        EXPECT_EQ(g.device_pages_copied + g.device_pages_reused, 3 * g.device_gpu_experts);
      }

      const ExpertPoolStats& d = got.stats.disk;
      EXPECT_GT(d.demands, 0);
      EXPECT_LE(d.hits, d.demands);
      // Every demand that missed was read before its copy; guesses on their way at the end of
      // the run were not. (The resident layer's experts are read once at start-up, outside the
      // demands.)
      EXPECT_GE(d.experts_read, d.demands - d.hits);
      EXPECT_GE(d.bytes_read, double(d.experts_read) * d.expert_bytes);
    }
}

// The device half of the expert cache: slots beyond the copy window keep experts' pages from
// step to step. The numbers stay those of the model in memory without the cache, bit for bit;
// pages are kept and not copied again; and from disk, an expert kept on the device is not asked
// of the host page pool at all.
TEST_P(OffloadDisk, TheDeviceCacheKeepsPagesAndTheirReadsAway) {
  const testing::CheckpointTwice models(GetParam(), 22);
  OffloadSettings s{0, 6, 0};
  s.resident_expert_layers = 0;
  const DeviceRun want = on_standin(models.in_memory, 0, s);
  const DeviceRun disk_uncached = on_standin(models.on_disk, 3, s);
  s.cache_pages = 12;
  const DeviceRun in_memory = on_standin(models.in_memory, 0, s);
  const DeviceRun on_disk = on_standin(models.on_disk, 3, s);
  EXPECT_EQ(want.stats.device_pages_reused, 0);
  for (const DeviceRun* run : {&disk_uncached, &in_memory, &on_disk}) {
    EXPECT_EQ(run->tokens, want.tokens);
    EXPECT_EQ(rows_that_differ(*run, want), 0) << "of " << want.logits.size() << " logit rows";
  }
  for (const DeviceRun* run : {&in_memory, &on_disk}) {
    const EngineStats& g = run->stats;
    EXPECT_GT(g.device_pages_reused, 0);
    // In memory, some pages are copied ahead for experts the router then skips.
    EXPECT_GE(g.device_pages_copied + g.device_pages_reused, 3 * g.device_gpu_experts);
  }
  const EngineStats& d = on_disk.stats;
  EXPECT_EQ(d.device_pages_copied + d.device_pages_reused, 3 * d.device_gpu_experts);
  EXPECT_LT(on_disk.stats.disk.demands, disk_uncached.stats.disk.demands);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, OffloadDisk, ::testing::ValuesIn(testing::disk_cases()),
                         testing::disk_case_name);

// The command line: --host-mem below the weights with --device keeps the routed experts on disk;
// the tokens are the CPU engine's with every weight in memory, and bench reports the disk's reads.
TEST(OffloadDiskCli, ExpertsOnDiskGenerateWhatTheCpuGenerates) {
  testing::TempDir dir;
  const std::string tiny = (dir / "tiny").string();
  const auto made = testing::run_command(
      testing::sluice_command("make-model --preset tiny-mixtral --seed 5 --out " + tiny));
  ASSERT_EQ(made.status, 0) << made.output;
  const ModelConfig c = load_model_config(tiny);
  const std::string host_mem =
      " --host-mem " + std::to_string(model_weight_bytes(c) - routed_expert_bytes(c) / 2);
  const std::string generate = "generate --model " + tiny +
                               " --prompt 'The river' --max-new-tokens 12 --temperature 0 "
                               "--precision f32 --threads 2 ";
  const auto cpu = testing::run_command(testing::sluice_command(generate + "--device cpu"), false);
  const auto on_disk =
      testing::run_command(testing::sluice_command(generate +
                                                   "--device standin --gpu-mem 64MiB "
                                                   "--cpu-expert-max-tokens 1" +
                                                   host_mem),
                           false);
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  ASSERT_EQ(on_disk.status, 0) << on_disk.output;
  EXPECT_FALSE(cpu.output.empty());
  EXPECT_EQ(on_disk.output, cpu.output);
  const auto bench = testing::run_command(testing::sluice_command(
      "bench --model " + tiny +
      " --prompt-len 8 --gen-len 4 --requests 4 --threads 2 --device standin --gpu-mem 64MiB" +
      host_mem));
  ASSERT_EQ(bench.status, 0) << bench.output;
  EXPECT_NE(bench.output.find("disk       experts stay on disk, host page pool of "),
            std::string::npos)
      << bench.output;
}

}  // namespace
}  // namespace sluice
