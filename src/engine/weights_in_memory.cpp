#include "engine/weights_in_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "model/expert_files.h"
#include "model/expert_quant.h"
#include "model/model_stats.h"
#include "runtime/memory_info.h"
#include "runtime/planner/planner.h"

namespace sluice {

namespace {

// `t` in memory of its own, with its FP8 block scales.
Tensor owned_copy(const Tensor& t) {
  Tensor copy = Tensor::allocate(t.dtype, t.shape);
  std::memcpy(copy.data, t.data, t.nbytes());
  if (t.block_scales)
    copy.block_scales = std::make_shared<const Tensor>(owned_copy(*t.block_scales));
  return copy;
}

// The files of a folder's safetensors, or those the disk tier reads of a GGUF file.
std::vector<std::filesystem::path> checkpoint_files(const Model& model) {
  if (!std::filesystem::is_directory(model.dir))
    return model.expert_files ? model.expert_files->files : std::vector<std::filesystem::path>{};
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(model.dir))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  return files;
}

// Every weight the model holds in its mapped files, copied into memory of its own (a tied
// lm_head stays the embedding), and the files' pages dropped from the page cache: the resident
// part of a model whose experts stay on disk is then held once, and a file changed while the job
// runs cannot touch it (a truncated mapping would fault).
void copy_resident_weights(Model& model) {
  std::map<const void*, Tensor> copies;
  auto own = [&](const Tensor& t) {
    if (t.empty()) return;
    auto it = copies.find(t.data);
    if (it == copies.end()) it = copies.emplace(t.data, owned_copy(t)).first;
    const_cast<Tensor&>(t) = it->second;
  };
  own(model.weights.embed);
  for (const LayerWeights& L : model.weights.layers)
    for (const Tensor* t : layer_tensors_but_experts(L)) own(*t);
  own(model.weights.final_norm);
  own(model.weights.lm_head);
  for (const auto& file : checkpoint_files(model)) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // only a hint to the kernel
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

Model load_model_for_run(const std::filesystem::path& dir, ExpertQuant quant,
                         const HostBudget& budget, int layers) {
  ModelConfig c = load_model_config(dir);
  if (layers > c.num_layers) fail("--layers {}: the model has {} layers", layers, c.num_layers);
  if (layers > 0) c.num_layers = layers;
  if (!c.expert_quant.quantized()) c.expert_quant = resolve_expert_quant(c, quant, dir.string());
  require_servable(c, budget, dir.string(), disk_tier_refusal(dir));
  const bool on_disk = experts_stay_on_disk(c, budget.bytes);
  Model model =
      load_model(dir, {.experts_on_disk = on_disk, .expert_quant = quant, .layers = layers});
  if (on_disk) copy_resident_weights(model);
  return model;
}

WeightsRead read_weights_if_they_fit(const Model& model) {
  WeightsRead r;
  if (model.dir.empty() || model.expert_files) return r;
  const size_t bytes = model_stats(model).total_bytes;
  if (double(bytes) > 0.9 * double(available_memory_bytes())) {
    r.skipped = true;
    return r;
  }
  const auto start = Clock::now();
  r.bytes = read_weights_into_memory(model);
  r.seconds = seconds_since(start);
  return r;
}

}  // namespace sluice
