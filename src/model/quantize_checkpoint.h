// `sluice quantize`: a bf16 (or F16/F32) Hugging Face model folder in, a folder with quantized
// expert weights out (the checkpoint form of expert_quant.h, README.md "Quantized checkpoints").
#pragma once

#include <filesystem>

#include "model/config.h"

namespace sluice {

struct QuantizeStats {
  size_t bytes_in = 0, bytes_out = 0;  // tensor bytes read and written
  int matrices = 0;                    // expert and dense-MLP matrices quantized
  int group_size = 0;
};

// Streams tensor by tensor, one matrix in memory at a time: every expert and dense-MLP matrix
// quantized (values, then <name>_scale), every other tensor copied as it is, into
// out/model.safetensors; config.json gains the "quantization" field; every other file of the
// folder (tokenizer, generation config) is copied. `group_size` 0: the default.
QuantizeStats quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                  ExpertDtype dtype, int group_size);

}  // namespace sluice
