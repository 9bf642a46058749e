#include "model/presets.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/family.h"

namespace sluice {

namespace {

// The shape every family shares; bos and eos are the ids of the family's synthetic tokenizer
// (make-model writes it, with the specials first).
struct Shape {
  int vocab, hidden, layers, heads, kv_heads, head_dim, max_positions;
  float rope_theta, rms_norm_eps;
};

ModelConfig base(Family f, const Shape& s) {
  ModelConfig c;
  const FamilySpec& spec = family_spec(f);
  c.family = f;
  c.architecture = spec.architecture;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = s.max_positions;
  c.rope_theta = s.rope_theta;
  c.rms_norm_eps = s.rms_norm_eps;
  c.bos_token_id = spec.tokenizer.bos;
  c.eos_token_ids = {spec.tokenizer.eos};
  c.dtype = DType::BF16;
  return c;
}

ModelConfig mixtral(int vocab, int hidden, int intermediate, int layers, int heads, int kv_heads,
                    int experts, int top_k, int max_positions) {
  ModelConfig c = base(Family::Mixtral, {vocab, hidden, layers, heads, kv_heads, hidden / heads,
                                         max_positions, 1e6f, 1e-5f});
  c.expert_intermediate_size = intermediate;
  c.num_experts = experts;
  c.experts_per_token = top_k;
  c.normalize_topk = true;
  return c;
}

// Qwen3-MoE: per-head q/k RMSNorm, head_dim 128 whatever the hidden size, top-8 of 128 experts
// renormalised (norm_topk_prob), no shared expert, every layer MoE.
ModelConfig qwen3_moe(const Shape& s, int moe_intermediate, int dense_intermediate, int experts,
                      int top_k) {
  ModelConfig c = base(Family::Qwen3Moe, s);
  c.qk_norm = QkNorm::kPerHead;
  c.expert_intermediate_size = moe_intermediate;
  c.dense_intermediate_size = dense_intermediate;
  c.num_experts = experts;
  c.experts_per_token = top_k;
  c.normalize_topk = true;
  return c;
}

// OLMoE: q/k RMSNorm over the whole projection, top-8 of 64 experts without renormalisation.
ModelConfig olmoe(const Shape& s, int intermediate, int experts, int top_k) {
  ModelConfig c = base(Family::Olmoe, s);
  c.qk_norm = QkNorm::kFullWidth;
  c.expert_intermediate_size = intermediate;
  c.num_experts = experts;
  c.experts_per_token = top_k;
  c.normalize_topk = false;
  return c;
}

// Qwen2-MoE: q/k/v biases, a sigmoid-gated shared expert beside top-k routing without
// renormalisation, every layer MoE.
ModelConfig qwen2_moe(const Shape& s, int moe_intermediate, int shared_intermediate,
                      int dense_intermediate, int experts, int top_k) {
  ModelConfig c = base(Family::Qwen2Moe, s);
  c.qkv_bias = true;
  c.expert_intermediate_size = moe_intermediate;
  c.shared_expert_intermediate_size = shared_intermediate;
  c.shared_expert_gate = true;
  c.dense_intermediate_size = dense_intermediate;
  c.num_experts = experts;
  c.experts_per_token = top_k;
  c.normalize_topk = false;
  return c;
}

// DBRX: LayerNorm without bias, a fused Wqkv clamped to ±clip_qkv, top-k of E experts
// renormalised (moe_normalize_expert_weights 1), head_dim = hidden / heads.
ModelConfig dbrx(const Shape& s, int ffn, int experts, int top_k, float clip_qkv) {
  ModelConfig c = base(Family::Dbrx, s);
  c.norm = NormKind::kLayerNorm;
  c.clip_qkv = clip_qkv;
  c.expert_intermediate_size = ffn;
  c.num_experts = experts;
  c.experts_per_token = top_k;
  c.normalize_topk = true;
  return c;
}

// DeepSeek's MLA shape and routing, shared by V2-Lite, V2 and V3.
struct DeepseekShape {
  LatentAttentionShape mla;
  int dense_intermediate, moe_intermediate, shared_experts, experts, top_k, first_dense;
  int groups, groups_per_token;
  float routed_scaling;
};

// YaRN as the released configs have it: factor 40 over an original 4096 positions.
RopeScaling deepseek_yarn(float factor, int original, float mscale) {
  RopeScaling y;
  y.kind = RopeScalingKind::kYarn;
  y.factor = factor;
  y.original_max_position_embeddings = original;
  y.beta_fast = 32.f;
  y.beta_slow = 1.f;
  y.mscale = y.mscale_all_dim = mscale;
  return y;
}

ModelConfig deepseek(Family f, const Shape& s, const DeepseekShape& d, const RopeScaling& yarn) {
  ModelConfig c = base(f, s);
  c.attention = AttentionKind::kLatent;
  c.mla = d.mla;
  c.head_dim = d.mla.qk_nope_head_dim + d.mla.qk_rope_head_dim;
  c.rope_scaling = yarn;
  c.rope_interleaved = true;
  c.dense_intermediate_size = d.dense_intermediate;
  c.expert_intermediate_size = d.moe_intermediate;
  c.shared_expert_intermediate_size = d.shared_experts * d.moe_intermediate;
  c.num_experts = d.experts;
  c.experts_per_token = d.top_k;
  for (int l = 0; l < std::min(d.first_dense, s.layers); ++l) c.dense_layers.push_back(l);
  c.expert_groups = d.groups;
  c.groups_per_token = d.groups_per_token;
  c.routed_scaling_factor = d.routed_scaling;
  const bool v3 = f == Family::DeepseekV3;
  c.router_score = v3 ? RouterScore::kSigmoid : RouterScore::kSoftmax;
  c.group_score = v3 ? GroupScore::kTopTwoSum : GroupScore::kMax;
  c.router_selection_bias = v3;
  c.normalize_topk = v3;
  c.mtp_layers = v3 ? 1 : 0;
  c.fp8_weights = v3;  // the V3 and R1 releases: FP8 projections with 128 x 128 block scales
  return c;
}

struct Preset {
  const char* name;
  ModelConfig config;
};

const std::vector<Preset>& presets() {
  // Shapes from the published config.json of each model.
  static const std::vector<Preset> all = {
      {"mixtral-8x7b", mixtral(32000, 4096, 14336, 32, 32, 8, 8, 2, 32768)},
      {"mixtral-8x22b", mixtral(32000, 6144, 16384, 56, 48, 8, 8, 2, 65536)},
      {"qwen3-30b-a3b",
       qwen3_moe({151936, 2048, 48, 32, 4, 128, 40960, 1e6f, 1e-6f}, 768, 6144, 128, 8)},
      {"qwen3-235b-a22b",
       qwen3_moe({151936, 4096, 94, 64, 4, 128, 40960, 1e6f, 1e-6f}, 1536, 12288, 128, 8)},
      {"olmoe-1b-7b", olmoe({50304, 2048, 16, 16, 16, 128, 4096, 10000.f, 1e-5f}, 1024, 64, 8)},
      {"qwen1.5-moe-a2.7b",
       qwen2_moe({151936, 2048, 24, 16, 16, 128, 8192, 1e6f, 1e-6f}, 1408, 5632, 5632, 60, 4)},
      {"qwen2-57b-a14b",
       qwen2_moe({151936, 3584, 28, 28, 4, 128, 32768, 1e6f, 1e-6f}, 2560, 20480, 18944, 64, 8)},
      {"dbrx", dbrx({100352, 6144, 40, 48, 8, 128, 32768, 500000.f, 1e-5f}, 10752, 16, 4, 8.f)},
      {"deepseek-v2-lite",
       deepseek(Family::DeepseekV2, {102400, 2048, 27, 16, 16, 192, 163840, 10000.f, 1e-6f},
                {{0, 512, 128, 64, 128}, 10944, 1408, 2, 64, 6, 1, 1, 1, 1.f},
                deepseek_yarn(40.f, 4096, 0.707f))},
      {"deepseek-v2",
       deepseek(Family::DeepseekV2, {102400, 5120, 60, 128, 128, 192, 163840, 10000.f, 1e-6f},
                {{1536, 512, 128, 64, 128}, 12288, 1536, 2, 160, 6, 1, 8, 3, 16.f},
                deepseek_yarn(40.f, 4096, 0.707f))},
      {"deepseek-v3",
       deepseek(Family::DeepseekV3, {129280, 7168, 61, 128, 128, 192, 163840, 10000.f, 1e-6f},
                {{1536, 512, 128, 64, 128}, 18432, 2048, 1, 256, 8, 3, 8, 4, 2.5f},
                deepseek_yarn(40.f, 4096, 1.f))},
      // Small enough for unit tests, with every dimension distinct so layout bugs show.
      {"tiny-mixtral", mixtral(384, 64, 96, 2, 4, 2, 8, 2, 4096)},
      // heads·head_dim (4·24 = 96) unrelated to the hidden size, as in Qwen3.
      {"tiny-qwen3-moe", qwen3_moe({384, 64, 2, 4, 2, 24, 4096, 1e6f, 1e-6f}, 40, 80, 8, 3)},
      // Grouped KV heads (the published OLMoE has one per query head) to exercise k_norm's width.
      {"tiny-olmoe", olmoe({384, 64, 2, 4, 2, 16, 4096, 10000.f, 1e-5f}, 48, 8, 3)},
      {"tiny-qwen2-moe", qwen2_moe({384, 64, 2, 4, 2, 16, 4096, 1e6f, 1e-6f}, 32, 72, 88, 8, 4)},
      // head_dim = 64 / 4; the fused Wqkv is 64 + 2·2·16 = 128 rows; clip 1.5 clamps a share of
      // q/k/v; top-3 of 7 experts of 40.
      {"tiny-dbrx", dbrx({384, 64, 2, 4, 2, 16, 4096, 500000.f, 1e-5f}, 40, 7, 3, 1.5f)},
      // MLA with latent 24, no-RoPE 12, RoPE 8 and v 10 per head; one dense layer first.
      {"tiny-deepseek-v2-lite",
       deepseek(Family::DeepseekV2, {384, 64, 3, 4, 4, 20, 4096, 10000.f, 1e-6f},
                {{0, 24, 12, 8, 10}, 96, 32, 2, 8, 3, 1, 1, 1, 1.f},
                deepseek_yarn(4.f, 256, 0.707f))},
      {"tiny-deepseek-v2",
       deepseek(Family::DeepseekV2, {384, 64, 3, 4, 4, 20, 4096, 10000.f, 1e-6f},
                {{40, 24, 12, 8, 10}, 96, 32, 2, 12, 3, 1, 4, 2, 16.f},
                deepseek_yarn(4.f, 256, 0.707f))},
      {"tiny-deepseek-v3",
       deepseek(Family::DeepseekV3, {384, 64, 4, 4, 4, 20, 4096, 10000.f, 1e-6f},
                {{40, 24, 12, 8, 10}, 96, 32, 1, 16, 4, 2, 4, 2, 2.5f},
                deepseek_yarn(4.f, 256, 1.f))},
  };
  return all;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

ModelConfig preset_config(const std::string& name, int layers) {
  for (const auto& p : presets()) {
    if (name != p.name) continue;
    ModelConfig c = p.config;
    if (layers < 0 || layers > c.num_layers)
      fail("--layers {}: preset '{}' has {} layers", layers, name, c.num_layers);
    if (layers > 0) c.num_layers = layers;
    // The dense prefix stays; dense layers past the cut go with it.
    std::erase_if(c.dense_layers, [&](int l) { return l >= c.num_layers; });
    return c;
  }
  fail("unknown preset '{}'; available: {}", name, fmt::join(preset_names(), ", "));
}

}  // namespace sluice
