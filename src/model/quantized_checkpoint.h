// Reading the expert matrices of a quantized checkpoint (the form expert_quant.h documents) into
// the packed slots, with no bf16 pass: each matrix's values and scales are checked and packed.
#pragma once

#include <map>
#include <vector>

#include "io/safetensors.h"
#include "model/tensor_table.h"

namespace sluice {

class QuantizedCheckpointReader {
 public:
  QuantizedCheckpointReader(const ModelConfig& c, ModelWeights& w);
  // When the config is quantized and the entry is an expert or dense-MLP matrix: checks `got`
  // (dtype, shape) and its scale tensor (present, F32, [n, k / group]), each failure naming the
  // file, the tensor and what was expected, and returns the scale tensor. Null: not a quantized
  // one.
  const TensorEntry* check(const Checkpoint& ckpt, const ExpectedTensor& want,
                           const TensorEntry& got) const;
  // check, and takes the matrix for pack(). False: not a quantized one.
  bool add(const Checkpoint& ckpt, const ExpectedTensor& want, const TensorEntry& got);
  // Packs every taken matrix into its slot ([E, bytes] or [bytes] U8), the checkpoint's pages of
  // each dropped once packed.
  void pack();

 private:
  struct Matrix {
    const TensorEntry* values;
    const TensorEntry* scales;
    int64_t n, k;
  };
  struct Slot {
    std::vector<Matrix> experts;  // one for an unstacked slot
    bool stacked = false;
  };
  const ModelConfig& c_;
  std::map<const Tensor*, int> layer_of_;  // expert and dense-MLP slots → layer
  std::map<Tensor*, Slot> slots_;
};

}  // namespace sluice
