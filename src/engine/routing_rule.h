// The router's rule as a model describes it (softmax or sigmoid scores, the selection bias,
// expert groups, renormalisation, routed_scaling_factor), in the routing kernels' terms. Both
// engines route with it: the CPU engine on the host, the offload executor on its device.
#pragma once

#include "kernels/cpu/routing.h"
#include "model/config.h"

namespace sluice {

// Every field of cpu::RoutingArgs but the pointers (logits, selection_bias, expert_ids, weights)
// and the token count, which the caller sets.
cpu::RoutingArgs routing_rule(const ModelConfig& c);

}  // namespace sluice
