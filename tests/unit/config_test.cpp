#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/presets.h"
#include "test_util.h"

namespace sluice {
namespace {

using nlohmann::json;

json mixtral_8x7b_config() {
  // The published config.json of Mixtral-8x7B-v0.1.
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

TEST(Config, ReadsMixtral8x7B) {
  ModelConfig c = parse_config(mixtral_8x7b_config(), "config.json");
  EXPECT_EQ(c.family, Family::Mixtral);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.experts_per_token, 2);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c.dtype, DType::BF16);
}

TEST(Config, PresetRoundTripsThroughJson) {
  ModelConfig p = preset_config("mixtral-8x22b");
  ModelConfig c = parse_config(config_to_json(p), "config.json");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_layers, 56);
  EXPECT_EQ(c.expert_intermediate_size, 16384);
  EXPECT_EQ(c.num_heads, 48);
  EXPECT_EQ(c.head_dim, 128);
}

TEST(Config, ReadsRopeThetaFromRopeParameters) {
  json j = mixtral_8x7b_config();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_FLOAT_EQ(parse_config(j, "config.json").rope_theta, 5e5f);
}

struct BadConfig {
  const char* what;
  std::function<void(json&)> edit;
  std::vector<const char*> mentions;
};

class ConfigBadInput : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigBadInput, GivesAClearError) {
  json j = mixtral_8x7b_config();
  GetParam().edit(j);
  try {
    parse_config(j, "dir/config.json");
    ADD_FAILURE() << "no error for " << GetParam().what;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("dir/config.json"), std::string::npos) << msg;
    for (const char* part : GetParam().mentions)
      EXPECT_NE(msg.find(part), std::string::npos) << msg << " lacks " << part;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigBadInput,
    ::testing::Values(
        BadConfig{"unsupported_architecture",
                  [](json& j) {
                    j["architectures"] = {"GPT2LMHeadModel"};
                    j["model_type"] = "gpt2";
                  },
                  {"unsupported architecture 'GPT2LMHeadModel'", "MixtralForCausalLM"}},
        BadConfig{
            "missing_field", [](json& j) { j.erase("hidden_size"); }, {"'hidden_size'", "missing"}},
        BadConfig{"wrong_type",
                  [](json& j) { j["num_hidden_layers"] = "32"; },
                  {"'num_hidden_layers'", "positive integer", "\"32\""}},
        BadConfig{
            "zero", [](json& j) { j["vocab_size"] = 0; }, {"'vocab_size'", "positive integer"}},
        BadConfig{"heads_not_multiple",
                  [](json& j) { j["num_key_value_heads"] = 5; },
                  {"'num_attention_heads'", "'num_key_value_heads'"}},
        BadConfig{"topk_too_large",
                  [](json& j) { j["num_experts_per_tok"] = 9; },
                  {"'num_experts_per_tok'", "exceeds"}},
        BadConfig{"rope_scaling",
                  [](json& j) {
                    j["rope_scaling"] = {{"rope_type", "yarn"}};
                  },
                  {"'rope_scaling'", "yarn"}},
        BadConfig{
            "activation", [](json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "silu"}},
        BadConfig{"dtype", [](json& j) { j["torch_dtype"] = "int8"; }, {"'torch_dtype'", "int8"}},
        BadConfig{"not_an_object", [](json& j) { j = json::array(); }, {"JSON object"}}),
    [](const auto& param_info) { return std::string(param_info.param.what); });

TEST(Config, MalformedFileNamesThePath) {
  testing::TempDir dir;
  testing::write_file(dir / "config.json", "{\"vocab_size\": 3,");
  EXPECT_ERROR_MENTIONS(load_config(dir / "config.json"), "config.json", "not valid JSON");
}

}  // namespace
}  // namespace sluice
