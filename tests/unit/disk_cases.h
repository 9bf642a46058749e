// The checkpoints the disk tier's tests run on, one for every kind of expert the host page pool
// reads (bf16, int8, int4, FP8, and stored transposed), and a model loaded from one with its
// routed experts left on disk. Shared by disk_tier_test (the CPU engine) and offload_disk_test
// (the offload path on the stand-in device).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/weights_in_memory.h"
#include "model/expert_quant.h"
#include "model/presets.h"
#include "model/quantize_checkpoint.h"
#include "model/synthetic.h"
#include "runtime/planner/planner.h"
#include "test_util.h"

namespace sluice::testing {

struct DiskCase {
  const char* preset;
  ExpertDtype dtype;  // bf16: the checkpoint as written (V3's FP8); else a quantized checkpoint
  int group;
};

inline std::vector<DiskCase> disk_cases() {
  return {
      {"tiny-mixtral", ExpertDtype::kBf16, 0},     {"tiny-mixtral", ExpertDtype::kInt8, 32},
      {"tiny-mixtral", ExpertDtype::kInt4, 32},    {"tiny-deepseek-v2-lite", ExpertDtype::kBf16, 0},
      {"tiny-deepseek-v3", ExpertDtype::kBf16, 0}, {"tiny-dbrx", ExpertDtype::kBf16, 0}};
}

inline std::string disk_case_name(const ::testing::TestParamInfo<DiskCase>& info) {
  const DiskCase& p = info.param;
  const bool fp8 = preset_config(p.preset).fp8_weights;
  return test_name(std::string(p.preset) + "_" +
                   std::string(fp8 ? "fp8" : expert_dtype_name(p.dtype)));
}

// The case's checkpoint in `dir`: the preset's random weights, quantized when the case asks.
inline std::filesystem::path write_checkpoint(const DiskCase& p, const TempDir& dir,
                                              uint64_t seed) {
  write_random_checkpoint(preset_config(p.preset), dir / "bf16", seed);
  if (p.dtype == ExpertDtype::kBf16) return dir / "bf16";
  quantize_checkpoint(dir / "bf16", dir / "q", p.dtype, p.group);
  return dir / "q";
}

// The model at `dir` loaded with a budget one byte short of its weights: the routed experts stay
// on disk (the resident part and a small pool fit).
inline Model load_with_experts_on_disk(const std::filesystem::path& dir) {
  const size_t weights = model_weight_bytes(load_model_config(dir));
  return load_model_for_run(dir, {}, {weights - 1, "a test's budget"});
}

// The case's checkpoint in a temporary folder, loaded twice: whole, and with its routed experts
// on disk (the run of one should give the numbers of the other).
struct CheckpointTwice {
  CheckpointTwice(const DiskCase& p, uint64_t seed)
      : path(write_checkpoint(p, dir, seed)),
        in_memory(load_model(path)),
        on_disk(load_with_experts_on_disk(path)) {}
  TempDir dir;
  std::filesystem::path path;
  Model in_memory, on_disk;
};

}  // namespace sluice::testing
