// The host-memory budget: what this process may really allocate (MemAvailable, cgroup limits,
// `ulimit -v`), never derived from the model; and jobs that need more than it are refused with
// the numbers before they allocate, instead of being killed part way. And the storage reads
// /proc/self/io counts (bench's load rate).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "core/error.h"
#include "engine/host_budget.h"
#include "model/presets.h"
#include "model/weights.h"
#include "runtime/disk/expert_page_pool.h"
#include "runtime/memory_info.h"
#include "runtime/planner/planner.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::run_command;
using testing::sluice_command;

TEST(CgroupRoom, IsTheLimitLessTheUsageAndNothingWhenUnlimited) {
  EXPECT_EQ(cgroup_room("1000", "300"), std::optional<size_t>(700));
  EXPECT_EQ(cgroup_room("300", "1000"), std::optional<size_t>(0));
  EXPECT_EQ(cgroup_room("max", "1000"), std::nullopt);
  EXPECT_EQ(cgroup_room("", ""), std::nullopt);  // no such file
}

// A file's pages dropped from the page cache are read from storage again, and counted.
TEST(StorageReadBytes, CountReadsThatMissThePageCache) {
  if (!storage_read_bytes()) GTEST_SKIP() << "/proc/self/io: the kernel does not account reads";
  testing::TempDir dir;
  const std::string bytes(size_t(4) << 20, 'x');
  testing::write_file(dir / "data", bytes);
  const int fd = open((dir / "data").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fdatasync(fd), 0);  // clean pages: fadvise can drop them
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  const size_t before = *storage_read_bytes();
  std::string read_back(bytes.size(), '\0');
  ASSERT_EQ(pread(fd, read_back.data(), read_back.size(), 0), ssize_t(read_back.size()));
  close(fd);
  EXPECT_GE(*storage_read_bytes() - before, bytes.size());
}

TEST(HostBudget, DefaultIsWhatTheMachineHasLessAMargin) {
  // One reading of MemAvailable: two readings differ by what other processes did in between.
  const size_t available = available_memory_bytes();
  const AllocatableMemory m = allocatable_memory(available);
  ASSERT_GT(m.bytes, 0u);
  EXPECT_LE(m.bytes, available);
  const HostBudget b = default_host_budget();
  EXPECT_LT(b.bytes, m.bytes);
  EXPECT_GT(b.bytes, m.bytes / 2);  // a margin, not a fraction of the machine
  EXPECT_NE(b.source.find("less a margin"), std::string::npos) << b.source;
}

TEST(HostBudget, RequestAboveWhatTheProcessMayAllocateIsRefusedOnlyWhenAllocating) {
  const size_t too_much = allocatable_memory().bytes * 4;
  EXPECT_EQ(host_budget(too_much, false).bytes, too_much);
  EXPECT_ERROR_MENTIONS(host_budget(too_much, true), "--host-mem", "more than this process may");
}

// mixtral-8x7b in bf16: 87 GiB of weights, of which 2.3 GiB are not routed experts; a slot of
// the disk tier's pool holds one expert (336 MiB).
TEST(RequireServable, WeightsThatFitOrThatTheDiskTierTakesPass) {
  const ModelConfig c = preset_config("mixtral-8x7b", 0);
  EXPECT_NO_THROW(require_servable(c, {size_t(200) << 30, "--host-mem"}, "x", ""));
  EXPECT_NO_THROW(require_servable(c, {size_t(8) << 30, "--host-mem"}, "x", ""));
}

TEST(RequireServable, TooLittleForTheResidentPartNamesTheNumbersAndTheWaysOut) {
  const ModelConfig c = preset_config("mixtral-8x7b", 0);
  EXPECT_ERROR_MENTIONS(require_servable(c, {size_t(2) << 30, "--host-mem"}, "--preset x", ""),
                        "--preset x: the weights need ",
                        "more than the budget of 2.00 GiB "
                        "(--host-mem); even with the routed experts on disk",
                        "a page pool of 2 experts need ", "a larger --host-mem", "sluice quantize",
                        "int4");
}

TEST(RequireServable, WhatTheDiskTierDoesNotTakeMustFitWhole) {
  const ModelConfig c = preset_config("mixtral-8x7b", 0);
  EXPECT_ERROR_MENTIONS(
      require_servable(c, {size_t(8) << 30, "--host-mem"}, "m.gguf", "a GGUF file"),
      "m.gguf: the weights need ", "more than the budget of 8.00 GiB (--host-mem)",
      "the disk tier cannot keep the routed experts on disk (a GGUF file)");
  EXPECT_EQ(disk_tier_refusal("/nonexistent"), "");
}

// FP8 checkpoints go to the disk tier like bf16 ones: their weights but the routed experts and a
// pool of 2 FP8 experts (codes and block scales) are enough.
TEST(RequireServable, FP8WeightsLargerThanTheBudgetStayOnDisk) {
  const ModelConfig c = preset_config("deepseek-v3", 5);
  ASSERT_TRUE(c.fp8_weights);
  const size_t least = model_weight_bytes(c) - routed_expert_bytes(c) +
                       size_t(kMinPoolExperts) * expert_slot_bytes(c);
  ASSERT_LT(least, model_weight_bytes(c) / 4);
  EXPECT_NO_THROW(require_servable(c, {least, "--host-mem"}, "v3", disk_tier_refusal("v3")));
  EXPECT_ERROR_MENTIONS(
      require_servable(c, {least - 1, "--host-mem"}, "v3", disk_tier_refusal("v3")),
      "even with the routed experts on disk", "a page pool of 2 experts need ");
}

#if !defined(SLUICE_UNDER_ASAN)
// In a child whose address space may grow by 512 MiB more, the budget follows that limit.
TEST(HostBudget, FollowsUlimitV) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit as{};
    getrlimit(RLIMIT_AS, &as);
    std::FILE* status = std::fopen("/proc/self/status", "r");
    size_t vm_kb = 0;
    char line[256];
    while (status && std::fgets(line, sizeof line, status))
      if (std::sscanf(line, "VmSize: %zu kB", &vm_kb) == 1) break;
    if (status) std::fclose(status);
    as.rlim_cur = rlim_t(vm_kb * 1024 + (size_t(512) << 20));
    if (setrlimit(RLIMIT_AS, &as) != 0) _exit(2);
    const AllocatableMemory m = allocatable_memory();
    _exit(m.limited_by == "ulimit -v" && m.bytes <= (size_t(512) << 20) ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Jobs under `ulimit -v 3 GiB` that need more: refused with the numbers, not killed.
class OverBudgetJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r = run_command(
        sluice_command("make-model --preset tiny-mixtral --out " + model().string() + " --seed 3"));
    ASSERT_EQ(r.status, 0) << r.output;
    testing::write_file(dir_->path() / "in.jsonl",
                        "{\"custom_id\": \"a\", \"prompt\": \"Hello\", \"max_tokens\": 2}\n");
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::filesystem::path model() { return dir_->path() / "tiny"; }
  static std::string under_ulimit(const std::string& args) {
    return "bash -c 'ulimit -v 3145728 && " + sluice_command(args) + "'";
  }
  static testing::TempDir* dir_;
};
testing::TempDir* OverBudgetJob::dir_ = nullptr;

TEST_F(OverBudgetJob, KvCacheLargerThanTheLimitIsRefused) {
  // 4000000 blocks of 16 tokens of the tiny model's KV: 7.6 GiB.
  auto r = run_command(under_ulimit(
      "run --model " + model().string() + " --input " + (dir_->path() / "in.jsonl").string() +
      " --output " + (dir_->path() / "out.jsonl").string() + " --kv-blocks 4000000"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: planner: needs at least "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("minimum KV ("), std::string::npos) << r.output;
}

TEST_F(OverBudgetJob, WeightsLargerThanTheLimitAreRefusedBeforeLoading) {
  auto r = run_command(under_ulimit(
      "bench --preset mixtral-8x7b --layers 2 --prompt-len 4 --gen-len 2 --requests 1"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --preset mixtral-8x7b: the weights need "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("limited by ulimit -v"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sluice quantize"), std::string::npos) << r.output;
}

// Weights larger than the budget are not an error for a safetensors folder: the routed experts
// stay on disk in a page pool.
TEST_F(OverBudgetJob, AFolderLargerThanTheBudgetRunsWithItsExpertsOnDisk) {
  const size_t weights = model_weight_bytes(load_model_config(model()));
  auto r = run_command(sluice_command("run --model " + model().string() + " --input " +
                                      (dir_->path() / "in.jsonl").string() + " --output " +
                                      (dir_->path() / "disk.jsonl").string() + " --host-mem " +
                                      std::to_string(weights - 1)));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("experts on disk, pool of "), std::string::npos) << r.output;
}

TEST_F(OverBudgetJob, HostMemBeyondTheLimitIsRefused) {
  auto r = run_command(under_ulimit("generate --model " + model().string() +
                                    " --prompt Hi --max-new-tokens 1 --host-mem 8GiB"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --host-mem 8.00 GiB is more than this process may allocate"),
            std::string::npos)
      << r.output;
}
#endif

// `--host-mem` below the weights: Cli.GenerateRunsThePlannersPolicyWithinTheHostMemoryLimit.

}  // namespace
}  // namespace sluice
