// Named model shapes: the real architectures (for benchmarks, made with random weights) and
// tiny ones for tests.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace sluice {

// The config of preset `name`; `layers` > 0 cuts the model to that many layers.
ModelConfig preset_config(const std::string& name, int layers = 0);
std::vector<std::string> preset_names();

}  // namespace sluice
