// A family's strict tensor table: every tensor its checkpoints hold, with the shape expected
// and where it goes in the canonical weight set. The loader checks a checkpoint against it.
#pragma once

#include <string>
#include <vector>

#include "model/weights.h"

namespace sluice {

struct ExpectedTensor {
  std::string name;  // as in the checkpoint
  Shape shape;
  Tensor* slot;     // the canonical tensor it becomes
  int expert = -1;  // >= 0: expert `expert` of the stacked slot [E, ...]
};

struct TensorTable {
  std::vector<ExpectedTensor> tensors;
  // Names that may appear in checkpoints but carry nothing we use (e.g. cached RoPE tables).
  std::vector<std::string> ignored_suffixes;
};

// Builds the table for `config`, pointing slots into `weights` (whose layers are sized here).
TensorTable tensor_table(const ModelConfig& config, ModelWeights& weights);

TensorTable mixtral_tensor_table(const ModelConfig& config, ModelWeights& weights);

}  // namespace sluice
