// Loading a model from a GGUF file (llama.cpp's format, io/gguf.h) through the family
// descriptions: the family is the one whose GgufNaming has the file's general.architecture (and
// reads it: deepseek2 is DeepSeek-V2 or V3); the GGUF metadata becomes the config.json fields its
// reader takes, and each tensor of its strict table (tensor_table.h) is looked up under its GGUF
// name (a fused one sliced as the table says, DeepSeek's split kv_b joined). F32, F16 and BF16
// tensors are views of the mapping (small ones copied); Q8_0, Q4_0, Q4_K, Q5_K and Q6_K are
// dequantised to BF16 at load (one line on stderr says so); any other type is an error naming the
// tensor and the type. With the experts on disk (the disk tier), the routed experts' stacked
// tensors are not read: each expert is a slice of its file, in BF16 or a block type the pool
// dequantises as it lands.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "io/gguf.h"
#include "model/family.h"
#include "model/weights.h"

namespace sluice {

Model load_gguf_model(const std::filesystem::path& path, bool experts_on_disk = false);
// Only the config, from the metadata (no tensor data is read).
ModelConfig load_gguf_config(const std::filesystem::path& path);
// Why the disk tier cannot read the file's routed experts (their type); "" when it can.
std::string gguf_disk_tier_refusal(const std::filesystem::path& path);

// The family a GGUF file holds (an error naming general.architecture when no family reads it).
const FamilySpec& gguf_family(const GgufFile& g);
// The config.json document the GGUF metadata stands for, as the family's reader takes it.
nlohmann::json gguf_config_json(const GgufFile& g, const FamilySpec& spec);
// The GGUF name of checkpoint tensor `name` ("model.layers.3.mlp.experts.5.up_proj.weight" →
// "blk.3.ffn_up_exps.weight"), and how its rows are stored; empty when the naming has none.
struct GgufName {
  std::string name;
  GgufRows rows = GgufRows::kAsIs;
};
GgufName gguf_tensor_name(const GgufNaming& naming, const std::string& name);

// Undoes llama.cpp's q/k row permutation (GgufRows) on a [heads·head_dim, ...] tensor of
// `row_bytes` bytes per row: stored row h·d + 2i + j is checkpoint row h·d + j·d/2 + i.
void unpermute_qk_rows(const void* src, void* dst, int64_t heads, int64_t head_dim,
                       size_t row_bytes);

}  // namespace sluice
