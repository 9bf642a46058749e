// sluice inspect: what a model folder holds — family, shapes, parameters, bytes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <memory>
#include <vector>

#include "cli/command.h"
#include "cli/machine_report.h"
#include "core/units.h"
#include "engine/host_budget.h"
#include "io/gguf.h"
#include "model/model_stats.h"

namespace sluice::cli {
namespace {

// llama.cpp's general.file_type (enum llama_ftype), the names of the common ones.
std::string file_type_name(int64_t t) {
  static const std::map<int64_t, const char*> names = {
      {0, "ALL_F32"},        {1, "MOSTLY_F16"},     {2, "MOSTLY_Q4_0"},    {3, "MOSTLY_Q4_1"},
      {7, "MOSTLY_Q8_0"},    {8, "MOSTLY_Q5_0"},    {9, "MOSTLY_Q5_1"},    {10, "MOSTLY_Q2_K"},
      {11, "MOSTLY_Q3_K_S"}, {12, "MOSTLY_Q3_K_M"}, {13, "MOSTLY_Q3_K_L"}, {14, "MOSTLY_Q4_K_S"},
      {15, "MOSTLY_Q4_K_M"}, {16, "MOSTLY_Q5_K_S"}, {17, "MOSTLY_Q5_K_M"}, {18, "MOSTLY_Q6_K"},
      {32, "MOSTLY_BF16"}};
  const auto it = names.find(t);
  return it != names.end() ? fmt::format("{} ({})", it->second, t) : fmt::format("{}", t);
}

// What the GGUF file itself says: its architecture, parts, tensor types and quantisation.
void print_gguf(const std::string& path) {
  const GgufFile g = GgufFile::open(path);
  std::map<std::string, std::pair<int, size_t>> types;  // type: tensors, bytes
  for (const auto& [name, t] : g.tensors()) {
    auto& [n, bytes] = types[ggml_type_name(t.type)];
    ++n;
    bytes += t.nbytes;
  }
  fmt::print(
      "gguf         version {}, architecture {}, {} tensors in {} file(s), {} metadata keys\n",
      g.version(), g.string("general.architecture").value_or("(none)"), g.tensors().size(),
      g.parts().size(), g.metadata().size());
  if (const auto name = g.string("general.name")) fmt::print("gguf name    {}\n", *name);
  if (const auto ft = g.integer("general.file_type"))
    fmt::print("quantization {}\n", file_type_name(*ft));
  for (const auto& [type, nb] : types)
    fmt::print("gguf {:<7} {} tensors, {}\n", type, nb.first, human_bytes(double(nb.second)));
  fmt::print("tokenizer    {}{}\n", g.string("tokenizer.ggml.model").value_or("(none)"),
             g.find("tokenizer.chat_template") ? ", with a chat template" : "");
}

// The model with its routed experts left in their files where the disk tier can read them, so
// that describing a model larger than memory reads no expert (a GGUF file's would be dequantised,
// a folder's stored apart repacked).
Model load_for_inspection(const std::string& dir) {
  LoadOptions options;
  options.experts_on_disk =
      load_model_config(dir).num_experts > 0 && disk_tier_refusal(dir).empty();
  return load_model(dir, options);
}

// Attention: MLA's latent shapes and KV cache, or the heads of multi-head attention.
void print_attention(const ModelConfig& c) {
  if (c.attention != AttentionKind::kLatent) {
    fmt::print(
        "attention    {} heads, {} KV heads, head dim {}, rope theta {}, sliding window {}\n",
        c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta,
        c.sliding_window > 0 ? std::to_string(c.sliding_window) : "none");
    return;
  }
  const LatentAttentionShape& a = c.mla;
  fmt::print(
      "attention    multi-head latent (MLA): {} heads, q/k head {} (no-RoPE {} + RoPE {}), v "
      "head "
      "{}, latent {}, q {}\n",
      c.num_heads, c.head_dim, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank,
      a.q_lora_rank > 0 ? fmt::format("LoRA rank {}", a.q_lora_rank) : "full");
  fmt::print(
      "KV cache     {} values per token and layer (latent + RoPE key), {} bytes in bf16 "
      "(decompressed K and V: {} bytes)\n",
      c.kv_cache_values_per_token(), c.kv_cache_values_per_token() * 2,
      2 * c.num_heads * (c.head_dim + a.v_head_dim));
  fmt::print(
      "attention    absorbed form: {} FLOPs per query and cached token, {} per query for the "
      "W_UK fold and W_UV unfold\n",
      c.attention_flops_per_pair(),
      2.0 * c.num_heads * (a.qk_nope_head_dim + a.v_head_dim) * a.kv_lora_rank);
}

// The experts, their routing, and the layers without them.
void print_experts(const ModelConfig& c) {
  fmt::print("experts      {} per layer, top {}{}, intermediate {}{}\n", c.num_experts,
             c.experts_per_token, c.normalize_topk ? " (renormalised)" : "",
             c.expert_intermediate_size,
             c.shared_expert_intermediate_size > 0
                 ? fmt::format("; shared expert of {}{}", c.shared_expert_intermediate_size,
                               c.shared_expert_gate ? " (sigmoid-gated)" : "")
                 : "");
  if (c.router_score == RouterScore::kSigmoid || c.expert_groups > 1 || c.router_selection_bias ||
      c.routed_scaling_factor != 1.f)
    fmt::print(
        "routing      {} scores{}{}, weights x {}\n",
        c.router_score == RouterScore::kSigmoid ? "sigmoid" : "softmax",
        c.router_selection_bias ? ", a selection bias (e_score_correction_bias)" : "",
        c.expert_groups > 1
            ? fmt::format(
                  ", the best {} of {} groups (scored by {})", c.groups_per_token, c.expert_groups,
                  c.group_score == GroupScore::kMax ? "their best expert" : "their best two")
            : "",
        c.routed_scaling_factor);
  std::vector<int> dense;
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l)) dense.push_back(l);
  if (!dense.empty())
    fmt::print("dense layers {} (MLP intermediate {})\n", fmt::join(dense, ", "),
               c.dense_intermediate_size);
  if (c.mtp_layers > 0)
    fmt::print(
        "skipped      {} multi-token-prediction layer(s) (num_nextn_predict_layers): not "
        "run, their tensors not loaded\n",
        c.mtp_layers);
}

// Parameters and bytes, by dtype, and what a decoded token reads.
void print_sizes(const ModelStats& s) {
  fmt::print("parameters   {} total, {} active per token\n", human_count(double(s.total_params)),
             human_count(double(s.active_params_per_token)));
  for (const auto& [dtype, bytes] : s.bytes_per_dtype)
    fmt::print("bytes {:<6} {}\n", dtype, human_bytes(double(bytes)));
  fmt::print("weights      {} ({} in experts)\n", human_bytes(double(s.total_bytes)),
             human_bytes(double(s.expert_bytes)));
  fmt::print("touched      {} of weights per decoded token at batch 1\n",
             human_bytes(double(s.bytes_touched_per_token)));
}

int run(const std::string& dir) {
  if (is_gguf_file(dir)) print_gguf(dir);
  const Model m = load_for_inspection(dir);
  const ModelConfig& c = m.config;
  const ModelStats s = whole_model_stats(m);
  fmt::print("model        {}\n", dir);
  fmt::print("family       {} ({})\n", family_name(c.family), c.architecture);
  fmt::print("layers       {}\n", c.num_layers);
  fmt::print("hidden       {}   vocab {}   max positions {}\n", c.hidden_size, c.vocab_size,
             c.max_position_embeddings);
  print_attention(c);
  fmt::print("rope         theta {}{}{}; softmax scale {:.6g}\n", c.rope_theta,
             c.rope_interleaved ? ", adjacent pairs" : "",
             c.rope_scaling.kind == RopeScalingKind::kYarn
                 ? fmt::format(", YaRN factor {} (attention factor {:.6g})", c.rope_scaling.factor,
                               c.rope_attention_factor())
                 : "",
             c.attention_scale());
  fmt::print("norms        {}{}{}{}\n",
             c.norm == NormKind::kRms ? "RMSNorm" : "LayerNorm (no bias)",
             c.qk_norm == QkNorm::kNone      ? ""
             : c.qk_norm == QkNorm::kPerHead ? "; q/k RMSNorm per head"
                                             : "; q/k RMSNorm over the projection",
             c.qkv_bias ? (c.o_bias ? "; q/k/v/o biases" : "; q/k/v biases") : "",
             c.clip_qkv > 0 ? fmt::format("; q/k/v clipped to ±{}", c.clip_qkv) : "");
  print_experts(c);
  fmt::print("embeddings   {}\n", c.tie_word_embeddings ? "tied to lm_head" : "separate lm_head");
  print_sizes(s);
  fmt::print("machine      {}\n", machine_description());
  return 0;
}

RegisterCommand reg({"inspect",
                     "Describe a model (folder or .gguf file): shapes, parameters, bytes",
                     [](CLI::App& sub) {
                       auto dir = std::make_shared<std::string>();
                       sub.add_option("--model", *dir, "Model folder or .gguf file")->required();
                       return std::function<int()>([dir] { return run(*dir); });
                     }});

}  // namespace
}  // namespace sluice::cli
