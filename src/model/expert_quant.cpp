#include "model/expert_quant.h"

#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/config_reader.h"
#include "model/fp8_weights.h"

namespace sluice {
namespace {

// The quantized form of a slot's `count` n × k matrices: [count, bytes] when stacked, else the
// one matrix's [bytes]. bf16_rows(e) gives matrix e's rows in bf16 (converted from F32/F16, or
// dequantised from FP8 blocks); only one matrix's are held at a time.
template <class Bf16Rows>
Tensor quantize_matrices(cpu::QuantFormat f, int64_t n, int64_t k, int group, int64_t count,
                         bool stacked, const Bf16Rows& bf16_rows) {
  const size_t bytes = cpu::quant_bytes(f, n, k, group);
  Tensor out =
      Tensor::allocate(DType::U8, stacked ? Shape{count, int64_t(bytes)} : Shape{int64_t(bytes)});
  for (int64_t e = 0; e < count; ++e) {
    const std::vector<uint16_t> rows = bf16_rows(e);
    cpu::quantize_weights_into(f, rows.data(), n, k, group, out.as<uint8_t>() + size_t(e) * bytes);
  }
  return out;
}

}  // namespace

std::string_view expert_dtype_name(ExpertDtype d) {
  switch (d) {
    case ExpertDtype::kBf16:
      return "bf16";
    case ExpertDtype::kInt8:
      return "int8";
    case ExpertDtype::kInt4:
      return "int4";
  }
  return "?";
}

ExpertDtype parse_expert_dtype(std::string_view name, const std::string& source) {
  for (ExpertDtype d : {ExpertDtype::kBf16, ExpertDtype::kInt8, ExpertDtype::kInt4})
    if (name == expert_dtype_name(d)) return d;
  fail("{}: unsupported expert dtype '{}'; expected bf16, int8 or int4", source, name);
}

cpu::QuantFormat quant_format(ExpertDtype d) {
  if (d == ExpertDtype::kBf16) fail("quant_format: bf16 experts are not quantized");
  return d == ExpertDtype::kInt8 ? cpu::QuantFormat::kInt8 : cpu::QuantFormat::kInt4;
}

bool is_expert_slot(const LayerWeights& L, const Tensor* slot) {
  for (const Tensor* t :
       {&L.expert_gate, &L.expert_up, &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down})
    if (t == slot) return true;
  return false;
}

MatrixShape expert_slot_shape(const ModelConfig& c, int layer, const LayerWeights& L,
                              const Tensor* slot) {
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size, D = c.dense_mlp_size(layer);
  if (slot == &L.expert_gate || slot == &L.expert_up) return {I, H};
  if (slot == &L.expert_down) return {H, I};
  if (slot == &L.mlp_gate || slot == &L.mlp_up) return {D, H};
  if (slot == &L.mlp_down) return {H, D};
  fail("expert_slot_shape: not an expert or dense-MLP slot");
}

int resolve_expert_group(const ModelConfig& c, ExpertDtype d, int requested,
                         const std::string& source) {
  if (d == ExpertDtype::kBf16) return 0;
  const int group = requested > 0 ? requested : kDefaultExpertGroup;
  const int64_t multiple = cpu::quant_group_multiple(quant_format(d));
  if (group % multiple != 0 || group > cpu::kInt8MaxGroup)
    fail("{}: group size {}: expected a multiple of {} up to {} for {} experts", source, group,
         multiple, cpu::kInt8MaxGroup, expert_dtype_name(d));
  std::vector<std::pair<const char*, int>> rows = {{"hidden_size", c.hidden_size}};
  if (c.num_experts > 0) rows.push_back({"moe intermediate size", c.expert_intermediate_size});
  for (int l = 0; l < c.num_layers; ++l)
    if (c.dense_mlp_size(l) > 0)
      rows.push_back({"dense MLP intermediate size", c.dense_mlp_size(l)});
  for (auto [what, k] : rows)
    if (k % group != 0)
      fail(
          "{}: group size {} does not divide the row length {} ({}) of the expert matrices; "
          "expected a group size that divides it{}",
          source, group, k, what,
          requested > 0
              ? ""
              : " (pass --expert-group, e.g. " + std::to_string(std::gcd(k, group)) + ")");
  return group;
}

size_t expert_matrix_bytes(const ModelConfig& c, int64_t n, int64_t k) {
  const ExpertQuant& q = c.expert_quant;
  if (!q.quantized()) return projection_bytes(c, n, k);
  return cpu::quant_bytes(quant_format(q.dtype), n, k, q.group_size);
}

cpu::QuantView quant_matrix(const ModelConfig& c, const Tensor& slot, int64_t n, int64_t k,
                            int64_t e) {
  const ExpertQuant& q = c.expert_quant;
  const cpu::QuantFormat f = quant_format(q.dtype);
  const size_t bytes = cpu::quant_bytes(f, n, k, q.group_size);
  const size_t have = slot.empty() ? 0 : slot.nbytes() / size_t(e >= 0 ? slot.shape[0] : 1);
  if (slot.dtype != DType::U8 || have != bytes)
    fail("quant_matrix: expected a packed {} matrix of {}x{} (group {}, {} bytes), got {} {}",
         expert_dtype_name(q.dtype), n, k, q.group_size, bytes, dtype_name(slot.dtype),
         shape_str(slot.shape));
  return quant_view(c, slot.as<const uint8_t>() + (e >= 0 ? size_t(e) * bytes : 0), n, k);
}

cpu::QuantView quant_view(const ModelConfig& c, const void* packed, int64_t n, int64_t k) {
  return {.format = quant_format(c.expert_quant.dtype),
          .n = n,
          .k = k,
          .group_size = c.expert_quant.group_size,
          .data = static_cast<const uint8_t*>(packed)};
}

Tensor expert_matrix_f32(const ModelConfig& c, const Tensor& slot, int64_t e, int64_t n,
                         int64_t k) {
  if (!c.expert_quant.quantized()) return e >= 0 ? slot.slice0(e) : slot;
  const cpu::QuantView v = quant_matrix(c, slot, n, k, e);
  Tensor out = Tensor::allocate(DType::F32, {n, k});
  float* w = out.as<float>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) w[j * k + p] = v.scale(j, p / v.group_size) * float(v.q(j, p));
  return out;
}

ExpertQuant resolve_expert_quant(const ModelConfig& c, ExpertQuant q, const std::string& source) {
  if (c.expert_quant.quantized()) {
    // The default bf16 takes a quantized checkpoint as it is.
    if (!q.quantized()) return c.expert_quant;
    if (q.dtype == c.expert_quant.dtype &&
        (q.group_size == 0 || q.group_size == c.expert_quant.group_size))
      return c.expert_quant;
    fail(
        "{}: the checkpoint's experts are {} (group {}); --expert-dtype {} (group {}) cannot "
        "requantize them: quantize the bf16 checkpoint instead",
        source, expert_dtype_name(c.expert_quant.dtype), c.expert_quant.group_size,
        expert_dtype_name(q.dtype), q.group_size);
  }
  if (!q.quantized()) return {};
  return {q.dtype, resolve_expert_group(c, q.dtype, q.group_size, "--expert-dtype")};
}

void quantize_model_experts(Model& model, ExpertQuant requested) {
  ModelConfig& c = model.config;
  const ExpertQuant q = resolve_expert_quant(c, requested, model.dir.string());
  if (!q.quantized() || c.expert_quant.quantized()) return;
  if (model.expert_files)
    fail(
        "{}: the experts stay on disk (the disk tier) and run as the checkpoint stores them; "
        "to run them {}, {}",
        model.dir.string(), expert_dtype_name(q.dtype),
        c.fp8_weights ? "give --host-mem enough for the whole model (they are quantized at "
                        "load; `sluice quantize` does not take FP8 folders)"
                      : "write a quantized copy with `sluice quantize` and run that");
  const cpu::QuantFormat f = quant_format(q.dtype);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = model.weights.layers[size_t(l)];
    for (Tensor* t :
         {&L.expert_gate, &L.expert_up, &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down}) {
      if (t->empty() || t->dtype == DType::U8) continue;
      const MatrixShape s = expert_slot_shape(c, l, L, t);
      const bool stacked = t == &L.expert_gate || t == &L.expert_up || t == &L.expert_down;
      *t = quantize_matrices(f, s.n, s.k, q.group_size, stacked ? c.num_experts : 1, stacked,
                             [&](int64_t e) { return matrix_bf16(stacked ? t->slice0(e) : *t); });
    }
  }
  c.expert_quant = q;
}

Tensor quantize_mapped_matrices(const std::vector<const TensorEntry*>& matrices, ExpertQuant q,
                                bool stacked) {
  const int64_t n = matrices[0]->shape[0], k = matrices[0]->shape[1];
  return quantize_matrices(quant_format(q.dtype), n, k, q.group_size, int64_t(matrices.size()),
                           stacked, [&](int64_t e) {
                             const TensorEntry& m = *matrices[size_t(e)];
                             m.read_in();
                             std::vector<uint16_t> rows = matrix_bf16(m.view());
                             m.drop_pages();  // converted: the mapping's copy is not read again
                             return rows;
                           });
}

std::string scale_tensor_name(const std::string& weight_name) {
  return weight_name + "_scale";
}

Shape quantized_tensor_shape(ExpertDtype d, int64_t n, int64_t k) {
  return d == ExpertDtype::kInt4 ? Shape{n, k / 2} : Shape{n, k};
}

DType quantized_tensor_dtype(ExpertDtype d) {
  return d == ExpertDtype::kInt4 ? DType::U8 : DType::I8;
}

void read_quantization_field(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  if (!j.contains("quantization")) return;
  const ConfigReader top(j, source);
  const ConfigReader r = top.object("quantization");
  const std::string name = r.string_or("expert_dtype", "");
  if (name.empty()) r.fail_field("expert_dtype", "expected \"int8\" or \"int4\"");
  const ExpertDtype d = parse_expert_dtype(name, source + ": field 'quantization.expert_dtype'");
  if (d == ExpertDtype::kBf16) return;
  if (!r.has("group_size")) r.fail_field("group_size", "missing (the experts' scale group size)");
  const int group = r.integer("group_size");
  c.expert_quant = {
      d, resolve_expert_group(c, d, group, source + ": field 'quantization.group_size'")};
}

void write_quantization_field(const ModelConfig& c, nlohmann::json& j) {
  if (!c.expert_quant.quantized()) return;
  j["quantization"] = {{"expert_dtype", std::string(expert_dtype_name(c.expert_quant.dtype))},
                       {"group_size", c.expert_quant.group_size},
                       {"format", "sluice-groupwise-symmetric"}};
}

}  // namespace sluice
