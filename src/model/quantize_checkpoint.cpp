#include "model/quantize_checkpoint.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/staged_output.h"
#include "model/expert_quant.h"
#include "model/tensor_table.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

// What one output tensor is made from.
struct Planned {
  const TensorEntry* source;
  bool quantized;
  int64_t n = 0, k = 0;
};

std::vector<Planned> plan_tensors(const ModelConfig& c, const Checkpoint& ckpt,
                                  std::vector<TensorSpec>& specs) {
  ModelWeights slots;
  const TensorTable table = tensor_table(c, slots);
  std::set<std::string> seen;
  std::vector<Planned> plan;
  for (const ExpectedTensor& want : table.tensors) {
    if (!seen.insert(want.name).second) continue;  // a fused tensor, listed once per part
    const TensorEntry* got = ckpt.find(want.name);
    if (!got) fail("{}: tensor '{}' is missing", ckpt.files()[0].string(), want.name);
    bool expert = false;
    for (const LayerWeights& L : slots.layers) expert |= is_expert_slot(L, want.slot);
    if (!expert) {
      specs.push_back({want.name, got->dtype, got->shape});
      plan.push_back({got, false});
      continue;
    }
    if (want.mapping != TensorMapping::kWhole)
      fail("{}: tensor '{}': quantized checkpoints of {} are not supported (its checkpoint fuses "
           "the experts into one tensor); run it with --expert-dtype, which quantizes at load",
           got->file->path().string(), want.name, c.architecture);
    if (got->dtype != DType::BF16 && got->dtype != DType::F16 && got->dtype != DType::F32)
      fail("{}: tensor '{}': expected BF16, F16 or F32 weights to quantize, got {}",
           got->file->path().string(), want.name, dtype_name(got->dtype));
    const int64_t n = got->shape[0], k = got->shape[1];
    const ExpertDtype d = c.expert_quant.dtype;
    specs.push_back({want.name, quantized_tensor_dtype(d), quantized_tensor_shape(d, n, k)});
    specs.push_back({scale_tensor_name(want.name), DType::F32, {n, k / c.expert_quant.group_size}});
    plan.push_back({got, true, n, k});
  }
  return plan;
}

// Quantizes one matrix and streams its values and scales.
void write_quantized(const ModelConfig& c, const Planned& p, SafetensorsWriter& out) {
  const ExpertQuant& q = c.expert_quant;
  const TensorEntry& e = *p.source;
  std::vector<uint16_t> w(size_t(p.n * p.k));
  const auto* src = reinterpret_cast<const char*>(e.file->data() + e.offset);
  if (e.dtype == DType::BF16) {
    std::memcpy(w.data(), src, w.size() * 2);
  } else {
    std::vector<float> f(w.size());
    to_f32(e.dtype, src, f.data(), f.size());
    for (size_t i = 0; i < f.size(); ++i) w[i] = f32_to_bf16(f[i]);
  }
  std::vector<int8_t> values(w.size());
  std::vector<float> scales(size_t(p.n * (p.k / q.group_size)));
  cpu::quantize_rows(quant_format(q.dtype), w.data(), p.n, p.k, q.group_size, values.data(),
                     scales.data());
  if (q.dtype == ExpertDtype::kInt4) {
    std::vector<uint8_t> nibbles(values.size() / 2);
    cpu::int4_to_nibbles(values.data(), int64_t(values.size()), nibbles.data());
    out.write(nibbles.data(), nibbles.size());
  } else {
    out.write(values.data(), values.size());
  }
  out.write(scales.data(), scales.size() * sizeof(float));
}

void write_config(const fs::path& in, const fs::path& out, const ModelConfig& c) {
  std::ifstream f(in / "config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  write_quantization_field(c, j);
  std::ofstream o(out / "config.json");
  o << j.dump(2) << "\n";
  if (!o) fail("{}: could not write config.json", out.string());
}

// Every file of the folder that is not a weight or the config: tokenizer files, generation
// config, chat template.
void copy_other_files(const fs::path& in, const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(in)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), out / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

QuantizeStats quantize_checkpoint(const fs::path& in, const fs::path& out_dir, ExpertDtype dtype,
                                  int group_size) {
  if (dtype == ExpertDtype::kBf16)
    fail("quantize: --expert-dtype: expected int8 or int4 (bf16 is the input's own form)");
  if (!fs::exists(in / "config.json"))
    fail("{}: no config.json (expected a Hugging Face model folder)", in.string());
  ModelConfig c = load_config(in / "config.json");
  if (c.expert_quant.quantized())
    fail("{}: config.json field 'quantization': the experts are already {}; quantize the bf16 "
         "checkpoint",
         in.string(), expert_dtype_name(c.expert_quant.dtype));
  if (c.fp8_weights)
    fail(
        "{}: config.json field 'quantization_config': `sluice quantize` does not convert FP8 "
        "checkpoints; run the model with --expert-dtype {}, which quantizes its dequantised "
        "experts at load",
        in.string(), expert_dtype_name(dtype));
  c.expert_quant = {dtype, resolve_expert_group(c, dtype, group_size, "--expert-group")};
  if (fs::exists(out_dir) && fs::equivalent(in, out_dir))
    fail("quantize: --out {} is the input folder; write to a new one", out_dir.string());
  const Checkpoint ckpt = Checkpoint::open(in);
  std::vector<TensorSpec> specs;
  const std::vector<Planned> plan = plan_tensors(c, ckpt, specs);
  StagedDirectory staged(out_dir);  // complete or absent, even after kill -9
  const fs::path& out = staged.path();
  QuantizeStats stats;
  stats.group_size = c.expert_quant.group_size;
  {
    SafetensorsWriter writer(out / "model.safetensors", specs,
                             {{"format", "pt"}, {"quantized_by", "sluice"}});
    for (const Planned& p : plan) {
      stats.bytes_in += p.source->nbytes;
      if (p.quantized) {
        write_quantized(c, p, writer);
        ++stats.matrices;
      } else {
        writer.write(p.source->file->data() + p.source->offset, p.source->nbytes);
      }
    }
    writer.finish();
  }
  for (const TensorSpec& s : specs) stats.bytes_out += size_t(shape_numel(s.shape)) * dtype_size(s.dtype);
  write_config(in, out, c);
  copy_other_files(in, out);
  staged.commit();
  return stats;
}

}  // namespace sluice
