// DeepSeek-V2 and V2-Lite (DeepseekV2ForCausalLM) and DeepSeek-V3 and R1 (DeepseekV3ForCausalLM).
//
// Attention is multi-head latent attention (AttentionKind::kLatent): kv_a_proj_with_mqa maps x
// to a latent of kv_lora_rank values plus one RoPE key of qk_rope_head_dim shared by all heads;
// the latent goes through kv_a_layernorm and kv_b_proj into each head's no-RoPE key and its
// value. q comes from q_proj (V2-Lite: q_lora_rank null) or q_b_proj(q_a_layernorm(q_a_proj x)).
// RoPE rotates adjacent pairs (DeepSeek's complex form; V3's rope_interleave), with YaRN in the
// released configs, whose mscale_all_dim also rescales the softmax.
//
// The first first_k_dense_replace layers (and those off the moe_layer_freq rhythm) have a dense
// MLP of intermediate_size; the others route to n_routed_experts experts and add
// n_shared_experts always-on experts (one MLP of n_shared_experts × moe_intermediate_size),
// the routed weights multiplied by routed_scaling_factor.
// V2: softmax scores; topk_method greedy, or group_limited_greedy (n_group groups, each scored
// by its best expert; the top-k among the best topk_group groups).
// V3: sigmoid scores; e_score_correction_bias added for the choice only; groups scored by the
// sum of their best two; the chosen weights renormalised when norm_topk_prob.
// V3's multi-token-prediction layers (num_nextn_predict_layers) follow the decoder layers in
// the checkpoint; they are not run, and their tensors are skipped.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"
#include "model/family.h"

namespace sluice {

namespace {

// The remote modeling code's rule (transformers reads first_k_dense_replace only; they agree
// for moe_layer_freq 1, the value of every release): layer l is MoE iff
// l >= first_k_dense_replace and l % moe_layer_freq == 0.
void read_dense_layers(const ConfigReader& r, int first_k_default, ModelConfig& c) {
  const int first_k = r.count_or("first_k_dense_replace", first_k_default);
  const int freq = r.integer_or("moe_layer_freq", 1);
  c.dense_layers.clear();
  for (int l = 0; l < c.num_layers; ++l)
    if (l < first_k || l % freq != 0) c.dense_layers.push_back(l);
}

void read_latent_attention(const ConfigReader& r, ModelConfig& c) {
  c.attention = AttentionKind::kLatent;
  LatentAttentionShape& m = c.mla;
  m.q_lora_rank = r.integer_or("q_lora_rank", 1536);
  if (r.present("q_lora_rank") && !r.has("q_lora_rank")) m.q_lora_rank = 0;  // null: no q-LoRA
  m.kv_lora_rank = r.integer_or("kv_lora_rank", 512);
  m.qk_nope_head_dim = r.integer_or("qk_nope_head_dim", 128);
  m.qk_rope_head_dim = r.integer_or("qk_rope_head_dim", 64);
  m.v_head_dim = r.integer_or("v_head_dim", 128);
  if (m.qk_rope_head_dim % 2 != 0)
    r.fail_field("qk_rope_head_dim", "expected an even number for RoPE, got {}",
                 m.qk_rope_head_dim);
  c.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  // Every head reads the same latent: MLA has no KV-head grouping.
  if (c.num_kv_heads != c.num_heads)
    r.fail_field("num_key_value_heads",
                 "multi-head latent attention expands the latent to every query head; expected "
                 "{} (num_attention_heads) or null, got {}",
                 c.num_heads, c.num_kv_heads);
  if (r.boolean_or("attention_bias", false))
    r.fail_field("attention_bias",
                 "biases on q_a_proj, kv_a_proj_with_mqa and o_proj are not "
                 "supported; expected false");
  if (r.boolean_or("mlp_bias", false))
    r.fail_field("mlp_bias", "MLP biases are not supported; expected false");
}

void read_common(const ConfigReader& r, const LlamaStyleDefaults& d, int first_k_default,
                 float scaling_default, int shared_default, ModelConfig& c) {
  LlamaStyleDefaults with_yarn = d;
  with_yarn.yarn = true;
  read_llama_style(r, with_yarn, c);
  read_latent_attention(r, c);
  c.num_experts = r.integer_or("n_routed_experts", c.family == Family::DeepseekV3 ? 256 : 64);
  c.experts_per_token = c.family == Family::DeepseekV3 ? r.integer_or("num_experts_per_tok", 8)
                                                       : r.integer("num_experts_per_tok");
  c.expert_intermediate_size =
      r.integer_or("moe_intermediate_size", c.family == Family::DeepseekV3 ? 2048 : 1407);
  c.dense_intermediate_size =
      r.integer_or("intermediate_size", c.family == Family::DeepseekV3 ? 18432 : 11008);
  const int shared = r.present("n_shared_experts") && !r.has("n_shared_experts")
                         ? 0
                         : r.integer_or("n_shared_experts", shared_default);
  c.shared_expert_intermediate_size = shared * c.expert_intermediate_size;
  c.shared_expert_gate = false;
  c.routed_scaling_factor = r.number_or("routed_scaling_factor", scaling_default);
  if (!(c.routed_scaling_factor > 0))
    r.fail_field("routed_scaling_factor", "expected a positive number, got {}",
                 c.routed_scaling_factor);
  read_dense_layers(r, first_k_default, c);
  c.rope_interleaved = true;
}

// n_group and topk_group: the experts split into n_group equal groups, topk_group of them
// chosen per token, enough experts in them for the top-k.
void read_groups(const ConfigReader& r, int n_group_default, int topk_group_default,
                 ModelConfig& c) {
  c.expert_groups = r.integer_or("n_group", n_group_default);
  c.groups_per_token = r.integer_or("topk_group", topk_group_default);
  if (c.expert_groups <= 0)
    r.fail_field("n_group", "required by topk_method '{}'", r.string_or("topk_method", ""));
  if (c.groups_per_token <= 0)
    r.fail_field("topk_group", "required by topk_method '{}'", r.string_or("topk_method", ""));
  if (c.num_experts % c.expert_groups != 0)
    r.fail_field("n_group", "{} routed experts do not split into {} equal groups", c.num_experts,
                 c.expert_groups);
  if (c.groups_per_token > c.expert_groups)
    r.fail_field("topk_group", "{} groups chosen out of {} (n_group)", c.groups_per_token,
                 c.expert_groups);
  if (c.groups_per_token * (c.num_experts / c.expert_groups) < c.experts_per_token)
    r.fail_field("topk_group", "{} groups of {} experts hold fewer than the {} experts per token",
                 c.groups_per_token, c.num_experts / c.expert_groups, c.experts_per_token);
}

void read_v2(const ConfigReader& r, ModelConfig& c) {
  LlamaStyleDefaults d;  // DeepseekV2Config's class defaults
  d.num_kv_heads = 0;
  d.rms_norm_eps = 1e-6f;
  d.rope_theta = 10000.f;
  d.max_position_embeddings = 2048;
  read_common(r, d, /*first_k_default=*/0, /*scaling_default=*/1.f, /*shared_default=*/2, c);
  c.router_score = RouterScore::kSoftmax;
  const std::string scoring = r.string_or("scoring_func", "softmax");
  if (scoring != "softmax")
    r.fail_field("scoring_func", "DeepSeek-V2 scores experts by 'softmax', got '{}'", scoring);
  // transformers' DeepseekV2Moe never renormalises (the remote code does when this is true,
  // and then skips routed_scaling_factor): a true value has no single meaning, so it is refused.
  if (r.boolean_or("norm_topk_prob", false))
    r.fail_field("norm_topk_prob",
                 "DeepSeek-V2 with renormalised top-k weights is not supported; expected false");
  c.normalize_topk = false;
  const std::string method = r.string_or("topk_method", "greedy");
  if (method == "greedy") {
    c.expert_groups = c.groups_per_token = 1;
  } else if (method == "group_limited_greedy") {
    c.group_score = GroupScore::kMax;
    read_groups(r, 0, 0, c);
  } else {
    r.fail_field("topk_method",
                 "expected 'greedy' or 'group_limited_greedy' for DeepSeek-V2, got '{}'", method);
  }
}

void read_v3(const ConfigReader& r, ModelConfig& c) {
  LlamaStyleDefaults d;  // DeepseekV3Config's class defaults
  d.num_kv_heads = 128;
  d.rms_norm_eps = 1e-6f;
  d.rope_theta = 10000.f;
  d.max_position_embeddings = 4096;
  read_common(r, d, /*first_k_default=*/3, /*scaling_default=*/2.5f, /*shared_default=*/1, c);
  c.router_score = RouterScore::kSigmoid;
  const std::string scoring = r.string_or("scoring_func", "sigmoid");
  if (scoring != "sigmoid")
    r.fail_field("scoring_func", "DeepSeek-V3 scores experts by 'sigmoid', got '{}'", scoring);
  const std::string method = r.string_or("topk_method", "noaux_tc");
  if (method != "noaux_tc")
    r.fail_field("topk_method", "expected 'noaux_tc' for DeepSeek-V3, got '{}'", method);
  c.normalize_topk = r.boolean_or("norm_topk_prob", true);
  c.router_selection_bias = true;
  c.group_score = GroupScore::kTopTwoSum;
  read_groups(r, 8, 4, c);
  if (c.num_experts / c.expert_groups < 2)
    r.fail_field("n_group",
                 "groups are scored by their best two experts; {} experts in {} "
                 "groups leave fewer than two in each",
                 c.num_experts, c.expert_groups);
  c.rope_interleaved = r.boolean_or("rope_interleave", true);
  c.mtp_layers = r.count_or("num_nextn_predict_layers", 0);
}

// first_k_dense_replace and moe_layer_freq that give c.dense_layers over the model's layers.
std::pair<int, int> dense_rule(const ModelConfig& c) {
  int first_k = 0;
  while (first_k < c.num_layers && !c.is_moe_layer(first_k)) ++first_k;
  for (int freq = 1; freq <= std::max(1, c.num_layers); ++freq) {
    bool same = true;
    for (int l = 0; l < c.num_layers; ++l)
      same &= c.is_moe_layer(l) == (l >= first_k && l % freq == 0);
    if (same) return {first_k, freq};
  }
  fail("{}: dense layers {} cannot be written as first_k_dense_replace and moe_layer_freq",
       c.architecture, fmt::join(c.dense_layers, ", "));
}

void write_common(const ModelConfig& c, nlohmann::json& j) {
  write_llama_style(c, j);
  j["head_dim"] = c.mla.qk_rope_head_dim;  // as DeepseekV{2,3}Config sets it
  j["q_lora_rank"] = c.mla.q_lora_rank > 0 ? nlohmann::json(c.mla.q_lora_rank) : nullptr;
  j["kv_lora_rank"] = c.mla.kv_lora_rank;
  j["qk_nope_head_dim"] = c.mla.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
  j["v_head_dim"] = c.mla.v_head_dim;
  j["intermediate_size"] = c.dense_intermediate_size;
  j["moe_intermediate_size"] = c.expert_intermediate_size;
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = c.expert_intermediate_size > 0
                              ? c.shared_expert_intermediate_size / c.expert_intermediate_size
                              : 0;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.normalize_topk;
  const auto [first_k, freq] = dense_rule(c);
  j["first_k_dense_replace"] = first_k;
  j["moe_layer_freq"] = freq;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
}

void write_v2(const ModelConfig& c, nlohmann::json& j) {
  write_common(c, j);
  const bool grouped = c.expert_groups > 1;
  j["topk_method"] = grouped ? "group_limited_greedy" : "greedy";
  j["n_group"] = grouped ? nlohmann::json(c.expert_groups) : nullptr;
  j["topk_group"] = grouped ? nlohmann::json(c.groups_per_token) : nullptr;
  j["scoring_func"] = "softmax";
  j["aux_loss_alpha"] = 0.001;
}

void write_v3(const ModelConfig& c, nlohmann::json& j) {
  write_common(c, j);
  j["topk_method"] = "noaux_tc";
  j["n_group"] = c.expert_groups;
  j["topk_group"] = c.groups_per_token;
  j["scoring_func"] = "sigmoid";
  j["rope_interleave"] = c.rope_interleaved;
  j["num_nextn_predict_layers"] = c.mtp_layers;
}

void add_latent_attention(const ModelConfig& c, const std::string& p, LayerWeights& L,
                          TensorTable& t) {
  const int64_t H = c.hidden_size, heads = c.num_heads;
  const LatentAttentionShape& m = c.mla;
  t.add(p + "input_layernorm.weight", {H}, &L.attn_norm);
  const std::string a = p + "self_attn.";
  if (m.q_lora_rank > 0) {
    t.add(a + "q_a_proj.weight", {m.q_lora_rank, H}, &L.q_a);
    t.tensors.back().shape_from = "q_lora_rank, hidden_size";
    t.add(a + "q_a_layernorm.weight", {m.q_lora_rank}, &L.q_a_norm);
    t.tensors.back().shape_from = "q_lora_rank";
    t.add(a + "q_b_proj.weight", {heads * c.head_dim, m.q_lora_rank}, &L.q_b);
    t.tensors.back().shape_from =
        "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank";
  } else {
    t.add(a + "q_proj.weight", {heads * c.head_dim, H}, &L.wq);
  }
  t.add(a + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, H}, &L.kv_a);
  t.tensors.back().shape_from = "kv_lora_rank + qk_rope_head_dim, hidden_size";
  t.add(a + "kv_a_layernorm.weight", {m.kv_lora_rank}, &L.kv_a_norm);
  t.tensors.back().shape_from = "kv_lora_rank";
  t.add(a + "kv_b_proj.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
        &L.kv_b);
  t.tensors.back().shape_from =
      "num_attention_heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank";
  t.add(a + "o_proj.weight", {H, heads * m.v_head_dim}, &L.wo);
  t.add(p + "post_attention_layernorm.weight", {H}, &L.ffn_norm);
}

TensorTable table(const ModelConfig& c, ModelWeights& w) {
  TensorTable t;
  add_llama_embedding(c, w, t);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& L = w.layers[size_t(l)];
    add_latent_attention(c, p, L, t);
    if (!c.is_moe_layer(l)) {
      add_dense_mlp(c, p + "mlp.", c.dense_intermediate_size, L, t);
      continue;
    }
    add_experts(c, p + "mlp.", {"gate", "gate_proj", "up_proj", "down_proj"}, L, t);
    if (c.router_selection_bias)
      t.add(p + "mlp.gate.e_score_correction_bias", {c.num_experts}, &L.router_bias);
    if (c.shared_expert_intermediate_size > 0)
      add_dense_mlp(c, p + "mlp.shared_experts.", c.shared_expert_intermediate_size, L, t);
  }
  add_llama_head(c, w, t);
  // The multi-token-prediction layers, numbered after the decoder layers: not run.
  for (int i = 0; i < c.mtp_layers; ++i)
    t.ignored_prefixes.push_back(fmt::format("model.layers.{}.", c.num_layers + i));
  return t;
}

// DeepSeek-V2-Chat's template: "User: ...\n\nAssistant: ...<eos>".
constexpr const char* kV2ChatTemplate =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'Assistant:' }}{% endif %}";

// DeepSeek-V3's template without its tool-calling parts: system prompts first, then
// <｜User｜>... and <｜Assistant｜>...<｜end▁of▁sentence｜> (an R1 reply's thinking dropped).
constexpr const char* kV3ChatTemplate =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% set ns = namespace(system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
    "{% set ns.is_first_sp = false %}{%- else %}"
    "{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}"
    "{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}"
    "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}";

const TokenizerStyle& v2_tokenizer_style() {
  static const TokenizerStyle style{{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
                                    0,
                                    1,
                                    -1,
                                    true,
                                    nullptr,
                                    false,
                                    kV2ChatTemplate};
  return style;
}

const TokenizerStyle& v3_tokenizer_style() {
  static const TokenizerStyle style{{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                     "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>"},
                                    0,
                                    1,
                                    -1,
                                    true,
                                    nullptr,
                                    false,
                                    kV3ChatTemplate};
  return style;
}

// llama.cpp's arch "deepseek2" holds V2, V2-Lite and V3 alike (DeepseekV2Model in
// convert_hf_to_gguf.py). Its converter writes MLA as MQA: head_count_kv 1 and key_length the
// latent plus the RoPE key (then key_length_mla and value_length_mla give the heads; files before
// them have the heads in key_length and value_length); q/k rows as in the checkpoint (RoPE on
// adjacent pairs, llama.cpp's "norm" RoPE); MTP layers left out; FP8 weights dequantised;
// e_score_correction_bias as exp_probs_b; kv_b_proj split (GgufRows::kLatentKvSplit).
const std::vector<GgufKey>& gguf_keys() {
  static const std::vector<GgufKey> keys = {
      // Every head reads the latent (read_latent_attention): the file's head_count_kv is the
      // converter's MQA view, and head_dim is the RoPE dim, as DeepseekV{2,3}Config sets it.
      {"num_key_value_heads", "attention.head_count", true},
      {"head_dim", "rope.dimension_count", true},
      {"qk_rope_head_dim", "rope.dimension_count", true},
      {"kv_lora_rank", "attention.kv_lora_rank", true},
      {"q_lora_rank", "attention.q_lora_rank"},  // absent: V2-Lite's q_proj
      {"v_head_dim", "attention.value_length_mla", true, "attention.value_length"},
      {"intermediate_size", "feed_forward_length", true},
      {"moe_intermediate_size", "expert_feed_forward_length", true},
      {"n_routed_experts", "expert_count", true},
      {"num_experts_per_tok", "expert_used_count", true},
      {"n_shared_experts", "expert_shared_count", true},
      {"routed_scaling_factor", "expert_weights_scale"},
      {"norm_topk_prob", "expert_weights_norm"},
      {"first_k_dense_replace", "leading_dense_block_count", true},
      {"n_group", "expert_group_count"},
      {"topk_group", "expert_group_used_count"}};
  return keys;
}

const std::vector<GgufTensorName>& gguf_tensor_names() {
  static const std::vector<GgufTensorName> names = {
      {"self_attn.q_a_proj", "attn_q_a"},
      {"self_attn.q_a_layernorm", "attn_q_a_norm"},
      {"self_attn.q_b_proj", "attn_q_b"},
      {"self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"},
      {"self_attn.kv_a_layernorm", "attn_kv_a_norm"},
      {"self_attn.kv_b_proj", "attn_kv_b", GgufRows::kLatentKvSplit},
      {"mlp.gate", "ffn_gate_inp"},
      {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"mlp.experts.*.gate_proj", "ffn_gate_exps"},
      {"mlp.experts.*.up_proj", "ffn_up_exps"},
      {"mlp.experts.*.down_proj", "ffn_down_exps"},
      {"mlp.shared_experts.gate_proj", "ffn_gate_shexp"},
      {"mlp.shared_experts.up_proj", "ffn_up_shexp"},
      {"mlp.shared_experts.down_proj", "ffn_down_shexp"},
      {"mlp.gate_proj", "ffn_gate"},  // a dense layer's MLP
      {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  return names;
}

// llama.cpp's expert_gating_func: 1 softmax (V2; also when absent, as in the first V2 files),
// 2 sigmoid (V3).
int64_t gating_func(const GgufFile& g) {
  return g.integer("deepseek2.expert_gating_func").value_or(1);
}

bool reads_v3(const GgufFile& g) {
  return gating_func(g) == 2;
}

// YaRN as the converter writes it: factor, original context, betas, and 0.1 · mscale_all_dim as
// yarn_log_multiplier (llama.cpp divides it back); DeepSeek's configs have mscale equal to
// mscale_all_dim, which is all llama.cpp's graph can run, so both are that value.
void derive_rope_scaling(const GgufFile& g, nlohmann::json& j) {
  const std::string p = "deepseek2.rope.scaling.";
  const std::string type = g.string(p + "type").value_or("none");
  if (type == "none") return;
  if (type != "yarn")
    fail(
        "{}: key '{}type': rope scaling '{}' is not supported for DeepSeek; expected 'yarn' or "
        "'none'",
        g.path().string(), p, type);
  if (g.find(p + "yarn_attn_factor") || g.find(p + "yarn_ext_factor"))
    fail("{}: keys '{}yarn_attn_factor' and '{}yarn_ext_factor' are not supported for DeepSeek",
         g.path().string(), p, p);
  const auto factor = g.number(p + "factor");
  const auto log_mul = g.number(p + "yarn_log_multiplier");
  if (!factor || !log_mul)
    fail("{}: key '{}{}' is missing: YaRN needs it", g.path().string(), p,
         factor ? "yarn_log_multiplier" : "factor");
  const double mscale = *log_mul / 0.1;
  nlohmann::json rope = {
      {"type", "yarn"}, {"factor", *factor}, {"mscale", mscale}, {"mscale_all_dim", mscale}};
  if (const auto n = g.integer(p + "original_context_length"))
    rope["original_max_position_embeddings"] = *n;
  if (const auto b = g.number(p + "yarn_beta_fast")) rope["beta_fast"] = *b;
  if (const auto b = g.number(p + "yarn_beta_slow")) rope["beta_slow"] = *b;
  j["rope_scaling"] = rope;
}

// The no-RoPE part of each q/k head: the head's key length less the RoPE dim.
void derive_common(const GgufFile& g, nlohmann::json& j) {
  const char* key = g.find("deepseek2.attention.key_length_mla") ? "attention.key_length_mla"
                                                                 : "attention.key_length";
  const int64_t head = g.integer(std::string("deepseek2.") + key).value_or(0);
  const int64_t rope = j["qk_rope_head_dim"].get<int64_t>();
  if (head <= rope)
    fail("{}: key 'deepseek2.{}': expected the q/k head length, more than the RoPE dim {}, got {}",
         g.path().string(), key, rope, head);
  j["qk_nope_head_dim"] = head - rope;
  derive_rope_scaling(g, j);
}

// V2: groups (expert_group_count > 1) mean group_limited_greedy, each group scored by its best
// expert as DeepSeek-V2's router does (llama.cpp's build_moe_ffn ranks groups by the sum of their
// best two for every arch, V3's rule; sluice runs the checkpoint's).
void derive_v2(const GgufFile& g, nlohmann::json& j) {
  if (const int64_t f = gating_func(g); f != 1)
    fail(
        "{}: key 'deepseek2.expert_gating_func': expected 1 (softmax, DeepSeek-V2) or 2 (sigmoid, "
        "DeepSeek-V3), got {}",
        g.path().string(), f);
  derive_common(g, j);
  if (j.value("n_group", 1) > 1) j["topk_method"] = "group_limited_greedy";
}

void derive_v3(const GgufFile& g, nlohmann::json& j) {
  derive_common(g, j);
}

// What llama.cpp's deepseek2 graph does when a key is absent: no q-LoRA, no scaling of the
// routed weights, no renormalisation, dense layers only in front, and (V3) no expert groups.
const GgufNaming* gguf_naming_v2() {
  static const GgufNaming naming{
      .arch = "deepseek2",
      .keys = gguf_keys(),
      .tensors = gguf_tensor_names(),
      .implied_config = R"({"q_lora_rank": null, "routed_scaling_factor": 1.0,
          "norm_topk_prob": false, "moe_layer_freq": 1, "scoring_func": "softmax",
          "topk_method": "greedy"})",
      .reads = [](const GgufFile& g) { return !reads_v3(g); },
      .derive_config = derive_v2};
  return &naming;
}

const GgufNaming* gguf_naming_v3() {
  static const GgufNaming naming{
      .arch = "deepseek2",
      .keys = gguf_keys(),
      .tensors = gguf_tensor_names(),
      .implied_config = R"({"q_lora_rank": null, "routed_scaling_factor": 1.0,
          "norm_topk_prob": false, "moe_layer_freq": 1, "scoring_func": "sigmoid",
          "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "rope_interleave": true,
          "num_nextn_predict_layers": 0})",
      .reads = reads_v3,
      .derive_config = derive_v3};
  return &naming;
}

}  // namespace

const FamilySpec& deepseek_v2_family() {
  static const FamilySpec spec{
      Family::DeepseekV2, "deepseek_v2", "DeepseekV2ForCausalLM", read_v2,
      write_v2,           table,         v2_tokenizer_style(),    gguf_naming_v2()};
  return spec;
}

const FamilySpec& deepseek_v3_family() {
  static const FamilySpec spec{
      Family::DeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM", read_v3,
      write_v3,           table,         v3_tokenizer_style(),    gguf_naming_v3()};
  return spec;
}

}  // namespace sluice
