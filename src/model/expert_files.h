// Where each routed expert's weights are in a checkpoint's files: what the disk tier reads when
// the experts stay on disk (load_model with LoadOptions::experts_on_disk). Every expert of every
// MoE layer has its gate, up and down matrices (bf16; a quantized checkpoint's int8 / int4 values
// with their F32 group scales; or FP8 e4m3 codes with their F32 128 x 128 block scales,
// model/fp8_weights.h) as byte ranges of the checkpoint's files: a tensor each, or a slice of a
// tensor that holds all the experts of a layer one after the other (DBRX's [E·I, H], a GGUF
// file's [E, n, k]).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "io/safetensors.h"
#include "model/tensor_table.h"

namespace sluice {

struct FileRange {
  int file = -1;  // index into ExpertFiles::files
  uint64_t offset = 0;
  size_t bytes = 0;
};

// How a layer's matrix (gate, up or down) is stored where the kernels cannot take it as read: the
// pool makes bf16 [n, k] of it as each expert lands.
struct StoredMatrix {
  bool transposed = false;              // bf16 [k, n] (DBRX's w2, used as act @ w2)
  std::optional<uint32_t> gguf_blocks;  // a GGUF block type, dequantised (io/gguf_dequant.h)
  bool made_on_read() const { return transposed || gguf_blocks.has_value(); }
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
  std::vector<std::array<StoredMatrix, 3>> stored;  // [layer]

  // Whether matrix j is made on read in any layer.
  bool made_on_read(size_t j) const;

  bool has_scales() const { return quantized || fp8; }

  // Bytes of one expert in the files (its three matrices, and their scales): the most of any
  // layer (a GGUF file may store some layers' matrices in a wider type).
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
  // A GGUF file's stacked tensor [experts, n, k] of `want`'s slot at `offset` of `file`, of
  // ggml type `ggml_type` (BF16, read as stored, or a block type, dequantised as it lands).
  void add_gguf(const ExpectedTensor& want, const std::filesystem::path& file, uint64_t offset,
                size_t bytes, int experts, uint32_t ggml_type);
  // Checks that every expert of every MoE layer has its three matrices, each of one size, and
  // that they are FP8 exactly when config.json declares FP8 weights (what the planner counts).
  std::shared_ptr<const ExpertFiles> finish(const ModelConfig& c, const std::string& source);

 private:
  FileRange range_of(const std::filesystem::path& file, uint64_t offset, size_t bytes);
  // Each of `experts` experts of the layer a slice of `all`.
  void add_slices(int layer, int matrix, const FileRange& all, int experts);
  ExpertSource& expert_source(int layer, int expert);
  std::map<const Tensor*, std::pair<int, int>> slot_of_;  // expert slot → (layer, matrix)
  std::map<std::string, int> file_index_;
  int64_t fp8_matrices_ = 0, matrices_ = 0;
  std::shared_ptr<ExpertFiles> files_ = std::make_shared<ExpertFiles>();
};

}  // namespace sluice
