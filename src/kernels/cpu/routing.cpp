#include "kernels/cpu/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"

namespace sluice::cpu {
namespace {

constexpr float kTaken = -1.0f;  // below every probability: marks an expert already chosen

void softmax_scalar(const float* logits, int n, float* probs) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int e = 0; e < n; ++e) max_logit = std::max(max_logit, logits[e]);
  float sum = 0;
  for (int e = 0; e < n; ++e) {
    probs[e] = std::exp(logits[e] - max_logit);
    sum += probs[e];
  }
  for (int e = 0; e < n; ++e) probs[e] /= sum;
}

// The largest entry, the lowest index on ties.
int argmax_scalar(const float* v, int n) {
  int best = 0;
  for (int e = 1; e < n; ++e)
    if (v[e] > v[best]) best = e;
  return best;
}

// Logits e..e+7, the lanes past n at -inf (so they neither win the max nor add to the sum).
SLUICE_AVX2 __m256 load_logits(const float* logits, int e, int n) {
  if (e + 8 <= n) return _mm256_loadu_ps(logits + e);
  const __m256i inside = avx2::tail_mask(n - e);
  return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()),
                          _mm256_maskload_ps(logits + e, inside), _mm256_castsi256_ps(inside));
}

// probs has room for n rounded up to 8; the padding lanes are written as exp(-inf) = 0.
SLUICE_AVX2 void softmax_avx2(const float* logits, int n, float* probs) {
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int e = 0; e < n; e += 8) vmax = _mm256_max_ps(vmax, load_logits(logits, e, n));
  vmax = _mm256_set1_ps(avx2::reduce_max(vmax));
  __m256 vsum = _mm256_setzero_ps();
  for (int e = 0; e < n; e += 8) {
    const __m256 p = avx2::exp_ps(_mm256_sub_ps(load_logits(logits, e, n), vmax));
    _mm256_storeu_ps(probs + e, p);
    vsum = _mm256_add_ps(vsum, p);
  }
  const __m256 sum = _mm256_set1_ps(avx2::reduce_add(vsum));
  for (int e = 0; e < n; e += 8)
    _mm256_storeu_ps(probs + e, _mm256_div_ps(_mm256_loadu_ps(probs + e), sum));
}

// v has n entries rounded up to 8, the padding at kTaken, none NaN: one pass for the maximum,
// one for the first lane that equals it.
SLUICE_AVX2 int argmax_avx2(const float* v, int n) {
  __m256 vmax = _mm256_loadu_ps(v);
  for (int e = 8; e < n; e += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(v + e));
  const __m256 best = _mm256_set1_ps(avx2::reduce_max(vmax));
  for (int e = 0; e < n; e += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + e), best, _CMP_EQ_OQ));
    if (hits != 0) return e + __builtin_ctz(unsigned(hits));
  }
  return 0;  // not reached: the maximum is one of the entries
}

struct RoutingKernels {
  void (*softmax)(const float*, int, float*);
  int (*argmax)(const float*, int);
};

RoutingKernels routing_kernels() {
  if (isa_at_least(IsaLevel::kAvx2)) return {softmax_avx2, argmax_avx2};
  return {softmax_scalar, argmax_scalar};
}

}  // namespace

// Per token: the softmax, then k passes of "largest not yet taken, lowest id on ties", O(k·E),
// fine for E up to a few hundred.
void route_top_k(const RoutingArgs& a) {
  if (a.n_experts <= 0 || a.top_k <= 0 || a.top_k > a.n_experts || a.tokens < 0)
    fail("routing: field 'top_k': expected 0 < top_k <= n_experts, got top_k={} n_experts={}",
         a.top_k, a.n_experts);
  const RoutingKernels kernels = routing_kernels();
  std::vector<float> probs(size_t(a.n_experts + 7) / 8 * 8, kTaken);
  for (int64_t t = 0; t < a.tokens; ++t) {
    kernels.softmax(a.logits + t * a.n_experts, a.n_experts, probs.data());
    // A NaN logit (or +inf, through inf - inf) ranks as probability 0, so the k experts chosen
    // are always distinct.
    for (int e = 0; e < a.n_experts; ++e)
      if (std::isnan(probs[size_t(e)])) probs[size_t(e)] = 0;
    std::fill(probs.begin() + a.n_experts, probs.end(), kTaken);
    int32_t* ids = a.expert_ids + t * a.top_k;
    float* w = a.weights + t * a.top_k;
    float chosen_sum = 0;
    for (int j = 0; j < a.top_k; ++j) {
      const int best = kernels.argmax(probs.data(), a.n_experts);
      ids[j] = best;
      w[j] = probs[size_t(best)];
      probs[size_t(best)] = kTaken;
      chosen_sum += w[j];
    }
    if (a.renormalize)
      for (int j = 0; j < a.top_k; ++j) w[j] /= chosen_sum;
  }
}

}  // namespace sluice::cpu
