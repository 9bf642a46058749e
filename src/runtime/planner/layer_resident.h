// Which layers keep their experts on the GPU when `resident_layers` of `layers` do: evenly
// spaced, so the copy engine streams the next layers' experts while the GPU computes a resident
// one. Shared by the cost model and the offload executor, so both place the same layers.
#pragma once

namespace sluice {

bool layer_resident(int layer, int layers, int resident_layers);  // -1 or >= layers: all

}  // namespace sluice
