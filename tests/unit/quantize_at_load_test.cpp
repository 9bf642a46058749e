// load_model's own quantization (LoadOptions::expert_quant: each matrix quantized from the
// mapping, its pages dropped after) gives the very bytes of quantizing the loaded bf16 model
// (quantize_model_experts), whether the checkpoint stores the experts back to back or apart, dense
// MLPs and fused experts included; LoadOptions::layers keeps the first layers, quantized
// checkpoints too, and more layers than the model has is an error.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model/expert_quant.h"
#include "model/presets.h"
#include "model/quantize_checkpoint.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::TempDir;

// The expert and dense-MLP slots of a's first `layers` layers hold b's bytes.
void expect_same_expert_slots(const Model& a, const Model& b, int layers) {
  ASSERT_GE(int(a.weights.layers.size()), layers);
  ASSERT_EQ(int(b.weights.layers.size()), layers);
  for (int l = 0; l < layers; ++l) {
    const LayerWeights &x = a.weights.layers[size_t(l)], &y = b.weights.layers[size_t(l)];
    for (auto [s, t] : {std::pair{&x.expert_gate, &y.expert_gate},
                        {&x.expert_up, &y.expert_up},
                        {&x.expert_down, &y.expert_down},
                        {&x.mlp_gate, &y.mlp_gate},
                        {&x.mlp_up, &y.mlp_up},
                        {&x.mlp_down, &y.mlp_down}}) {
      ASSERT_EQ(s->empty(), t->empty()) << "layer " << l;
      if (s->empty()) continue;
      EXPECT_TRUE(testing::same_bytes(*s, *t)) << "layer " << l;
    }
  }
}

struct AtLoadCase {
  const char* preset;
  ExpertDtype dtype;
  int group;
  bool experts_apart;  // rewritten in name order: each expert's matrices lie apart
};

class QuantizeAtLoad : public ::testing::TestWithParam<AtLoadCase> {};

TEST_P(QuantizeAtLoad, GivesTheBytesOfQuantizingTheLoadedModel) {
  const AtLoadCase& p = GetParam();
  const ExpertQuant q{p.dtype, p.group};
  TempDir dir;
  write_random_checkpoint(preset_config(p.preset), dir.path(), 7);
  if (p.experts_apart) testing::rewrite_checkpoint(dir.path(), [](TensorSpec&) { return true; });
  Model after = load_model(dir.path());
  quantize_model_experts(after, q);
  ASSERT_EQ(after.weights.layers.back().expert_down.dtype, DType::U8);  // a MoE layer

  const Model at_load = load_model(dir.path(), {.expert_quant = q});
  EXPECT_EQ(at_load.config.expert_quant.dtype, p.dtype);
  EXPECT_EQ(at_load.config.expert_quant.group_size, p.group);
  expect_same_expert_slots(after, at_load, after.config.num_layers);

  const Model first = load_model(dir.path(), {.expert_quant = q, .layers = 1});
  EXPECT_EQ(first.config.num_layers, 1);
  expect_same_expert_slots(after, first, 1);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, QuantizeAtLoad,
    ::testing::Values(AtLoadCase{"tiny-mixtral", ExpertDtype::kInt8, 32, false},
                      AtLoadCase{"tiny-mixtral", ExpertDtype::kInt4, 16, true},
                      AtLoadCase{"tiny-deepseek-v2-lite", ExpertDtype::kInt8, 32, true},
                      AtLoadCase{"tiny-dbrx", ExpertDtype::kInt8, 8, false}),
    [](const auto& param_info) {
      const AtLoadCase& p = param_info.param;
      return testing::preset_dtype_name(p.preset, p.dtype, p.experts_apart ? "_apart" : "");
    });

TEST(LoadLayers, AQuantizedCheckpointKeepsItsFirstLayers) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir / "bf16", 7);
  quantize_checkpoint(dir / "bf16", dir / "q", ExpertDtype::kInt8, 32);
  const Model whole = load_model(dir / "q");
  const Model first = load_model(dir / "q", {.expert_quant = {}, .layers = 1});
  EXPECT_EQ(first.config.num_layers, 1);
  expect_same_expert_slots(whole, first, 1);
}

TEST(LoadLayers, MoreLayersThanTheModelHasIsAnError) {
  TempDir dir;
  const ModelConfig c = preset_config("tiny-mixtral");
  write_random_checkpoint(c, dir.path(), 7);
  const std::string asked = std::to_string(c.num_layers + 1) + " layers asked",
                    has = "the model has " + std::to_string(c.num_layers);
  EXPECT_ERROR_MENTIONS(load_model(dir.path(), {.expert_quant = {}, .layers = c.num_layers + 1}),
                        dir.path().c_str(), asked.c_str(), has.c_str());
}

}  // namespace
}  // namespace sluice
