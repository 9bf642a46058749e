// Where each routed expert's weights are in a checkpoint's files: what the disk tier reads when
// the experts stay on disk (load_model with LoadOptions::experts_on_disk). Every expert of every
// MoE layer has its gate, up and down matrices (bf16; a quantized checkpoint's int8 / int4 values
// with their F32 group scales; or FP8 e4m3 codes with their F32 128 x 128 block scales,
// model/fp8_weights.h) as byte ranges of the checkpoint's files: a tensor each, or a slice of a
// tensor that holds all the experts of a layer one after the other (DBRX's [E·I, H]).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "io/safetensors.h"
#include "model/tensor_table.h"

namespace sluice {

struct FileRange {
  int file = -1;  // index into ExpertFiles::files
  uint64_t offset = 0;
  size_t bytes = 0;
};

struct ExpertSource {
  std::array<FileRange, 3> weights;  // gate, up, down, as the checkpoint stores them
  std::array<FileRange, 3> scales;   // quantized or FP8: each matrix's group or block scales
};

struct ExpertFiles {
  std::vector<std::filesystem::path> files;
  std::vector<std::vector<ExpertSource>> layers;  // [layer][expert]; empty for a dense layer
  bool quantized = false;  // int8 / int4 values and group scales (packed as they arrive)
  bool fp8 = false;        // F8_E4M3 codes and block scales (the GEMM reads them as stored)
  // Per matrix (gate, up, down): stored transposed, bf16 [k, n] (DBRX's w2, used as act @ w2);
  // the pool transposes each into the kernels' [n, k] as it lands.
  std::array<bool, 3> transposed{};

  bool has_scales() const { return quantized || fp8; }

  // Bytes of one expert in the files (its three matrices, and their scales).
  size_t expert_file_bytes() const;
  int64_t expert_count() const;  // over all layers
};

// Collects the routed experts' ranges while load_model reads the tensor table.
class ExpertFilesBuilder {
 public:
  explicit ExpertFilesBuilder(const ModelWeights& w);
  // Whether `want` is one routed expert's matrix, or every expert's of a layer (what stays on
  // disk).
  bool takes(const ExpectedTensor& want) const;
  // Records its checked checkpoint entry (and, quantized or FP8, its scales): one range per
  // expert.
  void add(const ExpectedTensor& want, const TensorEntry& weights, const TensorEntry* scales);
  // Checks that every expert of every MoE layer has its three matrices, each of one size, and
  // that they are FP8 exactly when config.json declares FP8 weights (what the planner counts).
  std::shared_ptr<const ExpertFiles> finish(const ModelConfig& c, const std::string& source);

 private:
  FileRange range_of(const TensorEntry& e);
  ExpertSource& expert_source(int layer, int expert);
  std::map<const Tensor*, std::pair<int, int>> slot_of_;  // expert slot → (layer, matrix)
  std::map<std::string, int> file_index_;
  int64_t fp8_matrices_ = 0, matrices_ = 0;
  std::shared_ptr<ExpertFiles> files_ = std::make_shared<ExpertFiles>();
};

}  // namespace sluice
