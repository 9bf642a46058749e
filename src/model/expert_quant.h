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

// The default group size. Measured (README.md, "Quantized experts"; tests/unit/
// expert_quant_test.cpp measures the error): on the tiny models, group 32 → 128 raises the
// final-logit error of int8 only from 0.26% to 0.35% (int4: 4.2% to 5.9%), while the Mixtral
// expert GEMM gains ~6–12% from 128 (fewer fp32 folds per int32 dot product; `bench-kernels
// --int8-group`), and the scales cost 3% of the weight bytes at 128 against 12.5% (int8) or
// 25% (int4) at 32. 128 divides every expert width of the presets.
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

// Bytes of one n × k expert matrix as the config holds it: 2·n·k in bf16, else packed.
size_t expert_matrix_bytes(const ModelConfig& c, int64_t n, int64_t k);

// The packed matrix `e` of a quantized stacked slot (e >= 0), or of a whole unstacked one (-1).
cpu::QuantView quant_matrix(const ModelConfig& c, const Tensor& slot, int64_t n, int64_t k,
                            int64_t e = -1);

// Matrix `e` of an expert slot (-1: a dense-MLP slot) as the reference forward multiplies it: the
// slot's own view in bf16, or the quantized weights dequantized to fp32 (scale · q).
Tensor expert_matrix_f32(const ModelConfig& c, const Tensor& slot, int64_t e, int64_t n,
                         int64_t k);

// Quantizes every expert and dense-MLP matrix of a loaded bf16 model (quantize-at-load), one
// matrix at a time, and records `q` (group resolved) in model.config. bf16: nothing to do (a
// quantized checkpoint stays as it is); int8/int4 on an already quantized model must be its own
// dtype and group (else an error).
void quantize_model_experts(Model& model, ExpertQuant q);

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
