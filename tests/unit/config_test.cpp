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

json qwen3_30b_a3b_config() {
  // The published config.json of Qwen3-30B-A3B.
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(Config, ReadsQwen3_30B_A3B) {
  ModelConfig c = parse_config(qwen3_30b_a3b_config(), "config.json");
  EXPECT_EQ(c.family, Family::Qwen3Moe);
  EXPECT_EQ(c.head_dim, 128);  // not hidden_size / heads = 64
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 512);
  EXPECT_EQ(c.expert_intermediate_size, 768);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_TRUE(c.normalize_topk);
  EXPECT_EQ(c.qk_norm, QkNorm::kPerHead);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151645});
  for (int l = 0; l < c.num_layers; ++l) EXPECT_TRUE(c.is_moe_layer(l));
  EXPECT_EQ(c.dense_mlp_size(0), 0);
}

// The class defaults of Qwen3MoeConfig for absent fields, and Qwen's dense-layer rule.
TEST(Config, Qwen3MoeDefaultsAndDenseLayers) {
  json j = qwen3_30b_a3b_config();
  for (const char* key : {"norm_topk_prob", "num_key_value_heads", "rms_norm_eps", "rope_theta"})
    j.erase(key);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {5};
  j["use_sliding_window"] = true;
  j["sliding_window"] = 1024;
  j["attention_bias"] = true;
  ModelConfig c = parse_config(j, "config.json");
  EXPECT_FALSE(c.normalize_topk);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.f);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
  // Layer l is MoE iff l is not in mlp_only_layers and (l + 1) % 2 == 0.
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(4));
  EXPECT_FALSE(c.is_moe_layer(5));
  EXPECT_TRUE(c.is_moe_layer(7));
  EXPECT_EQ(c.dense_mlp_size(0), 6144);
  // config.json as make-model writes it reads back the same.
  ModelConfig back = parse_config(config_to_json(c), "config.json");
  EXPECT_EQ(back.dense_layers, c.dense_layers);
  EXPECT_EQ(back.sliding_window, 1024);
  EXPECT_EQ(back.normalize_topk, false);
  EXPECT_TRUE(back.qkv_bias && back.o_bias);
}

TEST(Config, Qwen3MoeBadFieldsAreNamed) {
  json j = qwen3_30b_a3b_config();
  j["mlp_only_layers"] = {3, 48};
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "dir/config.json", "'mlp_only_layers'",
                        "48");
  j = qwen3_30b_a3b_config();
  j.erase("moe_intermediate_size");
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'moe_intermediate_size'", "missing");
  j = qwen3_30b_a3b_config();
  j["norm_topk_prob"] = "yes";
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'norm_topk_prob'", "true or false");
}

json olmoe_1b_7b_config() {
  // The published config.json of OLMoE-1B-7B-0924.
  return json::parse(R"({
    "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": null, "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 1024,
    "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": false,
    "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 16, "num_key_value_heads": 16, "output_router_logits": false,
    "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 50304})");
}

TEST(Config, ReadsOlmoe1B7B) {
  ModelConfig c = parse_config(olmoe_1b_7b_config(), "config.json");
  EXPECT_EQ(c.family, Family::Olmoe);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.expert_intermediate_size, 1024);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_FALSE(c.normalize_topk);
  EXPECT_EQ(c.qk_norm, QkNorm::kFullWidth);
  EXPECT_EQ(c.q_norm_size(), 2048);
  EXPECT_EQ(c.k_norm_size(), 2048);
  EXPECT_EQ(c.clip_qkv, 0.f);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{50279});
}

TEST(Config, OlmoeDefaultsClipAndHeadDim) {
  json j = olmoe_1b_7b_config();
  j.erase("num_key_value_heads");
  j.erase("norm_topk_prob");
  j["clip_qkv"] = 8.0;
  j["num_key_value_heads"] = nullptr;
  ModelConfig c = parse_config(j, "config.json");
  EXPECT_EQ(c.num_kv_heads, 16);
  EXPECT_FLOAT_EQ(c.clip_qkv, 8.f);
  EXPECT_FALSE(c.normalize_topk);
  j.erase("num_key_value_heads");
  EXPECT_EQ(parse_config(j, "config.json").num_kv_heads, 16);  // absent: one per query head
  // OlmoeAttention takes head_dim = hidden_size / heads: a file saying otherwise is refused.
  j["head_dim"] = 64;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "dir/config.json", "'head_dim'", "128",
                        "64");
  j.erase("head_dim");
  j["clip_qkv"] = -1;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'clip_qkv'", "positive");
  j["clip_qkv"] = 8.0;
  ModelConfig back = parse_config(config_to_json(parse_config(j, "config.json")), "config.json");
  EXPECT_FLOAT_EQ(back.clip_qkv, 8.f);
}

json qwen15_moe_a27b_config() {
  // The published config.json of Qwen1.5-MoE-A2.7B.
  return json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.39.0.dev0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

TEST(Config, ReadsQwen15MoeA27B) {
  ModelConfig c = parse_config(qwen15_moe_a27b_config(), "config.json");
  EXPECT_EQ(c.family, Family::Qwen2Moe);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.qkv_bias);  // qkv_bias absent: Qwen2MoeConfig's default
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_EQ(c.expert_intermediate_size, 1408);
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_FALSE(c.normalize_topk);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(c.shared_expert_gate);
  EXPECT_EQ(c.dense_mlp_size(0), 5632);  // the shared expert
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.dense_layers.empty());
}

TEST(Config, Qwen2MoeBadFieldsAreNamed) {
  json j = qwen15_moe_a27b_config();
  j["use_sliding_window"] = true;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "dir/config.json",
                        "'use_sliding_window'", "not supported");
  j = qwen15_moe_a27b_config();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'layer_types'", "sliding_attention");
  j = qwen15_moe_a27b_config();
  j.erase("shared_expert_intermediate_size");
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'shared_expert_intermediate_size'",
                        "missing");
}

// dbrx-instruct's config.json: attention and FFN fields nested, no norm eps, no
// moe_normalize_expert_weights (DbrxFFNConfig's default 1).
json dbrx_instruct_config() {
  return json::parse(R"({
    "architectures": ["DbrxForCausalLM"],
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "model_type": "", "rope_theta": 500000},
    "d_model": 6144, "emb_pdrop": 0.0,
    "ffn_config": {"ffn_hidden_size": 10752, "model_type": "", "moe_jitter_eps": 0.01,
                   "moe_loss_weight": 0.05, "moe_num_experts": 16, "moe_top_k": 4},
    "initializer_range": 0.02, "max_seq_len": 32768, "model_type": "dbrx", "n_heads": 48,
    "n_layers": 40, "output_router_logits": false, "resid_pdrop": 0.0,
    "router_aux_loss_coef": 0.05, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.38.2", "use_cache": true, "vocab_size": 100352})");
}

TEST(Config, ReadsDbrxInstruct) {
  ModelConfig c = parse_config(dbrx_instruct_config(), "config.json");
  EXPECT_EQ(c.family, Family::Dbrx);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.num_heads, 48);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 500000.f);
  EXPECT_EQ(c.clip_qkv, 8.f);
  EXPECT_EQ(c.norm, NormKind::kLayerNorm);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);  // nn.LayerNorm's default
  EXPECT_EQ(c.expert_intermediate_size, 10752);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_TRUE(c.normalize_topk);  // p = 1: the sum
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.vocab_size, 100352);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  const ModelConfig preset = preset_config("dbrx");
  EXPECT_EQ(preset.hidden_size, c.hidden_size);
  EXPECT_EQ(preset.expert_intermediate_size, c.expert_intermediate_size);
  EXPECT_EQ(preset.clip_qkv, c.clip_qkv);
}

TEST(Config, DbrxDefaultsAndBadFieldsAreNamed) {
  json j = dbrx_instruct_config();
  j.erase("attn_config");
  j["ffn_config"]["moe_normalize_expert_weights"] = nullptr;
  ModelConfig c = parse_config(j, "config.json");
  EXPECT_EQ(c.num_kv_heads, 1);  // DbrxAttentionConfig's defaults
  EXPECT_EQ(c.rope_theta, 10000.f);
  EXPECT_EQ(c.clip_qkv, 0.f);
  EXPECT_FALSE(c.normalize_topk);  // null: no renormalisation
  j = dbrx_instruct_config();
  j["ffn_config"]["moe_normalize_expert_weights"] = 2.0;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "dir/config.json",
                        "'ffn_config.moe_normalize_expert_weights'", "p = 1");
  j = dbrx_instruct_config();
  j["attn_config"]["kv_n_heads"] = 7;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'attn_config.kv_n_heads'", "48");
  j = dbrx_instruct_config();
  j["attn_config"]["clip_qkv"] = -1;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'attn_config.clip_qkv'", "positive");
  j = dbrx_instruct_config();
  j["ffn_config"]["ffn_act_fn"] = {{"name", "gelu"}};
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'ffn_config.ffn_act_fn'", "silu");
}

TEST(Config, EveryPresetRoundTripsThroughJson) {
  for (const std::string& name : preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig p = preset_config(name);
    const ModelConfig c = parse_config(config_to_json(p), "config.json");
    EXPECT_EQ(c.family, p.family);
    EXPECT_EQ(c.hidden_size, p.hidden_size);
    EXPECT_EQ(c.head_dim, p.head_dim);
    EXPECT_EQ(c.num_kv_heads, p.num_kv_heads);
    EXPECT_EQ(c.expert_intermediate_size, p.expert_intermediate_size);
    EXPECT_EQ(c.num_experts, p.num_experts);
    EXPECT_EQ(c.experts_per_token, p.experts_per_token);
    EXPECT_EQ(c.normalize_topk, p.normalize_topk);
    EXPECT_EQ(c.qk_norm, p.qk_norm);
    EXPECT_EQ(c.qkv_bias, p.qkv_bias);
    EXPECT_EQ(c.o_bias, p.o_bias);
    EXPECT_EQ(c.clip_qkv, p.clip_qkv);
    EXPECT_EQ(c.norm, p.norm);
    EXPECT_EQ(c.shared_expert_intermediate_size, p.shared_expert_intermediate_size);
    EXPECT_EQ(c.shared_expert_gate, p.shared_expert_gate);
    EXPECT_EQ(c.dense_layers, p.dense_layers);
    EXPECT_EQ(c.bos_token_id, p.bos_token_id);
    EXPECT_EQ(c.eos_token_ids, p.eos_token_ids);
    EXPECT_FLOAT_EQ(c.rope_theta, p.rope_theta);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, p.rms_norm_eps);
  }
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
        BadConfig{"float_beyond_int",
                  [](json& j) { j["num_hidden_layers"] = 1e300; },
                  {"'num_hidden_layers'", "positive integer"}},
        BadConfig{"unsigned_beyond_int",
                  [](json& j) { j["vocab_size"] = 18446744073709551615ull; },
                  {"'vocab_size'", "positive integer"}},
        BadConfig{"number_beyond_float",
                  [](json& j) { j["rms_norm_eps"] = 1e300; },
                  {"'rms_norm_eps'", "finite number"}},
        BadConfig{"rope_theta_beyond_float",
                  [](json& j) { j["rope_theta"] = -1e300; },
                  {"'rope_theta'", "finite number"}},
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
