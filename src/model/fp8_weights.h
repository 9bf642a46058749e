// FP8 checkpoints as DeepSeek-V3 and R1 (and Qwen3's -FP8 releases) store them: config.json's
//   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//                           "weight_block_size": [128, 128]}
// and, for each linear layer the checkpoint quantized, `<name>.weight` F8_E4M3 [n, k] with
// `<name>.weight_scale_inv` F32 [⌈n/128⌉, ⌈k/128⌉] (the weight is code · scale per 128 × 128
// block, kernels/cpu/gemm_fp8.h). Which layers are FP8 is read from the tensors' dtypes (V3:
// every projection but the embedding, the router and lm_head). They stay FP8 in memory, the
// scales riding along in Tensor::block_scales; the GEMMs dequantise them tile by tile. The
// activations are not quantized (transformers' GPU kernel quantizes them to FP8 per 128
// values; sluice's CPU path, like transformers' dequantising fallback, multiplies in bf16).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_fp8.h"
#include "model/weights.h"

namespace sluice {

// config.json's quantization_config: sets c.fp8_weights; anything but the FP8 block format
// above fails naming the field and the value expected.
void read_fp8_quantization_config(const nlohmann::json& j, const std::string& source,
                                  ModelConfig& c);
void write_fp8_quantization_config(const ModelConfig& c, nlohmann::json& j);

// "model.layers.0.mlp.down_proj.weight" → "model.layers.0.mlp.down_proj.weight_scale_inv".
std::string fp8_scale_name(const std::string& weight_name);
Shape fp8_scale_shape(int64_t n, int64_t k);    // [⌈n/128⌉, ⌈k/128⌉]
size_t fp8_matrix_bytes(int64_t n, int64_t k);  // n·k codes and the fp32 block scales
// Bytes of an n × k projection as the config holds it: fp8_matrix_bytes with FP8 weights, else
// 2·n·k in bf16 (quantized experts: expert_matrix_bytes).
size_t projection_bytes(const ModelConfig& c, int64_t n, int64_t k);

// The largest FP8 matrix a device GEMM reads (the attention projections, and the experts and
// dense MLPs unless they are quantized), in elements; 0 without FP8 weights.
int64_t largest_fp8_matrix(const ModelConfig& c);
// The device scratch an FP8 GEMM may dequantise row panels of W into before a bf16 GEMM
// (offload::DeviceMath::gemm_fp8): the largest FP8 matrix, at most kFp8TileMaxElements (16 MiB
// of bf16; a panel then still holds hundreds of rows of the widest matrix, DeepSeek-V3's
// 7168 × 18432 dense down_proj). 0 without FP8 weights.
constexpr int64_t kFp8TileMaxElements = int64_t(8) << 20;
int64_t fp8_tile_elements(const ModelConfig& c);

// Whether a canonical slot may hold FP8: the projections the GEMMs read (attention, MLA,
// experts, dense MLP), not the embedding, norms, biases, router or lm_head.
bool fp8_slot_allowed(const ModelWeights& w, const Tensor* slot);

// The kernel's view of an F8_E4M3 matrix [n, k] with its block scales.
cpu::Fp8Matrix fp8_matrix(const Tensor& t);

// A 2-D matrix of any weight dtype as bf16 rows (FP8 dequantised by the kernels' rule).
std::vector<uint16_t> matrix_bf16(const Tensor& t);

// Quantizes bf16 W [n, k] as transformers' Fp8Quantize does, with partial edge blocks: per
// block scale = 448 / max|w| (1 for an all-zero block), code = e4m3(w · scale) (nearest even),
// and weight_scale_inv = 1 / scale. `codes` [n, k], `scale_inv` fp8_scale_shape(n, k).
void quantize_fp8_blocks(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes, float* scale_inv);

}  // namespace sluice
