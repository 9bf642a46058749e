// Quantized expert weights (ExpertQuant in config.h): which tensors are quantized, their packed
// form in memory, quantizing a loaded model's experts, and the checkpoint form `sluice quantize`
// writes and load_model reads (documented in README.md, "Quantized checkpoints").
//
// In memory a quantized slot of LayerWeights (expert_gate/up/down, mlp_gate/up/down) is a U8
// tensor of packed matrices (kernels/cpu/gemm_int8.h's layout): [E, quant_bytes] stacked for the
// routed experts, [quant_bytes] for the dense MLP. Their n × k shape follows from the config.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/cpu/gemm_int8.h"
#include "model/weights.h"

namespace sluice {

struct TensorEntry;  // io/safetensors.h

// The default group size, 128. Quality (ExpertQuantQuality.ErrorGrowsWithTheGroupSize, random
// Mixtral-shaped model, hidden 256, relative L2 error against bf16): int8 worst-layer FFN error
// 1.39% / 1.59% / 1.75% / 1.99% and final logits 0.72% / 0.82% / 0.88% / 1.00% at groups
// 32 / 64 / 128 / 256; int4 layer error 12.2% / 12.5% / 12.8% / 12.9% (its logit error is noisy,
// 6-13%). Bytes: the fp32 scales add 4/group per weight, 3% of int8 at 128 against 12.5% at 32
// (int4: 6% against 25%), and the kernels fold one fp32 scale product per group and row.
// 128 keeps most of the quality of 32 at a quarter of the scale bytes, and divides every expert
// width of the presets (bench-kernels --int8-group measures the speed; README.md).
constexpr int kDefaultExpertGroup = 128;

std::string_view expert_dtype_name(ExpertDtype d);  // "bf16", "int8", "int4"
// Parses "bf16", "int8", "int4"; anything else fails naming `source` and the accepted values.
ExpertDtype parse_expert_dtype(std::string_view name, const std::string& source);
cpu::QuantFormat quant_format(ExpertDtype d);  // int8 or int4 (bf16 is an error)

// Whether `slot` is one of a layer's expert or dense-MLP matrices (what --expert-dtype
// quantizes), and its n × k (out × in) shape in layer `layer`.
bool is_expert_slot(const LayerWeights& L, const Tensor* slot);
struct MatrixShape {
  int64_t n = 0, k = 0;
};
MatrixShape expert_slot_shape(const ModelConfig& c, int layer, const LayerWeights& L,
                              const Tensor* slot);

// The group size a quantization of `c` uses: `requested`, or with 0 the default; fails naming
// `source` (e.g. "--expert-group" or config.json's field) when it does not divide the row
// length of every expert matrix, or is not a multiple of the format's 4 / 8.
int resolve_expert_group(const ModelConfig& c, ExpertDtype d, int requested,
                         const std::string& source);

// Bytes of one n × k expert matrix as the config holds it: 2·n·k in bf16, n·k and the block
// scales with FP8 weights, else packed.
size_t expert_matrix_bytes(const ModelConfig& c, int64_t n, int64_t k);

// The packed n × k matrix at `packed` in the config's quantization.
cpu::QuantView quant_view(const ModelConfig& c, const void* packed, int64_t n, int64_t k);

// The packed matrix `e` of a quantized stacked slot (e >= 0), or of a whole unstacked one (-1).
cpu::QuantView quant_matrix(const ModelConfig& c, const Tensor& slot, int64_t n, int64_t k,
                            int64_t e = -1);

// The quantization a model of config `c` runs with when `requested` (from --expert-dtype and
// --expert-group; `source` names the model in errors): a quantized checkpoint's own (asking for
// another dtype or group is an error), else `requested` with its group resolved.
ExpertQuant resolve_expert_quant(const ModelConfig& c, ExpertQuant requested,
                                 const std::string& source);

// Matrix `e` of an expert slot (-1: a dense-MLP slot) as the reference forward multiplies it: the
// slot's own view in bf16, or the quantized weights dequantized to fp32 (scale · q).
Tensor expert_matrix_f32(const ModelConfig& c, const Tensor& slot, int64_t e, int64_t n, int64_t k);

// Quantizes every expert and dense-MLP matrix of a loaded model (a model made in memory, or what
// load_model does not quantize as it reads: FP8 and fused experts, GGUF files), one matrix at a
// time, and records `q` (group resolved) in model.config. Slots already quantized (U8, by
// load_model) are kept. bf16: nothing to do (a quantized checkpoint stays as it is); int8/int4
// on an already quantized model must be its own dtype and group (else an error).
void quantize_model_experts(Model& model, ExpertQuant q);

// One slot quantized from its matrices in the mapped checkpoint (bf16, f16 or f32, each n × k):
// [E, quant_bytes] when `stacked`, else the one matrix's [quant_bytes]. Each matrix's pages are
// dropped from the mapping once it is quantized (load_model's quantize-at-load).
Tensor quantize_mapped_matrices(const std::vector<const TensorEntry*>& matrices, ExpertQuant q,
                                bool stacked);

// The checkpoint form, per matrix `<name>` (a ".weight" tensor of the bf16 checkpoint):
//   int8: <name> I8 [n, k], q in [-127, 127];  int4: <name> U8 [n, k/2], two q + 8 per byte
//   (column 2i in the low nibble); and <name>_scale F32 [n, k / group_size].
std::string scale_tensor_name(const std::string& weight_name);
Shape quantized_tensor_shape(ExpertDtype d, int64_t n, int64_t k);
DType quantized_tensor_dtype(ExpertDtype d);

// The config.json field: "quantization": {"expert_dtype": "int8", "group_size": 128}.
void read_quantization_field(const nlohmann::json& j, const std::string& source, ModelConfig& c);
void write_quantization_field(const ModelConfig& c, nlohmann::json& j);

}  // namespace sluice
