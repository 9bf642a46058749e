// The offload path on a real GPU with the routed experts on disk: each expert goes disk → host
// page pool slot (page-locked in place) → device page slot. Against the same model held in
// memory on the same GPU: with every expert on the device the same bytes reach the same kernels,
// so the logits are the same bit for bit; with small experts on the CPU, within the bf16 engine
// tolerance (which experts the CPU takes differs: from memory, pages copied ahead decide some).
// With slots that keep pages from step to step (the device half of the expert cache), the same.
// Skipped, with a message, on machines without a GPU; compiled everywhere nvcc is.
#include <gtest/gtest.h>

#include <map>

#include "../unit/disk_cases.h"
#include "../unit/tiny_model_cases.h"
#include "cuda_test_util.h"
#include "engine/batch_engine.h"

namespace sluice {
namespace {

struct GpuRun {
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;
  std::map<int64_t, std::vector<int>> tokens;
  EngineStats stats;
};

GpuRun on_gpu(const Model& m, int pool_experts, int resident, int cpu_max, int cache_pages) {
  Policy p = testing::exercising_policy(Precision::kBf16, 6);
  p.pool_experts = pool_experts;
  DeviceOptions o;
  o.kind = DeviceKind::kCuda;
  o.gpu_mem = "256MiB";
  o.settings.page_slots = 6;
  o.settings.cpu_expert_max_tokens = cpu_max;
  o.settings.resident_expert_layers = resident;
  o.settings.cache_pages = cache_pages;
  BatchEngine engine(m, p, o);
  GpuRun out;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    out.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  std::vector<Request> requests = testing::prompt_length_requests(m.config.vocab_size, 6);
  engine.run(requests, [&](Completion&& c) { out.tokens[c.id] = c.tokens; });
  out.stats = engine.stats();
  return out;
}

class CudaOffloadDisk : public ::testing::TestWithParam<testing::DiskCase> {};

TEST_P(CudaOffloadDisk, ExpertsReadFromDiskGiveTheNumbersOfTheModelInMemory) {
  SKIP_WITHOUT_GPU("CUDA offload test with the experts on disk");
  const testing::CheckpointTwice models(GetParam(), 23);
  const Model &in_memory = models.in_memory, &on_disk = models.on_disk;
  ASSERT_TRUE(on_disk.expert_files);
  for (int resident : {0, 1})
    for (int cpu_max : {0, 2})
      for (int cache : {0, 12}) {
        SCOPED_TRACE(::testing::Message() << "resident " << resident << ", cpu experts ≤ "
                                          << cpu_max << ", cached pages " << cache);
        const GpuRun want = on_gpu(in_memory, 0, resident, cpu_max, 0);
        const GpuRun got = on_gpu(on_disk, 3, resident, cpu_max, cache);
        ASSERT_EQ(got.logits.size(), want.logits.size());
        double worst = 0;
        int differ = 0;
        for (const auto& [key, row] : want.logits) {
          worst = std::max(worst, testing::relative_max_error(got.logits.at(key), row));
          differ += got.logits.at(key) != row;
        }
        if (cpu_max == 0) {
          EXPECT_EQ(differ, 0) << "of " << want.logits.size() << " logit rows";
          EXPECT_EQ(got.tokens, want.tokens);
        }
        EXPECT_LT(worst, 1e-2);
        EXPECT_GT(got.stats.device_pages_copied, 0);
        EXPECT_GT(got.stats.disk.demands, 0);
        EXPECT_GT(got.stats.device_pinned_weight_bytes, 0u);  // the pool, page-locked in place
        if (cache > 0) {
          EXPECT_GT(got.stats.device_pages_reused, 0);
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CudaOffloadDisk, ::testing::ValuesIn(testing::disk_cases()),
                         testing::disk_case_name);

}  // namespace
}  // namespace sluice
