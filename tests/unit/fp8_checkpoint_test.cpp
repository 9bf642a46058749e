// FP8 checkpoints as DeepSeek-V3 ships them (model/fp8_weights.h): make-model writes them, the
// loader keeps the codes as they are (1 byte per weight) with their block scales, and bad ones
// fail naming the file, the tensor and what was expected.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"
#include "model/presets.h"
#include "model/quantize_checkpoint.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using testing::edit_config;
using testing::rewrite_checkpoint;

class Fp8Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override { write_random_checkpoint(preset_config("tiny-deepseek-v3"), dir(), 5); }
  fs::path dir() const { return tmp_.path(); }
  testing::TempDir tmp_;
};

constexpr const char* kUpScale = "model.layers.2.mlp.experts.3.up_proj.weight_scale_inv";
constexpr const char* kKvAScale = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv";

TEST_F(Fp8Checkpoint, LoadsCodesInPlaceWithTheirScales) {
  const Model m = load_model(dir());
  EXPECT_TRUE(m.config.fp8_weights);
  const LayerWeights& L = m.weights.layers[2];
  for (const Tensor* t : {&L.q_a, &L.q_b, &L.kv_a, &L.kv_b, &L.wo, &L.expert_gate, &L.expert_up,
                          &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down}) {
    EXPECT_EQ(t->dtype, DType::F8_E4M3);
    EXPECT_EQ(t->nbytes(), size_t(t->numel()));  // one byte per weight
    ASSERT_TRUE(t->block_scales);
  }
  // One partial 128 × 128 block per matrix of the tiny model, per expert when stacked.
  EXPECT_EQ(L.expert_up.block_scales->shape, (Shape{16, 1, 1}));
  EXPECT_EQ(L.kv_a.block_scales->shape, (Shape{1, 1}));
  EXPECT_EQ(L.expert_up.slice0(3).block_scales->shape, (Shape{1, 1}));
  // The release keeps these in bf16.
  for (const Tensor* t : {&m.weights.embed, &m.weights.lm_head, &L.router})
    EXPECT_EQ(t->dtype, DType::BF16);
  // The written checkpoint holds what make_random_model quantizes in memory: same logits.
  const Model in_memory = make_random_model(preset_config("tiny-deepseek-v3"), 5);
  const std::vector<int> tokens = {3, 17, 250, 9};
  EXPECT_EQ(ReferenceForward(m).forward(tokens), ReferenceForward(in_memory).forward(tokens));
}

TEST_F(Fp8Checkpoint, AMissingScaleIsNamed) {
  rewrite_checkpoint(dir(), [](TensorSpec& s) { return s.name != kUpScale; });
  EXPECT_ERROR_MENTIONS(load_model(dir()), "model.safetensors", kUpScale, "is missing",
                        "F32 [1, 1]", "model.layers.2.mlp.experts.3.up_proj.weight");
}

TEST_F(Fp8Checkpoint, AScaleOfTheWrongShapeIsNamed) {
  rewrite_checkpoint(dir(), [](TensorSpec& s) {
    if (s.name == kKvAScale) s.shape = {2, 1};
    return true;
  });
  EXPECT_ERROR_MENTIONS(load_model(dir()), "model.safetensors", kKvAScale, "expected F32 [1, 1]",
                        "got F32 [2, 1]", "ceil(rows/128) x ceil(cols/128)");
}

TEST_F(Fp8Checkpoint, Fp8WithoutTheQuantizationConfigIsNamed) {
  edit_config(dir(), [](nlohmann::json& j) { j.erase("quantization_config"); });
  EXPECT_ERROR_MENTIONS(load_model(dir()), "model.safetensors", "is F8_E4M3",
                        "quantization_config");
}

TEST_F(Fp8Checkpoint, Fp8WhereTheReleaseKeepsBf16IsNamed) {
  rewrite_checkpoint(dir(), [](TensorSpec& s) {
    if (s.name == "model.layers.2.mlp.gate.weight") s.dtype = DType::F8_E4M3;
    return true;
  });
  EXPECT_ERROR_MENTIONS(load_model(dir()), "model.layers.2.mlp.gate.weight", "F8_E4M3",
                        "expected BF16, F16 or F32 here");
}

// kv_a_proj_with_mqa of the real shape, 512 + 64 = 576 rows: five blocks of rows, the last
// half full, is valid and runs.
TEST(Fp8CheckpointShapes, PartialEdgeBlocksOf576RowsLoad) {
  testing::TempDir tmp;
  ModelConfig c = preset_config("tiny-deepseek-v3");
  c.num_layers = 2;
  c.mla.kv_lora_rank = 512;
  c.mla.qk_rope_head_dim = 64;
  c.head_dim = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;
  write_random_checkpoint(c, tmp.path(), 3);
  const Model m = load_model(tmp.path());
  EXPECT_EQ(m.weights.layers[0].kv_a.shape, (Shape{576, 64}));
  EXPECT_EQ(m.weights.layers[0].kv_a.block_scales->shape, (Shape{5, 1}));
  EXPECT_EQ(m.weights.layers[0].kv_b.block_scales->shape, (Shape{1, 4}));
  const std::vector<int> tokens = {5, 6, 7};
  for (float v : ReferenceForward(m).forward(tokens)) ASSERT_TRUE(std::isfinite(v));
}

// `sluice quantize` refuses FP8 checkpoints, pointing at quantizing at load, which dequantises
// the FP8 experts and quantizes them (within int8's error of the FP8 model).
TEST_F(Fp8Checkpoint, QuantizeCommandRefusesAndLoadTimeQuantizationRuns) {
  EXPECT_ERROR_MENTIONS(quantize_checkpoint(dir(), dir() / "q", ExpertDtype::kInt8, 32),
                        "quantization_config", "--expert-dtype int8");
  const Model fp8 = load_model(dir());
  Model int8 = load_model(dir());
  quantize_model_experts(int8, {ExpertDtype::kInt8, 32});
  EXPECT_EQ(int8.weights.layers[2].expert_gate.dtype, DType::U8);
  const std::vector<int> tokens = {3, 17, 250, 9};
  const std::vector<float> a = ReferenceForward(int8).forward(tokens);
  const std::vector<float> b = ReferenceForward(fp8).forward(tokens);
  EXPECT_LT(testing::relative_max_error(a, b), 0.05);
}

}  // namespace
}  // namespace sluice
