#include "model/quantized_checkpoint.h"

#include <cstring>

#include "core/error.h"
#include "model/expert_quant.h"

namespace sluice {

QuantizedCheckpointReader::QuantizedCheckpointReader(const ModelConfig& c, ModelWeights& w)
    : c_(c) {
  for (int l = 0; l < int(w.layers.size()); ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    for (const Tensor* t :
         {&L.expert_gate, &L.expert_up, &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down})
      layer_of_[t] = l;
  }
}

const TensorEntry* QuantizedCheckpointReader::check(const Checkpoint& ckpt,
                                                    const ExpectedTensor& want,
                                                    const TensorEntry& got) const {
  const ExpertQuant& q = c_.expert_quant;
  if (!q.quantized() || !layer_of_.count(want.slot)) return nullptr;
  const std::string file = got.file->path().string();
  if (want.mapping != TensorMapping::kWhole)
    fail(
        "{}: tensor '{}': quantized experts of {} are not supported (its checkpoint fuses the "
        "experts into one tensor); load the bf16 checkpoint with --expert-dtype instead",
        file, want.name, c_.architecture);
  const int64_t n = want.shape[0], k = want.shape[1];
  const Shape shape = quantized_tensor_shape(q.dtype, n, k);
  const DType dtype = quantized_tensor_dtype(q.dtype);
  if (got.dtype != dtype || got.shape != shape)
    fail(
        "{}: tensor '{}': expected {} {} ({} weights of the {}x{} matrix, config.json "
        "quantization.expert_dtype), got {} {}",
        file, want.name, dtype_name(dtype), shape_str(shape), expert_dtype_name(q.dtype), n, k,
        dtype_name(got.dtype), shape_str(got.shape));
  const std::string scale_name = scale_tensor_name(want.name);
  const Shape scale_shape = {n, k / q.group_size};
  const TensorEntry* scales = ckpt.find(scale_name);
  if (!scales)
    fail(
        "{}: tensor '{}' is missing: expected F32 {} group scales of '{}' (config.json "
        "quantization.group_size = {})",
        file, scale_name, shape_str(scale_shape), want.name, q.group_size);
  if (scales->dtype != DType::F32 || scales->shape != scale_shape)
    fail(
        "{}: tensor '{}': expected F32 {} (one scale per row and group of {} of the {}x{} "
        "matrix '{}'), got {} {}",
        scales->file->path().string(), scale_name, shape_str(scale_shape), q.group_size, n, k,
        want.name, dtype_name(scales->dtype), shape_str(scales->shape));
  return scales;
}

bool QuantizedCheckpointReader::add(const Checkpoint& ckpt, const ExpectedTensor& want,
                                    const TensorEntry& got) {
  const TensorEntry* scales = check(ckpt, want, got);
  if (!scales) return false;
  const int64_t n = want.shape[0], k = want.shape[1];
  Slot& slot = slots_[want.slot];
  slot.stacked = want.expert >= 0;
  const size_t index = size_t(std::max(want.expert, 0));
  if (slot.experts.size() <= index) slot.experts.resize(index + 1);
  slot.experts[index] = {&got, scales, n, k};
  return true;
}

void QuantizedCheckpointReader::pack() {
  const ExpertQuant& q = c_.expert_quant;
  for (auto& [tensor, slot] : slots_) {
    const Matrix& first = slot.experts[0];
    const cpu::QuantFormat f = quant_format(q.dtype);
    const size_t bytes = cpu::quant_bytes(f, first.n, first.k, q.group_size);
    const int64_t count = int64_t(slot.experts.size());
    // pack_weights_into writes every byte of each matrix.
    Tensor out = Tensor::allocate_for_overwrite(
        DType::U8, slot.stacked ? Shape{count, int64_t(bytes)} : Shape{int64_t(bytes)});
    std::vector<int8_t> unpacked;  // int4's values, one per byte
    std::vector<float> scales(size_t(first.n * (first.k / q.group_size)));
    for (int64_t e = 0; e < count; ++e) {
      const Matrix& m = slot.experts[size_t(e)];
      m.values->read_in();
      m.scales->read_in();
      const auto* src = reinterpret_cast<const int8_t*>(m.values->file->data() + m.values->offset);
      const int8_t* values = src;
      if (f == cpu::QuantFormat::kInt4) {
        unpacked.resize(size_t(m.n * m.k));
        cpu::nibbles_to_int4(
            reinterpret_cast<const uint8_t*>(src), int64_t(unpacked.size()), unpacked.data(),
            (m.values->file->path().string() + ": tensor '" + m.values->name + "'").c_str());
        values = unpacked.data();
      }
      std::memcpy(scales.data(), m.scales->file->data() + m.scales->offset, scales.size() * 4);
      try {
        cpu::pack_weights_into(f, values, scales.data(), m.n, m.k, q.group_size,
                               out.as<uint8_t>() + size_t(e) * bytes, /*parallel=*/true);
      } catch (const Error& err) {
        fail("{}: tensor '{}': {}", m.values->file->path().string(), m.values->name, err.what());
      }
      // Packed: the checkpoint's pages of this matrix leave the process (one copy resident).
      m.values->drop_pages();
      m.scales->drop_pages();
    }
    *tensor = std::move(out);
  }
}

}  // namespace sluice
