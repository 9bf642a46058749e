// Writing a Hugging Face folder as a GGUF file, in the manner of llama.cpp's
// convert_hf_to_gguf.py: the metadata keys and tensor names of the family's GgufNaming, the
// experts of a layer stacked [E, ...], q/k rows permuted for arch llama, DeepSeek's kv_b split
// into attn_k_b and attn_v_b, FP8 weights dequantised, MTP layers left out, norms and other
// vectors in F32, the tokenizer as a "gpt2" vocabulary. Tensors are converted as the file is
// written, expert by expert, so a model larger than memory can be exported.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "io/gguf_writer.h"

namespace sluice {

// The type of the file's matrices: F32, BF16, or the block types Q8_0 / Q4_0 (for matrices
// whose rows are whole blocks of 32; others stay F32, as llama.cpp's quantize falls back).
enum class GgufWeights { kF32, kBF16, kQ8_0, kQ4_0 };
const char* gguf_weights_name(GgufWeights w);
// "f32", "bf16", "q8_0", "q4_0" (any case); an error naming `what` and the choices otherwise.
GgufWeights parse_gguf_weights(const std::string& s, const std::string& what);

// Whether a tensor of this shape is stored in the block types: matrices whose rows are whole
// blocks of 32.
bool stored_quantized(const Shape& shape);

// DeepSeek's kv_b_proj as llama.cpp's converter writes it now (attn_k_b and attn_v_b) or as
// files made before its MLA KV cache have it (attn_kv_b).
enum class GgufLatentKv { kSplit, kWhole };

// llama.cpp's converter permutation of q/k rows (LlamaModel.permute): within each head of d rows,
// checkpoint row j·d/2 + i is stored at 2i + j.
std::vector<uint8_t> permute_qk_rows(const void* src, int64_t heads, int64_t head_dim,
                                     size_t row_bytes);

// Writes the folder `hf_dir` (config.json, safetensors, tokenizer.json) as `out`; with `parts`
// > 1 as out's name-0000k-of-0000n split files, tensors dealt in turn (returns the first).
// `edit`, when given, changes the (first) file before it is written.
std::filesystem::path export_gguf(const std::filesystem::path& hf_dir,
                                  const std::filesystem::path& out, GgufWeights weights,
                                  int parts = 1, const std::function<void(GgufWriter&)>& edit = {},
                                  GgufLatentKv latent_kv = GgufLatentKv::kSplit);

}  // namespace sluice
