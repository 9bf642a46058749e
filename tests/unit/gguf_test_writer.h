// Test-only GGUF writing: a byte-level writer of GGUF images (header, typed metadata, tensor
// infos, aligned data), llama.cpp's reference quantisers for Q8_0 and Q4_0, and a converter
// from a Hugging Face folder to a GGUF file in the manner of llama.cpp's convert_hf_to_gguf.py
// (metadata keys and tensor names from the family's GgufNaming, experts stacked, q/k rows
// permuted for arch llama, norms in F32).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/gguf.h"
#include "model/weights.h"

namespace sluice::testing {

class GgufImageWriter {
 public:
  void add(const std::string& key, GgufType type, nlohmann::json value,
           GgufType element = GgufType::kU8);
  // `dims` fastest-first (ggml's ne); `bytes` the tensor's data in ggml type `type`.
  void add_tensor(const std::string& name, uint32_t type, Shape dims, std::vector<uint8_t> bytes);
  // Edits for tests of bad files: replace a key's value (adding it when absent), drop a key,
  // change a tensor's declared type or dims (its bytes stay).
  void replace(const std::string& key, GgufType type, nlohmann::json value);
  void remove(const std::string& key);
  void retype_tensor(const std::string& name, uint32_t type);
  void remove_tensor(const std::string& name);
  void redim_tensor(const std::string& name, Shape dims);
  bool has_tensor(const std::string& name) const;
  // The whole file. `alignment` pads the data section and each tensor; `version` the header's.
  std::string image(size_t alignment = 32, uint32_t version = 3) const;
  void write(const std::filesystem::path& path, size_t alignment = 32) const;

  // The offset of tensor `index`'s info in image(), for tests that corrupt it: the position of
  // its 'type' field (the offset field follows it, 4 bytes later).
  size_t tensor_type_field_offset(size_t index) const;

 private:
  struct Kv {
    std::string key;
    GgufType type, element;
    nlohmann::json value;
  };
  struct T {
    std::string name;
    uint32_t type;
    Shape dims;
    std::vector<uint8_t> bytes;
  };
  std::string header_and_infos(size_t alignment, uint32_t version) const;
  std::vector<Kv> kvs_;
  std::vector<T> tensors_;
};

// llama.cpp's quantize_row_q8_0_ref and quantize_row_q4_0_ref (n a multiple of 32).
std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n);
std::vector<uint8_t> quantize_q4_0(const float* x, int64_t n);

// llama.cpp's converter permutation of q/k rows (LlamaModel.permute): within each head of d rows,
// checkpoint row j·d/2 + i is stored at 2i + j.
std::vector<uint8_t> permute_qk_rows(const void* src, int64_t heads, int64_t head_dim,
                                     size_t row_bytes);

enum class GgufWeights { kF32, kBF16, kQ8_0, kQ4_0 };
const char* gguf_weights_name(GgufWeights w);

// Whether a tensor of this shape is stored quantised in kQ8_0 / kQ4_0 files: matrices whose rows
// are whole blocks of 32 (as llama.cpp's quantize falls back for others); vectors stay F32.
bool stored_quantized(const Shape& shape);

// DeepSeek's kv_b_proj as llama.cpp's converter writes it now (attn_k_b and attn_v_b) or as
// files made before its MLA KV cache have it (attn_kv_b).
enum class GgufLatentKv { kSplit, kWhole };

// Writes the Hugging Face folder `hf_dir` (config.json, safetensors, tokenizer.json and
// tokenizer_config.json) as `out` in `weights`; with `parts` > 1 as out's name-0000k-of-0000n
// split files (returns the first). As the converter does, DeepSeek's MTP layers are left out and
// FP8 weights dequantised; DBRX's flat experts are stacked (w2 transposed).
// `edit`, when given, changes the (first) file before it is written.
std::filesystem::path convert_to_gguf(const std::filesystem::path& hf_dir,
                                      const std::filesystem::path& out, GgufWeights weights,
                                      int parts = 1,
                                      const std::function<void(GgufImageWriter&)>& edit = {},
                                      GgufLatentKv latent_kv = GgufLatentKv::kSplit);

// `m`'s weights as a kQ8_0 / kQ4_0 file stores them: each stored_quantized tensor quantised and
// dequantised, in BF16 (a tied lm_head follows the embedding).
void round_trip_quantized(Model& m, GgufWeights weights);

}  // namespace sluice::testing
