// How llama.cpp's GGUF files spell a family: its general.architecture, the metadata keys its
// config.json fields become ("{arch}.expert_count" for num_experts), and its tensor names
// ("blk.N.ffn_gate_exps" for the stacked experts of "model.layers.N.mlp.experts.*.gate_proj"),
// as convert_hf_to_gguf.py and gguf-py's constants write them. A family description
// (family_<name>.cpp) holds one; model/gguf_model.cpp reads any family through it.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <utility>
#include <vector>

namespace sluice {

class GgufFile;

// How a GGUF tensor's rows relate to the checkpoint's.
enum class GgufRows {
  kAsIs,
  // llama.cpp's converter permutes the rows of q_proj / k_proj for architectures whose RoPE
  // rotates adjacent pairs (LlamaModel.permute): within each head of d rows, row j·d/2 + i
  // (half j of rotate-half) is stored at 2i + j. The loader undoes it when
  // GgufNaming::interleaved_qk; q has num_heads heads, k num_kv_heads.
  kQueryHeads,
  kKeyHeads,
  // DeepSeek's kv_b_proj [heads·(qk_nope + v), kv_lora_rank], per head its k rows then its v
  // rows. Older llama.cpp files hold it whole under the naming's name ("attn_kv_b"); its
  // converter now splits it per head (DeepseekV2Model.modify_tensors) into "attn_k_b"
  // [heads, kv_lora_rank, qk_nope] (each head's k rows transposed) and "attn_v_b"
  // [heads, v, kv_lora_rank]. The loader reads either form.
  kLatentKvSplit,
};

struct GgufTensorName {
  // The checkpoint's module path: inside a layer after "model.layers.N." (the naming's
  // layer_prefix) with an expert index written '*' ("mlp.experts.*.gate_proj"), else the whole
  // name ("model.embed_tokens"); the ".weight" / ".bias" suffix is kept as it is. A tensor
  // whose checkpoint name has no such suffix (DBRX's "ffn.experts.mlp.w1", DeepSeek-V3's
  // "mlp.gate.e_score_correction_bias") is listed whole, and its GGUF name then carries the
  // suffix llama.cpp gives it ("ffn_gate_exps.weight", "exp_probs_b.bias").
  const char* checkpoint;
  // Its GGUF name, after "blk.N." inside a layer. Experts are one [E, ...] tensor in GGUF, also
  // where the checkpoint stores them flat (DBRX's [E·I, H]; its w2 then transposed per expert,
  // as the canonical [E, H, I]).
  const char* gguf;
  GgufRows rows = GgufRows::kAsIs;
};

// The config.json field `config` is read from the GGUF key "{arch}.<gguf>" (or, when absent, the
// key "{arch}.<fallback>"); `required`: the family cannot be read without it. A dotted `config`
// ("attn_config.kv_n_heads") is a field of a nested object.
struct GgufKey {
  const char* config;
  const char* gguf;
  bool required = false;
  const char* fallback = nullptr;
};

struct GgufNaming {
  const char* arch;           // general.architecture
  std::vector<GgufKey> keys;  // the family's own fields, after the common Llama-style ones
  std::vector<GgufTensorName> tensors;  // the family's own names, before the common ones
  // config.json fields that llama.cpp's graph for the arch fixes rather than reads (e.g. whether
  // the top-k weights are renormalised), as a JSON object; the keys above override them.
  const char* implied_config = "{}";
  // Boolean config.json fields that are true exactly when layer 0 has the named GGUF tensor
  // (e.g. attention biases: {"attention_bias", "attn_q.bias"}).
  std::vector<std::pair<const char*, const char*>> present_flags = {};
  // A config.json field listing the layers without a router tensor (ffn_gate_inp), i.e. the
  // dense ones (Qwen's "mlp_only_layers"); null: every layer is MoE.
  const char* dense_layers_field = nullptr;
  bool interleaved_qk = false;  // q/k rows as GgufRows says (arch llama)
  // What precedes a layer's index in checkpoint names.
  const char* layer_prefix = "model.layers.";
  // Whether the Llama-style keys every such config.json has (hidden_size from embedding_length,
  // ...; gguf_model.cpp) are read before `keys`; DBRX names its fields otherwise.
  bool llama_style_keys = true;
  // Where two families share an arch (deepseek2: DeepSeek-V2 and V3), whether this one reads
  // the file; null: every file of the arch.
  bool (*reads)(const GgufFile& g) = nullptr;
  // After the keys: the fields no single key gives (a difference of two keys, a nested object),
  // and checks of metadata no config.json field could hold; errors name the file and the key.
  void (*derive_config)(const GgufFile& g, nlohmann::json& config) = nullptr;
};

// The names every Llama-style family shares: embedding, final norm, lm_head, the attention
// block and its norms (model/gguf_model.cpp).
const std::vector<GgufTensorName>& llama_gguf_tensor_names();

}  // namespace sluice
