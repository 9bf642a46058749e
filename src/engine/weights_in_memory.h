// Loading a model for a run within a host-memory budget, and reading its weights into memory
// before the run, where they fit.
#pragma once

#include <cstddef>

#include "engine/host_budget.h"
#include "model/weights.h"

namespace sluice {

struct WeightsRead {
  size_t bytes = 0;      // weight bytes read (0 when skipped or the model was made in memory)
  double seconds = 0;    // time it took
  bool skipped = false;  // the weights are larger than 90% of the memory available now
  // The files' pages this process maps, and of those the ones mapped 2 MiB at a time.
  size_t mapped_bytes = 0, mapped_in_huge_pages = 0;
  size_t reread_bytes = 0;  // bytes of files read again into 2 MiB folios (remap_in_huge_pages)
};

// Loads the model at `dir` for a run within `budget`: whole, or, when its weights (with the
// experts quantized as `quant` asks) are larger than that, with the routed experts left in their
// files for the disk tier (Model::expert_files) and the other weights copied out of the mapping;
// then quantizes its experts as `quant` asks. Refuses, before loading, a model that cannot be
// served within the budget (require_servable). `layers` > 0: only the model's first layers
// (bench --layers).
Model load_model_for_run(const std::filesystem::path& dir, ExpertQuant quant,
                         const HostBudget& budget, int layers = 0);

// read_weights_into_memory when the weights fit in 90% of the memory available now, each file
// mapped mostly in 4 KiB pages read again into 2 MiB ones where this machine's page cache makes
// them (weights_in_memory.cpp); a larger model stays mapped lazily. Nothing to read for a model
// made in memory, nor for one whose experts stay on disk: load_model_for_run copied its other
// weights already.
WeightsRead read_weights_if_they_fit(const Model& model);

}  // namespace sluice
