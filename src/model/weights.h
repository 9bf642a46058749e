// The canonical weight set every family is mapped onto. Projection weights keep the Hugging Face
// [out_features, in_features] layout (y = x·Wᵀ); experts are stacked [E, ...] so expert e is
// `slice0(e)`, a pointer offset. Optional weights are present or absent (an empty Tensor): the
// config says which (config.h), the family's tensor table fills them, and the runtime reads their
// presence.
#pragma once

#include <array>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace sluice {

struct LayerWeights {
  Tensor attn_norm;   // [hidden]
  Tensor wq;          // [heads*head_dim, hidden]
  Tensor wk;          // [kv_heads*head_dim, hidden]
  Tensor wv;          // [kv_heads*head_dim, hidden]
  Tensor wo;          // [hidden, heads*head_dim]
  Tensor bq, bk, bv;  // optional (qkv_bias): [q_dim], [kv_dim], [kv_dim]
  Tensor bo;          // optional (o_bias): [hidden]
  // Optional (qk_norm): [head_dim] each when per head; [q_dim] and [kv_dim] over the full width.
  Tensor q_norm, k_norm;
  // Multi-head latent attention (AttentionKind::kLatent), with wo [hidden, heads·v_head_dim]:
  // q is wq(x) [heads·head_dim, hidden] without q-LoRA, else q_b(q_a_norm(q_a(x))).
  Tensor q_a;        // [q_lora_rank, hidden]
  Tensor q_a_norm;   // [q_lora_rank]
  Tensor q_b;        // [heads·head_dim, q_lora_rank]
  Tensor kv_a;       // [kv_lora_rank + qk_rope_head_dim, hidden]: the latent, then the RoPE key
  Tensor kv_a_norm;  // [kv_lora_rank]
  Tensor kv_b;       // [heads·(qk_nope_head_dim + v_head_dim), kv_lora_rank]: per head k_nope, v
  Tensor ffn_norm;   // [hidden]

  // The sparse MoE block; all empty in a dense layer.
  Tensor router;       // [experts, hidden]
  Tensor router_bias;  // optional (router_selection_bias): [experts], F32 in checkpoints
  Tensor expert_gate;  // [experts, intermediate, hidden]  (Mixtral w1, Qwen gate_proj)
  Tensor expert_up;    // [experts, intermediate, hidden]  (Mixtral w3, Qwen up_proj)
  Tensor expert_down;  // [experts, hidden, intermediate]  (Mixtral w2, Qwen down_proj)

  // The dense MLP every token goes through (config dense_mlp_size(l) > 0): a MoE layer's shared
  // expert, or a dense layer's MLP. down(silu(gate x) * up x), times sigmoid(mlp_scale · x) when
  // mlp_scale is present (shared_expert_gate).
  Tensor mlp_gate;   // [mlp_intermediate, hidden]
  Tensor mlp_up;     // [mlp_intermediate, hidden]
  Tensor mlp_down;   // [hidden, mlp_intermediate]
  Tensor mlp_scale;  // optional: [1, hidden]
};

struct ModelWeights {
  Tensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; the embedding when tie_word_embeddings
};

struct ExpertFiles;

struct Model {
  ModelConfig config;
  ModelWeights weights;
  std::filesystem::path dir;  // the folder or .gguf file; empty for a model made in memory
  // Set when the routed experts stayed on disk (LoadOptions::experts_on_disk): where they are
  // in the files. Their slots in `weights` are then empty; the disk tier reads them.
  std::shared_ptr<const ExpertFiles> expert_files;
};

struct LoadOptions {
  // Leave the routed experts' weights in their files (the disk tier, model/expert_files.h): each
  // is checked against the table but neither read nor mapped into a slot. Safetensors folders
  // only, with bf16 experts or a quantized checkpoint's.
  bool experts_on_disk = false;
  // Quantize the experts and dense MLPs at load (as quantize_model_experts does). Those of a
  // safetensors folder stored one bf16/f16/f32 matrix per tensor are quantized matrix by matrix
  // as they are read from the mapping, whose pages are dropped after each, so the bf16 weights
  // are never resident next to the quantized ones; FP8 and fused experts, and GGUF files, are
  // quantized once loaded. bf16: keep them as stored.
  ExpertQuant expert_quant;
  // > 0: keep only the model's first `layers` layers (the others' tensors are checked, never
  // read); more than the model has is an error.
  int layers = 0;
};

// Loads config.json and the safetensors of a Hugging Face model folder, checking every tensor
// against the family's table. Weights are views of the mapped files where they are stored as
// they run; experts repacked (stacked) or quantized at load are copied expert by expert, each
// source's pages dropped after it (MappedFile::drop_pages), so the process holds one copy. Or
// a GGUF file (the first part of a split one), model/gguf_model.h.
Model load_model(const std::filesystem::path& dir, const LoadOptions& options = {});
// The config alone: the folder's config.json, or a GGUF file's metadata.
ModelConfig load_model_config(const std::filesystem::path& dir);

// Every tensor of the weight set that is present, each once (a tied lm_head is the embedding).
std::vector<const Tensor*> weight_tensors(const ModelWeights& weights);
// A layer's tensors (the absent ones empty): every one but the routed experts', and those three.
// The one list of LayerWeights' fields that weight_tensors and model_stats walk.
std::array<const Tensor*, 24> layer_tensors_but_experts(const LayerWeights& L);
std::array<const Tensor*, 3> layer_expert_tensors(const LayerWeights& L);

// Reads every weight of a loaded model into memory (read_into_memory) and returns the bytes.
// Weights are mapped lazily: without this the first step of a run pays for reading them from the
// disk, and a throughput measured over it is the disk's.
size_t read_weights_into_memory(const Model& model);

}  // namespace sluice
