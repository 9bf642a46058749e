// `sluice quantize` and quantized checkpoints: the written folder loads with no bf16 pass and
// gives the very logits of quantizing at load; bad quantized checkpoints and options fail with
// errors naming the file, the tensor or field, and what was expected.
#include "model/quantize_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "io/safetensors.h"
#include "model/expert_quant.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using testing::edit_config;
using testing::rewrite_checkpoint;
using testing::TempDir;

// Every sampled logit row of the engine on the shared test workload, in request order.
std::vector<float> engine_logits(const Model& m) {
  BatchEngine engine(m, testing::exercising_policy(Precision::kBf16, 4));
  std::map<std::pair<int64_t, int>, std::vector<float>> rows;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    rows[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  std::vector<Request> requests = testing::prompt_length_requests(m.config.vocab_size, 4);
  engine.run(requests, [](Completion&&) {});
  std::vector<float> all;
  for (auto& [key, row] : rows) all.insert(all.end(), row.begin(), row.end());
  return all;
}

struct CheckpointCase {
  const char* preset;
  ExpertDtype dtype;
  int group;
};

class QuantizedCheckpoint : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(QuantizedCheckpoint, GivesTheLogitsOfQuantizingAtLoadBitForBit) {
  const CheckpointCase& p = GetParam();
  TempDir dir;
  write_random_checkpoint(preset_config(p.preset), dir / "bf16", 7);
  const QuantizeStats s = quantize_checkpoint(dir / "bf16", dir / "q", p.dtype, p.group);
  EXPECT_GT(s.matrices, 0);
  EXPECT_LT(s.bytes_out, s.bytes_in);
  EXPECT_TRUE(fs::exists(dir / "q" / "tokenizer.json"));

  Model at_load = load_model(dir / "bf16");
  quantize_model_experts(at_load, {p.dtype, p.group});
  const Model from_file = load_model(dir / "q");
  ASSERT_EQ(from_file.config.expert_quant.dtype, p.dtype);
  ASSERT_EQ(from_file.config.expert_quant.group_size, p.group);
  // The packed bytes are the same, matrix by matrix...
  for (size_t l = 0; l < at_load.weights.layers.size(); ++l) {
    const LayerWeights &a = at_load.weights.layers[l], &b = from_file.weights.layers[l];
    for (auto [x, y] : {std::pair{&a.expert_gate, &b.expert_gate},
                        {&a.expert_down, &b.expert_down},
                        {&a.mlp_up, &b.mlp_up}}) {
      ASSERT_EQ(x->empty(), y->empty());
      if (x->empty()) continue;
      ASSERT_EQ(x->dtype, DType::U8);
      ASSERT_EQ(x->nbytes(), y->nbytes());
      EXPECT_EQ(std::memcmp(x->data, y->data, x->nbytes()), 0) << "layer " << l;
    }
  }
  // ...so the logits are too.
  const auto a = engine_logits(at_load), b = engine_logits(from_file);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // And they are not the bf16 model's.
  EXPECT_NE(engine_logits(load_model(dir / "bf16")), a);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, QuantizedCheckpoint,
                         ::testing::Values(CheckpointCase{"tiny-mixtral", ExpertDtype::kInt8, 32},
                                           CheckpointCase{"tiny-mixtral", ExpertDtype::kInt4, 16},
                                           CheckpointCase{"tiny-qwen2-moe", ExpertDtype::kInt4, 8}),
                         [](const auto& case_info) {
                           return testing::preset_dtype_name(case_info.param.preset,
                                                             case_info.param.dtype);
                         });

class QuantizedCheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    write_random_checkpoint(preset_config("tiny-mixtral"), dir_ / "bf16", 7);
    quantize_checkpoint(dir_ / "bf16", dir_ / "q", ExpertDtype::kInt8, 32);
  }
  fs::path q() const { return dir_ / "q"; }
  TempDir dir_;
};

constexpr const char* kScale = "model.layers.0.block_sparse_moe.experts.1.w2.weight_scale";

TEST_F(QuantizedCheckpointErrors, AMissingScaleTensorIsNamed) {
  rewrite_checkpoint(q(), [](TensorSpec& s) { return s.name != kScale; });
  EXPECT_ERROR_MENTIONS(load_model(q()), "model.safetensors", kScale, "is missing", "F32 [64, 3]",
                        "group_size = 32");
}

TEST_F(QuantizedCheckpointErrors, AScaleOfTheWrongShapeIsNamed) {
  rewrite_checkpoint(q(), [](TensorSpec& s) {
    if (s.name == kScale) s.shape = {64, 2};
    return true;
  });
  EXPECT_ERROR_MENTIONS(load_model(q()), "model.safetensors", kScale, "expected F32 [64, 3]",
                        "got F32 [64, 2]");
}

TEST_F(QuantizedCheckpointErrors, QuantizedValuesOfTheWrongDtypeAreNamed) {
  rewrite_checkpoint(q(), [](TensorSpec& s) {
    if (s.name == "model.layers.1.block_sparse_moe.experts.0.w1.weight") s.dtype = DType::U8;
    return true;
  });
  EXPECT_ERROR_MENTIONS(load_model(q()), "model.layers.1.block_sparse_moe.experts.0.w1.weight",
                        "expected I8 [96, 64]", "got U8 [96, 64]");
}

TEST_F(QuantizedCheckpointErrors, AGroupSizeThatDoesNotDivideTheRowIsNamed) {
  edit_config(q(), [](nlohmann::json& j) { j["quantization"]["group_size"] = 48; });
  EXPECT_ERROR_MENTIONS(load_model(q()), "config.json", "quantization.group_size",
                        "group size 48 does not divide the row length 64");
  EXPECT_ERROR_MENTIONS(quantize_checkpoint(dir_ / "bf16", dir_ / "q2", ExpertDtype::kInt8, 48),
                        "--expert-group", "group size 48 does not divide the row length 64");
  Model m = load_model(dir_ / "bf16");
  EXPECT_ERROR_MENTIONS(quantize_model_experts(m, {ExpertDtype::kInt4, 12}), "--expert-dtype",
                        "group size 12: expected a multiple of 8");
  // The default (128) is longer than these rows: the error says what to pass.
  EXPECT_ERROR_MENTIONS(quantize_model_experts(m, {ExpertDtype::kInt8, 0}),
                        "group size 128 does not divide the row length 64", "--expert-group");
}

TEST_F(QuantizedCheckpointErrors, AnUnsupportedExpertDtypeIsNamed) {
  edit_config(q(), [](nlohmann::json& j) { j["quantization"]["expert_dtype"] = "fp8"; });
  EXPECT_ERROR_MENTIONS(load_model(q()), "config.json", "quantization.expert_dtype",
                        "unsupported expert dtype 'fp8'", "bf16, int8 or int4");
  const auto r = testing::run_command(testing::sluice_command(
      "logits --model " + (dir_ / "bf16").string() + " --tokens 1,2 --expert-dtype int3"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--expert-dtype"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("int3"), std::string::npos) << r.output;
}

TEST_F(QuantizedCheckpointErrors, RequantizingAQuantizedCheckpointIsRefused) {
  Model m = load_model(q());
  EXPECT_ERROR_MENTIONS(quantize_model_experts(m, {ExpertDtype::kInt4, 32}), "int8",
                        "quantize the bf16 checkpoint");
  EXPECT_ERROR_MENTIONS(quantize_checkpoint(q(), dir_ / "q3", ExpertDtype::kInt4, 32),
                        "field 'quantization'", "already int8");
}

// The CLI: quantize, then `logits` on the quantized folder equals `logits --expert-dtype` on the
// bf16 one (both the reference forward with the dequantized experts).
TEST_F(QuantizedCheckpointErrors, TheQuantizeCommandWritesWhatLogitsReadsAsQuantizingAtLoad) {
  const auto made = testing::run_command(
      testing::sluice_command("quantize --model " + (dir_ / "bf16").string() + " --out " +
                              (dir_ / "cli").string() + " --expert-dtype int4 --expert-group 16"));
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_NE(made.output.find("int4 (group 16)"), std::string::npos) << made.output;
  const auto a = testing::run_command(
      testing::sluice_command("logits --model " + (dir_ / "cli").string() + " --tokens 1,5,7"),
      false);
  const auto b = testing::run_command(
      testing::sluice_command("logits --model " + (dir_ / "bf16").string() +
                              " --tokens 1,5,7 --expert-dtype int4 --expert-group 16"),
      false);
  const auto c = testing::run_command(
      testing::sluice_command("logits --model " + (dir_ / "bf16").string() + " --tokens 1,5,7"),
      false);
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
}

}  // namespace
}  // namespace sluice
