#include "engine/weights_in_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/mapped_file.h"
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

// The files whose mappings hold the weights: a folder's safetensors, or a GGUF file.
std::vector<std::filesystem::path> mapped_weight_files(const Model& model) {
  if (std::filesystem::is_directory(model.dir)) return checkpoint_files(model);
  return {model.dir};
}

// Weights read from a page cache of small folios (a file written in small pieces: 7–35% of
// make-model's Mixtral folder was) are mapped 4 KiB at a time, and the expert GEMMs that stream
// them wait on the TLB and on hardware prefetchers that stop at each 4 KiB page. On 2 Zen 5 cores
// (2026-12-08, bench/RESULTS.md), a 2-layer Mixtral folder's decode ran its expert GEMMs at
// 239–245 GFLOP/s from a page cache of 64 KiB writes and at 283–327 from the same bytes read
// into 2 MiB folios (three interleaved pairs). Where the machine's page cache makes 2 MiB folios
// (its filesystem reads ahead in them), each file mapped mostly in 4 KiB pages is dropped from
// the page cache and read again: once, since the next run finds it in large folios. Counts what
// the files' mappings hold in `r`.
void remap_in_huge_pages(const Model& model, WeightsRead& r) {
  constexpr size_t kSmallFile = size_t(64) << 20;  // not worth a second read
  const std::vector<std::filesystem::path> files = mapped_weight_files(model);
  auto count = [&](bool drop_small_pages) {
    r.mapped_bytes = r.mapped_in_huge_pages = 0;
    size_t dropped = 0;
    for (const auto& file : files) {
      size_t resident = 0, huge = 0;
      const std::vector<FileMapping> maps = file_mappings(file);
      for (const FileMapping& m : maps) {
        resident += m.resident;
        huge += m.in_huge_pages;
      }
      if (drop_small_pages && resident >= kSmallFile && double(huge) < 0.9 * double(resident)) {
        drop_from_page_cache(file, maps);
        dropped += resident;
      }
      r.mapped_bytes += resident;
      r.mapped_in_huge_pages += huge;
    }
    return dropped;
  };
  r.reread_bytes = count(page_cache_has_huge_folios());
  if (r.reread_bytes == 0) return;
  read_weights_into_memory(model);
  count(false);
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
  remap_in_huge_pages(model, r);
  r.seconds = seconds_since(start);
  return r;
}

}  // namespace sluice
