// DBRX (DbrxForCausalLM; dbrx-base, dbrx-instruct): every norm a LayerNorm without bias
// (norm_1, norm_2, norm_f; nn.LayerNorm's eps 1e-5); attention through one fused Wqkv of
// [hidden + 2·kv_heads·head_dim, hidden], whose output is clamped to ±clip_qkv before it is split
// into q, k and v (DbrxAttention), head_dim = d_model / n_heads, no biases, no q/k norms. Every
// layer MoE: softmax router, top-k, the top-k weights divided by their p-norm
// (moe_normalize_expert_weights, p = 1 in the published models: the sum), SwiGLU experts stored
// flat as w1, v1, w2 of [E·ffn, hidden] each, expert e's rows [e·ffn, (e+1)·ffn); w1 and v1 are
// nn.Linear-shaped ([ffn, hidden]: gate and up), w2 is used as `act @ w2` and so holds the
// transpose of the canonical down projection. Its config nests attention and FFN fields in
// attn_config and ffn_config.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"
#include "model/family.h"

namespace sluice {

namespace {

// A nested config object; absent or null: the sub-config's class defaults (an empty object).
ConfigReader sub_config(const ConfigReader& r, const char* key) {
  static const nlohmann::json empty = nlohmann::json::object();
  return r.has(key) ? r.object(key) : ConfigReader(empty, r.source(), std::string(key) + ".");
}

void read_attention(const ConfigReader& a, ModelConfig& c) {  // DbrxAttentionConfig
  c.num_kv_heads = a.integer_or("kv_n_heads", 1);
  c.rope_theta = a.number_or("rope_theta", 10000.f);
  c.clip_qkv = a.number_or("clip_qkv", 0.f);  // null: no clamp
  if (a.has("clip_qkv") && !(c.clip_qkv > 0))
    a.fail_field("clip_qkv", "expected a positive number or null, got {}", c.clip_qkv);
}

void read_ffn(const ConfigReader& f, ModelConfig& c) {  // DbrxFFNConfig
  c.expert_intermediate_size = f.integer_or("ffn_hidden_size", 3584);
  c.num_experts = f.integer_or("moe_num_experts", 4);
  c.experts_per_token = f.integer_or("moe_top_k", 1);
  if (f.has("ffn_act_fn")) {
    const nlohmann::json& act = f.doc()["ffn_act_fn"];
    if (!act.is_object() || act.value("name", std::string("silu")) != "silu")
      f.wrong_type("ffn_act_fn", "{\"name\": \"silu\"}");
  }
  // top_weights / torch.norm(top_weights, p): with p = 1 the sum of the (positive) weights,
  // sluice's renormalisation; other p are not implemented.
  c.normalize_topk =
      !f.present("moe_normalize_expert_weights") || f.has("moe_normalize_expert_weights");
  if (c.normalize_topk && f.number_or("moe_normalize_expert_weights", 1.f) != 1.f)
    f.fail_field("moe_normalize_expert_weights",
                 "only p = 1 (the published DBRX models) or null is supported, got {}",
                 f.doc()["moe_normalize_expert_weights"].dump());
}

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.vocab_size = r.integer_or("vocab_size", 32000);
  c.hidden_size = r.integer_or("d_model", 2048);
  c.num_layers = r.integer_or("n_layers", 24);
  c.num_heads = r.integer_or("n_heads", 16);
  c.max_position_embeddings = r.integer_or("max_seq_len", 2048);
  if (c.hidden_size % c.num_heads != 0)
    r.fail_field("d_model", "{} is not divisible by n_heads ({})", c.hidden_size, c.num_heads);
  c.head_dim = c.hidden_size / c.num_heads;
  if (r.boolean_or("tie_word_embeddings", false))
    r.fail_field("tie_word_embeddings", "DBRX does not tie its embeddings; expected false");
  read_attention(sub_config(r, "attn_config"), c);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("{}: field 'n_heads' ({}) must be a multiple of 'attn_config.kv_n_heads' ({})", r.source(),
         c.num_heads, c.num_kv_heads);
  read_ffn(sub_config(r, "ffn_config"), c);
  c.stored_experts[2].made_on_read = true;  // w2: each expert's down transposed
  c.norm = NormKind::kLayerNorm;
  c.rms_norm_eps = 1e-5f;  // nn.LayerNorm's default: the config has no eps
  auto bos = r.ids_or_empty("bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  c.eos_token_ids = r.ids_or_empty("eos_token_id");
  c.dtype = read_dtype(r);
}

void write_config(const ModelConfig& c, nlohmann::json& j) {
  j["architectures"] = {c.architecture};
  j["model_type"] = "dbrx";
  j["vocab_size"] = c.vocab_size;
  j["d_model"] = c.hidden_size;
  j["n_layers"] = c.num_layers;
  j["n_heads"] = c.num_heads;
  j["max_seq_len"] = c.max_position_embeddings;
  j["attn_config"] = {{"attn_pdrop", 0.0},
                      {"clip_qkv", c.clip_qkv > 0 ? nlohmann::json(c.clip_qkv) : nullptr},
                      {"kv_n_heads", c.num_kv_heads},
                      {"rope_theta", c.rope_theta}};
  j["ffn_config"] = {
      {"ffn_act_fn", {{"name", "silu"}}},
      {"ffn_hidden_size", c.expert_intermediate_size},
      {"moe_num_experts", c.num_experts},
      {"moe_top_k", c.experts_per_token},
      {"moe_jitter_eps", 0.01},  // training only
      {"moe_loss_weight", 0.05},
      {"moe_normalize_expert_weights", c.normalize_topk ? nlohmann::json(1.0) : nullptr}};
  j["tie_word_embeddings"] = false;
  j["bos_token_id"] = c.bos_token_id >= 0 ? nlohmann::json(c.bos_token_id) : nullptr;
  j["eos_token_id"] = c.eos_token_ids.size() == 1 ? nlohmann::json(c.eos_token_ids[0])
                                                  : nlohmann::json(c.eos_token_ids);
  j["torch_dtype"] = dtype_json_name(c.dtype);
  j["use_cache"] = true;
  j["output_router_logits"] = false;
}

TensorTable table(const ModelConfig& c, ModelWeights& w) {
  TensorTable t;
  const int64_t H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(),
                EI = int64_t(c.num_experts) * c.expert_intermediate_size;
  t.add("transformer.wte.weight", {c.vocab_size, H}, &w.embed);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("transformer.blocks.{}.", l);
    LayerWeights& L = w.layers[size_t(l)];
    const std::string n = p + "norm_attn_norm.";
    t.add(n + "norm_1.weight", {H}, &L.attn_norm);
    // q, k, v = Wqkv(x).clamp(±clip_qkv).split([hidden, kv_dim, kv_dim])
    const std::string wqkv = n + "attn.Wqkv.weight";
    const Shape fused = {qd + 2 * kvd, H};
    t.add_rows(wqkv, fused, &L.wq, 0, qd);
    t.add_rows(wqkv, fused, &L.wk, qd, kvd);
    t.add_rows(wqkv, fused, &L.wv, qd + kvd, kvd);
    t.add(n + "attn.out_proj.weight", {H, qd}, &L.wo);
    t.add(n + "norm_2.weight", {H}, &L.ffn_norm);
    t.add(p + "ffn.router.layer.weight", {c.num_experts, H}, &L.router);
    const std::string e = p + "ffn.experts.mlp.";
    t.add_experts_flat(e + "w1", {EI, H}, &L.expert_gate, c.num_experts, false);
    t.add_experts_flat(e + "v1", {EI, H}, &L.expert_up, c.num_experts, false);
    t.add_experts_flat(e + "w2", {EI, H}, &L.expert_down, c.num_experts, true);
  }
  t.add("transformer.norm_f.weight", {H}, &w.final_norm);
  t.add("lm_head.weight", {c.vocab_size, H}, &w.lm_head);
  return t;
}

// llama.cpp's arch "dbrx" (DbrxModel in convert_hf_to_gguf.py): the config's nested fields as
// the converter writes them; the graph always renormalises the top-k weights (p = 1); Wqkv stays
// fused as attn_qkv; the flat experts are stacked [E, ffn, hidden], w2 transposed per expert
// into the canonical [E, hidden, ffn]; q/k rows as in the checkpoint (NeoX-style RoPE).
const std::vector<GgufKey>& gguf_keys() {
  static const std::vector<GgufKey> keys = {
      {"d_model", "embedding_length", true},
      {"n_layers", "block_count", true},
      {"n_heads", "attention.head_count", true},
      {"max_seq_len", "context_length"},
      {"attn_config.kv_n_heads", "attention.head_count_kv", true},
      {"attn_config.rope_theta", "rope.freq_base"},
      {"attn_config.clip_qkv", "attention.clamp_kqv", true},
      {"ffn_config.ffn_hidden_size", "feed_forward_length", true},
      {"ffn_config.moe_num_experts", "expert_count", true},
      {"ffn_config.moe_top_k", "expert_used_count", true}};
  return keys;
}

// A clamp of 0 is none (llama.cpp clamps only above 0), null in config.json. Every norm is a
// LayerNorm of eps 1e-5 (DBRX's config has no field for it), which the file must agree with.
void derive_gguf_config(const GgufFile& g, nlohmann::json& j) {
  nlohmann::json& clip = j["attn_config"]["clip_qkv"];
  if (clip.is_number() && clip.get<double>() == 0) clip = nullptr;
  if (const auto eps = g.number("dbrx.attention.layer_norm_epsilon");
      eps && !(std::fabs(*eps - 1e-5) < 1e-10))
    fail("{}: key 'dbrx.attention.layer_norm_epsilon': DBRX's LayerNorms have eps 1e-5, got {}",
         g.path().string(), *eps);
}

const GgufNaming* gguf_naming() {
  static const GgufNaming naming{
      .arch = "dbrx",
      .keys = gguf_keys(),
      .tensors = {{"transformer.wte", "token_embd"},
                  {"transformer.norm_f", "output_norm"},
                  {"norm_attn_norm.norm_1", "attn_norm"},
                  {"norm_attn_norm.attn.Wqkv", "attn_qkv"},
                  {"norm_attn_norm.attn.out_proj", "attn_output"},
                  {"norm_attn_norm.norm_2", "attn_output_norm"},
                  {"ffn.router.layer", "ffn_gate_inp"},
                  {"ffn.experts.mlp.w1", "ffn_gate_exps.weight"},
                  {"ffn.experts.mlp.v1", "ffn_up_exps.weight"},
                  {"ffn.experts.mlp.w2", "ffn_down_exps.weight"}},
      .implied_config = R"({"ffn_config": {"moe_normalize_expert_weights": 1}})",
      .layer_prefix = "transformer.blocks.",
      .llama_style_keys = false,
      .derive_config = derive_gguf_config};
  return &naming;
}

}  // namespace

// cl100k (GPT-4's tiktoken BPE) with DBRX's special tokens, ChatML as dbrx-instruct's template
// has it (without the long default system prompt it inserts when none is given).
const FamilySpec& dbrx_family() {
  static const FamilySpec spec{
      Family::Dbrx,
      "dbrx",
      "DbrxForCausalLM",
      read_config,
      write_config,
      table,
      TokenizerStyle{{"<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"},
                     -1,
                     0,
                     -1,
                     false,
                     "cl100k",
                     false,
                     "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                     "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
      gguf_naming()};
  return spec;
}

}  // namespace sluice
