#include "model/expert_files.h"

#include <algorithm>

#include "core/error.h"
#include "io/gguf.h"

namespace sluice {

size_t ExpertFiles::expert_file_bytes() const {
  size_t most = 0;
  for (const auto& layer : layers)
    if (!layer.empty()) {
      size_t bytes = 0;
      for (int j = 0; j < 3; ++j) bytes += layer[0].weights[size_t(j)].bytes;
      for (int j = 0; j < 3; ++j) bytes += layer[0].scales[size_t(j)].bytes;
      most = std::max(most, bytes);
    }
  return most;
}

bool ExpertFiles::made_on_read(size_t j) const {
  for (const auto& layer : stored)
    if (layer[j].made_on_read()) return true;
  return false;
}

int64_t ExpertFiles::expert_count() const {
  int64_t n = 0;
  for (const auto& layer : layers) n += int64_t(layer.size());
  return n;
}

ExpertFilesBuilder::ExpertFilesBuilder(const ModelWeights& w) {
  for (int l = 0; l < int(w.layers.size()); ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    slot_of_[&L.expert_gate] = {l, 0};
    slot_of_[&L.expert_up] = {l, 1};
    slot_of_[&L.expert_down] = {l, 2};
  }
  files_->layers.resize(w.layers.size());
  files_->stored.resize(w.layers.size());
}

bool ExpertFilesBuilder::takes(const ExpectedTensor& want) const {
  const bool one_expert = want.mapping == TensorMapping::kWhole && want.expert >= 0;
  const bool all_experts = want.mapping == TensorMapping::kExpertsFlat ||
                           want.mapping == TensorMapping::kExpertsFlatTransposed;
  return (one_expert || all_experts) && slot_of_.count(want.slot) > 0;
}

FileRange ExpertFilesBuilder::range_of(const std::filesystem::path& file, uint64_t offset,
                                       size_t bytes) {
  auto [it, added] = file_index_.emplace(file.string(), int(files_->files.size()));
  if (added) files_->files.push_back(file);
  return {it->second, offset, bytes};
}

void ExpertFilesBuilder::add_slices(int layer, int matrix, const FileRange& all, int experts) {
  const size_t each = all.bytes / size_t(experts);
  for (int e = 0; e < experts; ++e) {
    expert_source(layer, e).weights[size_t(matrix)] = {all.file, all.offset + size_t(e) * each,
                                                       each};
    ++matrices_;
  }
}

ExpertSource& ExpertFilesBuilder::expert_source(int layer, int expert) {
  auto& experts = files_->layers[size_t(layer)];
  if (experts.size() <= size_t(expert)) experts.resize(size_t(expert) + 1);
  return experts[size_t(expert)];
}

void ExpertFilesBuilder::add(const ExpectedTensor& want, const TensorEntry& weights,
                             const TensorEntry* scales) {
  const auto [layer, matrix] = slot_of_.at(want.slot);
  if (weights.dtype == DType::F8_E4M3) ++fp8_matrices_;
  if (scales && weights.dtype != DType::F8_E4M3) files_->quantized = true;
  if (want.mapping == TensorMapping::kWhole) {
    ExpertSource& s = expert_source(layer, want.expert);
    s.weights[size_t(matrix)] = range_of(weights.file->path(), weights.offset, weights.nbytes);
    if (scales)
      s.scales[size_t(matrix)] = range_of(scales->file->path(), scales->offset, scales->nbytes);
    ++matrices_;
    return;
  }
  // Every expert of the layer, one slice each (the loader reads fused experts only in bf16, so
  // there are no scales to slice).
  if (scales)
    fail("{}: tensor '{}': the disk tier reads experts fused into one tensor only without scales",
         weights.file->path().string(), want.name);
  files_->stored[size_t(layer)][size_t(matrix)].transposed =
      want.mapping == TensorMapping::kExpertsFlatTransposed;
  add_slices(layer, matrix, range_of(weights.file->path(), weights.offset, weights.nbytes),
             int(want.experts));
}

void ExpertFilesBuilder::add_gguf(const ExpectedTensor& want, const std::filesystem::path& file,
                                  uint64_t offset, size_t bytes, int experts, uint32_t ggml_type) {
  const auto [layer, matrix] = slot_of_.at(want.slot);
  if (ggml_type != uint32_t(GgmlType::BF16))
    files_->stored[size_t(layer)][size_t(matrix)].gguf_blocks = ggml_type;
  add_slices(layer, matrix, range_of(file, offset, bytes), experts);
}

std::shared_ptr<const ExpertFiles> ExpertFilesBuilder::finish(const ModelConfig& c,
                                                              const std::string& source) {
  files_->fp8 = c.fp8_weights && !c.expert_quant.quantized();
  if (fp8_matrices_ != (files_->fp8 ? matrices_ : 0))
    fail("{}: {} of the {} routed expert matrices are F8_E4M3, and config.json {} FP8 weights: "
         "the disk tier reads experts of the kind the planner counts from the config ({}); give "
         "--host-mem enough for the whole model",
         source, fp8_matrices_, matrices_, c.fp8_weights ? "declares" : "does not declare",
         files_->fp8 ? "all FP8" : "none FP8");
  for (int l = 0; l < int(files_->layers.size()); ++l) {
    const auto& experts = files_->layers[size_t(l)];
    if (!c.is_moe_layer(l)) continue;
    if (experts.empty()) fail("{}: layer {}: no routed expert's tensors were found", source, l);
    if (int(experts.size()) != c.num_experts)
      fail("{}: layer {} has {} experts in its files, config.json says {}", source, l,
           experts.size(), c.num_experts);
    size_t first = 0;
    for (size_t e = 0; e < experts.size(); ++e) {
      size_t bytes = 0;
      for (int j = 0; j < 3; ++j) {
        if (experts[e].weights[size_t(j)].file < 0)
          fail("{}: layer {} expert {}: matrix {} of gate/up/down is missing", source, l, e, j);
        bytes += experts[e].weights[size_t(j)].bytes + experts[e].scales[size_t(j)].bytes;
      }
      if (e == 0) first = bytes;
      if (bytes != first)
        fail(
            "{}: layer {} expert {} holds {} bytes, the layer's first expert {}: the disk tier "
            "needs a layer's experts of one size",
            source, l, e, bytes, first);
    }
  }
  return files_;
}

}  // namespace sluice
