// The canonical weight set every family is mapped onto. Projection weights keep the Hugging Face
// [out_features, in_features] layout (y = x·Wᵀ); experts are stacked [E, ...] so expert e is
// `slice0(e)`, a pointer offset.
#pragma once

#include <filesystem>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace sluice {

struct LayerWeights {
  Tensor attn_norm;    // [hidden]
  Tensor wq;           // [heads*head_dim, hidden]
  Tensor wk;           // [kv_heads*head_dim, hidden]
  Tensor wv;           // [kv_heads*head_dim, hidden]
  Tensor wo;           // [hidden, heads*head_dim]
  Tensor ffn_norm;     // [hidden]
  Tensor router;       // [experts, hidden]
  Tensor expert_gate;  // [experts, intermediate, hidden]  (Mixtral w1)
  Tensor expert_up;    // [experts, intermediate, hidden]  (Mixtral w3)
  Tensor expert_down;  // [experts, hidden, intermediate]  (Mixtral w2)
};

struct ModelWeights {
  Tensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; the embedding when tie_word_embeddings
};

struct Model {
  ModelConfig config;
  ModelWeights weights;
  std::filesystem::path dir;  // empty for a model made in memory
};

// Loads config.json and the safetensors of a Hugging Face model folder, checking every tensor
// against the family's table.
Model load_model(const std::filesystem::path& dir);

}  // namespace sluice
