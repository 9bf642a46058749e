// Loading holds one copy of the weights: the peak resident memory of a load (as `sluice run` and
// `bench` load: load_model_for_run, then read_weights_if_they_fit) stays within the weights +
// 10%, whether the experts are views of the mapping, repacked from a checkpoint that stores them
// apart (as Hugging Face's do), quantized at load, or dequantised from a GGUF file. No KV cache or
// activations exist yet.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "engine/weights_in_memory.h"
#include "model/expert_quant.h"
#include "model/gguf_export.h"
#include "model/model_stats.h"
#include "model/presets.h"
#include "model/quantize_checkpoint.h"
#include "model/synthetic.h"
#include "runtime/memory_info.h"
#include "test_util.h"

namespace sluice {
namespace {

// A Mixtral of six layers with 8 experts of 256 x 2048: 150 MiB of weights in bf16 (80 MiB in
// int8), so that the 10% margin is larger than what a load allocates beside the weights (the
// scratch of one matrix being quantized, a few MiB; with two layers, int8 peaked at 1.22x).
ModelConfig measured_mixtral() {
  ModelConfig c = preset_config("tiny-mixtral");
  c.hidden_size = 256;
  c.head_dim = c.hidden_size / c.num_heads;
  c.expert_intermediate_size = 2048;
  c.num_layers = 6;
  return c;
}

struct LoadPeak {
  size_t weight_bytes = 0;
  size_t peak_growth = 0;  // peak resident bytes during the load, above those before it
  size_t end_growth = 0;   // resident bytes after the load, above those before it
};

// The same model with one layer and experts of 256 x 256 (a few MiB): loaded first, so that the
// code and libraries a load touches are resident before the measured load (the process's
// baseline; alone they were 10 MiB of file pages, 12% of the int8 model above).
ModelConfig warm_up_mixtral() {
  ModelConfig c = measured_mixtral();
  c.expert_intermediate_size = 256;
  c.num_layers = 1;
  return c;
}

// Loads `warm_up` then `dir` in a child process, whose peak resident memory is reset between
// them (/proc/self/clear_refs 5), and returns the weight bytes and the peak's growth over the
// second load.
LoadPeak load_in_child(const std::filesystem::path& warm_up, const std::filesystem::path& dir,
                       ExpertDtype dtype) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    int status = 1;
    try {
      omp_set_num_threads(1);  // a forked child does not use the parent's OpenMP pool
      const HostBudget budget{size_t(8) << 30, "test"};
      read_weights_if_they_fit(load_model_for_run(warm_up, {dtype, 0}, budget));
      std::ofstream("/proc/self/clear_refs") << "5";
      const size_t before = current_resident_bytes();
      const Model m = load_model_for_run(dir, {dtype, 0}, budget);
      read_weights_if_they_fit(m);
      const LoadPeak r{model_stats(m).total_bytes, peak_resident_bytes() - before,
                       current_resident_bytes() - before};
      status = write(pipe_fds[1], &r, sizeof r) == ssize_t(sizeof r) ? 0 : 1;
    } catch (const std::exception& e) {
      fprintf(stderr, "load in the child failed: %s\n", e.what());
    }
    _exit(status);
  }
  close(pipe_fds[1]);
  LoadPeak r;
  const ssize_t got = read(pipe_fds[0], &r, sizeof r);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == ssize_t(sizeof r));
  return r;
}

// Loads `model` after `warm_up` with `dtype` experts and expects the peak growth within the
// weights + 10%.
void expect_one_copy(const std::filesystem::path& warm_up, const std::filesystem::path& model,
                     ExpertDtype dtype) {
#if defined(SLUICE_UNDER_ASAN)
  // ASan's allocator holds freed blocks in quarantine (256 MiB) instead of reusing them, so a
  // load's freed scratch stays resident: the peak measures ASan, not the loader.
  GTEST_SKIP() << "peak resident memory is not the loader's under AddressSanitizer";
#endif
  const LoadPeak r = load_in_child(warm_up, model, dtype);
  ASSERT_GT(r.weight_bytes, size_t(20) << 20);
  EXPECT_LE(double(r.peak_growth), 1.10 * double(r.weight_bytes))
      << "peak growth " << r.peak_growth << " bytes (" << r.end_growth << " after the load) for " << r.weight_bytes << " bytes of weights ("
      << expert_dtype_name(dtype) << " experts)";
}

// The same for dir/model, after a warm-up model written to dir/warm-up.
void expect_one_copy(const std::filesystem::path& dir, ExpertDtype dtype) {
  write_random_checkpoint(warm_up_mixtral(), dir / "warm-up", 1);
  expect_one_copy(dir / "warm-up", dir / "model", dtype);
}

class LoadMemory : public ::testing::TestWithParam<ExpertDtype> {
 protected:
  testing::TempDir dir_;
};

TEST_P(LoadMemory, ExpertsStoredBackToBackPeakAtOneCopy) {
  write_random_checkpoint(measured_mixtral(), dir_ / "model", 1);
  expect_one_copy(dir_.path(), GetParam());
}

// Rewritten in name order, each layer's experts lie apart (experts.0.w1, experts.0.w2, ...), so
// load_model repacks them into [E, ...] stacks (or quantizes them from where they are).
TEST_P(LoadMemory, ExpertsStoredApartPeakAtOneCopy) {
  write_random_checkpoint(measured_mixtral(), dir_ / "model", 1);
  testing::rewrite_checkpoint(dir_ / "model", [](TensorSpec&) { return true; });
  expect_one_copy(dir_.path(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(ExpertDtypes, LoadMemory,
                         ::testing::Values(ExpertDtype::kBf16, ExpertDtype::kInt8),
                         [](const auto& param_info) {
                           return std::string(expert_dtype_name(param_info.param));
                         });

// A quantized checkpoint (`sluice quantize`): each matrix's int8 values and scales are packed
// into the kernels' layout, and its pages dropped once packed.
TEST(LoadMemoryQuantizedCheckpoint, PeakAtOneCopy) {
  testing::TempDir dir;
  write_random_checkpoint(measured_mixtral(), dir / "bf16", 1);
  quantize_checkpoint(dir / "bf16", dir / "model", ExpertDtype::kInt8, kDefaultExpertGroup);
  expect_one_copy(dir.path(), ExpertDtype::kInt8);
}

// A GGUF file of Q8_0 blocks: each tensor dequantised to BF16 at load, and the file's pages of it
// dropped once read (before, the file's 80 MiB stayed resident beside the 150 MiB of weights).
// The warm-up is a GGUF file too, so that the code reading one is resident before the measure.
TEST(LoadMemoryGguf, Q8_0FileDequantisedAtLoadPeaksAtOneCopy) {
  testing::TempDir dir;
  write_random_checkpoint(warm_up_mixtral(), dir / "warm-up", 1);
  write_random_checkpoint(measured_mixtral(), dir / "model", 1);
  expect_one_copy(export_gguf(dir / "warm-up", dir / "warm-up.gguf", GgufWeights::kQ8_0),
                  export_gguf(dir / "model", dir / "model.gguf", GgufWeights::kQ8_0),
                  ExpertDtype::kBf16);
}

}  // namespace
}  // namespace sluice
