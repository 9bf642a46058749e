// Reading a loaded model's weights into memory before a run, where they fit.
#pragma once

#include <cstddef>

#include "model/weights.h"

namespace sluice {

struct WeightsRead {
  size_t bytes = 0;     // weight bytes read (0 when skipped or the model was made in memory)
  double seconds = 0;   // time it took
  bool skipped = false;  // the weights are larger than 90% of the memory available now
};

// read_weights_into_memory when the weights fit in 90% of the memory available now; a larger
// model stays mapped lazily (the disk tier's case), and a model made in memory has nothing to read.
WeightsRead read_weights_if_they_fit(const Model& model);

}  // namespace sluice
