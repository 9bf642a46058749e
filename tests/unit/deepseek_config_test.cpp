// DeepSeek-V2/V3 as family descriptions: the published config.json files read into the MLA,
// routing and RoPE fields; bad fields and checkpoints refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "runtime/policy.h"
#include "runtime/sampling.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

using nlohmann::json;

json deepseek_v2_lite_config() {
  // The published config.json of DeepSeek-V2-Lite (auto_map left out).
  return json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
    "v_head_dim": 128, "vocab_size": 102400})");
}

json deepseek_v3_config() {
  // The published config.json of DeepSeek-V3 without its quantization_config (FP8 weights).
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
    "v_head_dim": 128, "vocab_size": 129280})");
}

TEST(DeepseekConfig, ReadsV2Lite) {
  ModelConfig c = parse_config(deepseek_v2_lite_config(), "config.json");
  EXPECT_EQ(c.family, Family::DeepseekV2);
  EXPECT_EQ(c.attention, AttentionKind::kLatent);
  EXPECT_EQ(c.mla.q_lora_rank, 0);  // null: q_proj
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.attn_out_dim(), 16 * 128);
  EXPECT_EQ(c.kv_cache_values_per_token(), 576);
  EXPECT_EQ(c.dense_layers, std::vector<int>{0});
  EXPECT_EQ(c.shared_expert_intermediate_size, 2 * 1408);
  EXPECT_FALSE(c.shared_expert_gate);
  EXPECT_EQ(c.router_score, RouterScore::kSoftmax);
  EXPECT_EQ(c.expert_groups, 1);  // greedy, whatever n_group says
  EXPECT_FALSE(c.normalize_topk);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kYarn);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 40.f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  // mscale == mscale_all_dim: cos/sin unscaled; the softmax scale times (0.0707 ln 40 + 1)².
  EXPECT_FLOAT_EQ(c.rope_attention_factor(), 1.f);
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scale(), m * m / std::sqrt(192.0), 1e-6);
  EXPECT_EQ(c.mtp_layers, 0);
}

TEST(DeepseekConfig, ReadsV3) {
  ModelConfig c = parse_config(deepseek_v3_config(), "config.json");
  EXPECT_EQ(c.family, Family::DeepseekV3);
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.dense_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.router_score, RouterScore::kSigmoid);
  EXPECT_EQ(c.group_score, GroupScore::kTopTwoSum);
  EXPECT_EQ(c.expert_groups, 8);
  EXPECT_EQ(c.groups_per_token, 4);
  EXPECT_TRUE(c.router_selection_bias);
  EXPECT_TRUE(c.normalize_topk);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
  EXPECT_EQ(c.mtp_layers, 1);
  EXPECT_FALSE(c.fp8_weights);
}

TEST(DeepseekConfig, ReadsV3FP8QuantizationConfig) {
  json j = deepseek_v3_config();
  // As the release's config.json has it.
  j["quantization_config"] = json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})");
  const ModelConfig c = parse_config(j, "config.json");
  EXPECT_TRUE(c.fp8_weights);
  EXPECT_EQ(config_to_json(c)["quantization_config"], j["quantization_config"]);
}

TEST(DeepseekConfig, V2GroupLimitedAndLayerFrequency) {
  json j = deepseek_v2_lite_config();
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 8;
  j["topk_group"] = 3;
  j["moe_layer_freq"] = 2;
  j["num_hidden_layers"] = 6;
  ModelConfig c = parse_config(j, "config.json");
  EXPECT_EQ(c.expert_groups, 8);
  EXPECT_EQ(c.groups_per_token, 3);
  EXPECT_EQ(c.group_score, GroupScore::kMax);
  EXPECT_EQ(c.dense_layers, (std::vector<int>{0, 1, 3, 5}));  // < 1, or odd
  const ModelConfig back = parse_config(config_to_json(c), "config.json");
  EXPECT_EQ(back.dense_layers, c.dense_layers);
  EXPECT_EQ(back.expert_groups, 8);
}

TEST(DeepseekConfig, PresetsRoundTripTheirDeepseekFields) {
  for (const char* name : {"deepseek-v2-lite", "deepseek-v2", "deepseek-v3",
                           "tiny-deepseek-v2-lite", "tiny-deepseek-v2", "tiny-deepseek-v3"}) {
    SCOPED_TRACE(name);
    const ModelConfig p = preset_config(name);
    const ModelConfig c = parse_config(config_to_json(p), "config.json");
    EXPECT_EQ(c.attention, AttentionKind::kLatent);
    EXPECT_EQ(c.mla.q_lora_rank, p.mla.q_lora_rank);
    EXPECT_EQ(c.mla.kv_lora_rank, p.mla.kv_lora_rank);
    EXPECT_EQ(c.mla.qk_nope_head_dim, p.mla.qk_nope_head_dim);
    EXPECT_EQ(c.mla.qk_rope_head_dim, p.mla.qk_rope_head_dim);
    EXPECT_EQ(c.mla.v_head_dim, p.mla.v_head_dim);
    EXPECT_EQ(c.router_score, p.router_score);
    EXPECT_EQ(c.group_score, p.group_score);
    EXPECT_EQ(c.expert_groups, p.expert_groups);
    EXPECT_EQ(c.groups_per_token, p.groups_per_token);
    EXPECT_EQ(c.router_selection_bias, p.router_selection_bias);
    EXPECT_FLOAT_EQ(c.routed_scaling_factor, p.routed_scaling_factor);
    EXPECT_EQ(c.rope_interleaved, p.rope_interleaved);
    EXPECT_EQ(c.rope_scaling.kind, p.rope_scaling.kind);
    EXPECT_FLOAT_EQ(c.rope_scaling.factor, p.rope_scaling.factor);
    EXPECT_FLOAT_EQ(c.rope_scaling.mscale_all_dim, p.rope_scaling.mscale_all_dim);
    EXPECT_EQ(c.mtp_layers, p.mtp_layers);
    EXPECT_EQ(c.dense_layers, p.dense_layers);
  }
}

TEST(DeepseekConfig, LayersKeepTheDensePrefix) {
  const ModelConfig c = preset_config("deepseek-v3", 5);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.dense_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(4));
  EXPECT_EQ(preset_config("deepseek-v3", 2).dense_layers, (std::vector<int>{0, 1}));
}

TEST(DeepseekConfig, BadFieldsAreNamed) {
  json j = deepseek_v2_lite_config();
  j["topk_method"] = "noaux_tc";
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "dir/config.json", "'topk_method'",
                        "greedy", "noaux_tc");
  j = deepseek_v3_config();
  j["topk_method"] = "group_limited_greedy";
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'topk_method'", "noaux_tc");
  j = deepseek_v3_config();
  j["scoring_func"] = "softmax";
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'scoring_func'", "sigmoid");
  j = deepseek_v2_lite_config();
  j["scoring_func"] = "sigmoid";
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'scoring_func'", "softmax");
  j = deepseek_v2_lite_config();
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 5;  // 64 experts do not split into 5
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'n_group'", "equal groups");
  j = deepseek_v3_config();
  j["topk_group"] = 9;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'topk_group'", "9");
  j = deepseek_v3_config();
  j["num_key_value_heads"] = 16;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'num_key_value_heads'", "latent");
  j = deepseek_v3_config();
  j["qk_rope_head_dim"] = 63;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'qk_rope_head_dim'", "even");
  j = deepseek_v3_config();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}};  // no block size
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"),
                        "'quantization_config.weight_block_size'", "[128, 128]");
  j["quantization_config"]["weight_block_size"] = {128, 64};
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"),
                        "'quantization_config.weight_block_size'", "[128,64]");
  j["quantization_config"]["weight_block_size"] = {128, 128};
  j["quantization_config"]["fmt"] = "e5m2";
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'quantization_config.fmt'", "e4m3");
  j["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'quantization_config.quant_method'",
                        "gptq");
  j = deepseek_v2_lite_config();
  j["norm_topk_prob"] = true;
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'norm_topk_prob'");
  j = deepseek_v2_lite_config();
  j["rope_scaling"].erase("factor");
  EXPECT_ERROR_MENTIONS(parse_config(j, "dir/config.json"), "'rope_scaling.factor'", "yarn");
}

// A checkpoint whose latent is narrower than config.json's kv_lora_rank is refused, naming the
// tensor and the fields its shape follows.
TEST(DeepseekConfig, LatentRankMismatchNamesTheFields) {
  testing::TempDir dir;
  ModelConfig c = preset_config("tiny-deepseek-v2-lite");
  write_random_checkpoint(c, dir.path(), 1);
  EXPECT_EQ(load_model(dir.path()).weights.layers[1].kv_b.shape, (Shape{4 * 22, 24}));
  c.mla.kv_lora_rank = 16;
  testing::write_file(dir.path() / "config.json", config_to_json(c).dump());
  EXPECT_ERROR_MENTIONS(load_model(dir.path()),
                        "'model.layers.0.self_attn.kv_a_proj_with_mqa.weight'",
                        "expected shape [24, 64], got [32, 64]", "kv_lora_rank");
}

// V3's multi-token-prediction layer (model.layers.<num_hidden_layers>.*) is skipped on load;
// without num_nextn_predict_layers the same tensors are an error.
TEST(DeepseekConfig, MtpLayerTensorsAreSkipped) {
  testing::TempDir dir;
  ModelConfig c = preset_config("tiny-deepseek-v3");
  c.num_layers = 5;  // layer 4 becomes the MTP layer below
  write_random_checkpoint(c, dir.path(), 1);
  c.num_layers = 4;
  c.mtp_layers = 1;
  testing::write_file(dir.path() / "config.json", config_to_json(c).dump());
  const Model m = load_model(dir.path());
  EXPECT_EQ(m.config.mtp_layers, 1);
  EXPECT_EQ(m.weights.layers.size(), 4u);
  c.mtp_layers = 0;
  testing::write_file(dir.path() / "config.json", config_to_json(c).dump());
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "unexpected tensor 'model.layers.4.");
}

// A checkpoint as written to disk and loaded (the projections F8_E4M3 with block scales, as the
// V3 release; other tensors bf16, the bias in fp32) runs through the batch engine: its greedy
// tokens are the reference forward's. YaRN and interleaved RoPE stay
// refused by name with multi-head attention, whose device RoPE is plain.
TEST(DeepseekConfig, BatchEngineRunsALoadedCheckpoint) {
  testing::TempDir dir;
  write_random_checkpoint(preset_config("tiny-deepseek-v3"), dir.path(), 1);
  const Model m = load_model(dir.path());
  constexpr int kNew = 6;
  BatchEngine engine(m, testing::exercising_policy(Precision::kF32, kNew));
  Request r;
  r.id = 0;
  r.prompt = testing::prompt_of(9, 1, m.config.vocab_size);
  r.max_new_tokens = kNew;
  std::vector<int> got;
  engine.run({r}, [&](Completion&& c) { got = c.tokens; });
  ReferenceForward ref(m, {.bf16_gemm_inputs = false, .bf16_kv_cache = true});
  std::vector<float> logits = ref.forward(r.prompt);
  std::vector<int> want;
  const size_t V = size_t(m.config.vocab_size);
  for (int i = 0; i < kNew; ++i) {
    want.push_back(argmax(std::span<const float>(logits.data() + logits.size() - V, V)));
    int one[] = {want.back()};
    logits = ref.forward(one);
  }
  EXPECT_EQ(got, want);

  ModelConfig yarn_mha = preset_config("tiny-mixtral");
  yarn_mha.rope_scaling = preset_config("tiny-deepseek-v2").rope_scaling;
  EXPECT_ERROR_MENTIONS(
      BatchEngine(make_random_model(yarn_mha, 1), testing::exercising_policy(Precision::kF32, 4)),
      "YaRN", "rope_scaling");
}

// The planner sizes MLA's cache as the latent and the RoPE key per token and layer, in bf16, and
// its weights from the MLA projections.
TEST(DeepseekConfig, PlannerUsesTheLatentKvSize) {
  const ModelConfig lite = preset_config("deepseek-v2-lite");
  EXPECT_EQ(kv_bytes_per_token(lite), size_t(27) * (512 + 64) * 2);
  const ModelConfig v3 = preset_config("deepseek-v3");
  EXPECT_EQ(kv_bytes_per_token(v3), size_t(61) * (512 + 64) * 2);
  // Absorbed attention per (query, key): 128 heads × (2·512 + 64) × 2 FLOPs.
  EXPECT_DOUBLE_EQ(v3.attention_flops_per_pair(), 2.0 * 128 * (2 * 512 + 64));
  // V3's attention projections: q_a 1536×7168, q_b 24576×1536, kv_a 576×7168, kv_b 32768×512,
  // o 7168×16384 — 187.1M per layer, as the published parameter count has them.
  EXPECT_EQ(v3.attention_weight_elements(),
            int64_t(1536) * 7168 + 24576 * 1536 + 576 * 7168 + 32768 * 512 + 7168 * 16384);
  // A tiny model's bf16 matrices as the loader holds them, against the planner's count.
  testing::TempDir dir;
  write_random_checkpoint(preset_config("tiny-deepseek-v2"), dir.path(), 1);
  const Model m = load_model(dir.path());
  const LayerWeights& L = m.weights.layers[0];
  EXPECT_EQ(L.q_a.numel() + L.q_b.numel() + L.kv_a.numel() + L.kv_b.numel() + L.wo.numel(),
            m.config.attention_weight_elements());
}

}  // namespace
}  // namespace sluice
