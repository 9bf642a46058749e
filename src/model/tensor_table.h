// A family's strict tensor table: every tensor its checkpoints hold, with the shape expected
// and where it goes in the canonical weight set. The loader checks a checkpoint against it.
#pragma once

#include <string>
#include <vector>

#include "model/weights.h"

namespace sluice {

// How a checkpoint tensor becomes its canonical slot.
enum class TensorMapping {
  kWhole,        // the slot is the tensor (or, with `expert`, one expert of the stacked slot)
  kRows,         // the slot is rows [first_row, first_row + rows) of a 2-D tensor (a fused
                 // projection, e.g. DBRX's Wqkv); a view
  kExpertsFlat,  // [E·I, H], expert after expert: the slot [E, I, H]; a view
  kExpertsFlatTransposed,  // [E·I, H] holding each expert's [I, H] = the transpose of its
                           // canonical [H, I] (DBRX's w2, used as act @ w2): the slot [E, H, I],
                           // repacked once at load
};

struct ExpectedTensor {
  std::string name;  // as in the checkpoint
  Shape shape;       // as in the checkpoint
  Tensor* slot;      // the canonical tensor it becomes
  int expert = -1;   // >= 0: expert `expert` of the stacked slot [E, ...]
  TensorMapping mapping = TensorMapping::kWhole;
  int64_t first_row = 0, rows = 0;  // kRows
  int64_t experts = 0;              // kExpertsFlat*
  // The config.json fields the shape comes from, named when a checkpoint disagrees (e.g.
  // "kv_lora_rank + qk_rope_head_dim"); null: the usual ones.
  const char* shape_from = nullptr;
};

struct TensorTable {
  std::vector<ExpectedTensor> tensors;
  // Names that may appear in checkpoints but carry nothing we use (e.g. cached RoPE tables).
  std::vector<std::string> ignored_suffixes;
  // Prefixes of tensors a checkpoint holds for parts that are not run (e.g. "model.layers.61.").
  std::vector<std::string> ignored_prefixes;

  void add(std::string name, Shape shape, Tensor* slot, int expert = -1) {
    tensors.push_back({std::move(name), std::move(shape), slot, expert});
  }
  // Rows [first_row, first_row + rows) of the 2-D checkpoint tensor `name` into `slot`; a fused
  // tensor is added once per part, with the same name and shape.
  void add_rows(std::string name, Shape shape, Tensor* slot, int64_t first_row, int64_t rows) {
    ExpectedTensor t{std::move(name), std::move(shape), slot};
    t.mapping = TensorMapping::kRows;
    t.first_row = first_row;
    t.rows = rows;
    tensors.push_back(std::move(t));
  }
  // The E experts of one [E·I, H] checkpoint tensor into the stacked slot; `transposed` when
  // each expert's [I, H] is the transpose of the slot's matrix.
  void add_experts_flat(std::string name, Shape shape, Tensor* slot, int64_t experts,
                        bool transposed) {
    ExpectedTensor t{std::move(name), std::move(shape), slot};
    t.mapping = transposed ? TensorMapping::kExpertsFlatTransposed : TensorMapping::kExpertsFlat;
    t.experts = experts;
    tensors.push_back(std::move(t));
  }
};

// The slot of a mapped table entry (mapping != kWhole) from its whole checkpoint tensor: a view
// of `whole`, or a repacked copy (kExpertsFlatTransposed).
Tensor mapped_slot(const ExpectedTensor& t, const Tensor& whole);

// Builds the table for `config` (its family's), pointing slots into `weights` (whose layers are
// sized here).
TensorTable tensor_table(const ModelConfig& config, ModelWeights& weights);

// Pieces of the Hugging Face Llama layout most families share (`prefix` ends in '.'):
// model.embed_tokens, and at the end model.norm and (unless tied) lm_head.
void add_llama_embedding(const ModelConfig& c, ModelWeights& w, TensorTable& t);
void add_llama_head(const ModelConfig& c, ModelWeights& w, TensorTable& t);
// <prefix>input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj.weight, their biases
// when the config has them, and self_attn.{q,k}_norm.weight when it has q/k norms.
void add_llama_attention(const ModelConfig& c, const std::string& prefix, LayerWeights& L,
                         TensorTable& t);
// The E experts of <prefix>experts.{e}.<gate|up|down>.weight (stacked) and the router
// <prefix><router>.weight.
struct ExpertNames {
  const char* router;
  const char* gate;
  const char* up;
  const char* down;
};
void add_experts(const ModelConfig& c, const std::string& prefix, const ExpertNames& names,
                 LayerWeights& L, TensorTable& t);
// A dense SwiGLU MLP of intermediate size I: <prefix>{gate,up,down}_proj.weight into L.mlp_*.
void add_dense_mlp(const ModelConfig& c, const std::string& prefix, int I, LayerWeights& L,
                   TensorTable& t);

}  // namespace sluice
