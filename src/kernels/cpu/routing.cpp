#include "kernels/cpu/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace sluice::cpu {

void route_top_k(const RoutingArgs& a) {
  if (a.n_experts <= 0 || a.top_k <= 0 || a.top_k > a.n_experts || a.tokens < 0)
    fail("routing: field 'top_k': expected 0 < top_k <= n_experts, got top_k={} n_experts={}",
         a.top_k, a.n_experts);
  std::vector<float> probs(size_t(a.n_experts));
  std::vector<bool> taken(size_t(a.n_experts));
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* logits = a.logits + t * a.n_experts;
    float max_logit = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < a.n_experts; ++e) max_logit = std::max(max_logit, logits[e]);
    float sum = 0;
    for (int e = 0; e < a.n_experts; ++e) {
      probs[size_t(e)] = std::exp(logits[e] - max_logit);
      sum += probs[size_t(e)];
    }
    for (float& p : probs) p /= sum;

    // k passes of "largest not yet taken, lowest id on ties": O(k·E), fine for E <= a few hundred.
    std::fill(taken.begin(), taken.end(), false);
    int32_t* ids = a.expert_ids + t * a.top_k;
    float* w = a.weights + t * a.top_k;
    float chosen_sum = 0;
    for (int j = 0; j < a.top_k; ++j) {
      int best = -1;
      for (int e = 0; e < a.n_experts; ++e)
        if (!taken[size_t(e)] && (best < 0 || probs[size_t(e)] > probs[size_t(best)])) best = e;
      taken[size_t(best)] = true;
      ids[j] = best;
      w[j] = probs[size_t(best)];
      chosen_sum += w[j];
    }
    if (a.renormalize)
      for (int j = 0; j < a.top_k; ++j) w[j] /= chosen_sum;
  }
}

}  // namespace sluice::cpu
