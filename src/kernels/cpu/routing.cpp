#include "kernels/cpu/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
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

void check(const RoutingArgs& a) {
  if (a.n_experts <= 0 || a.top_k <= 0 || a.top_k > a.n_experts || a.tokens < 0)
    fail("routing: field 'top_k': expected 0 < top_k <= n_experts, got top_k={} n_experts={}",
         a.top_k, a.n_experts);
  if (a.groups <= 0 || a.n_experts % a.groups != 0 || a.groups_per_token <= 0 ||
      a.groups_per_token > a.groups || a.groups_per_token * (a.n_experts / a.groups) < a.top_k ||
      (a.groups > 1 && a.group_rank == GroupRank::kBestTwoSum && a.n_experts / a.groups < 2))
    fail(
        "routing: field 'groups': expected groups dividing the {} experts, 1 <= groups_per_token "
        "<= groups, enough experts in the chosen groups for top_k={} (and two per group when "
        "groups rank by their best two), got groups={} groups_per_token={}",
        a.n_experts, a.top_k, a.groups, a.groups_per_token);
}

bool plain(const RoutingArgs& a) {
  return a.score == RouterScoreFn::kSoftmax && !a.selection_bias && a.groups == 1 &&
         a.scale == 1.0f;
}

void sigmoid_scores(const float* logits, int n, float* scores) {
  for (int e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
}

// A group's rank: its best choice, or the sum of its best two.
float group_rank(const float* choice, int n, GroupRank rank) {
  float best = -std::numeric_limits<float>::infinity(), second = best;
  for (int e = 0; e < n; ++e) {
    if (choice[e] > best) {
      second = best;
      best = choice[e];
    } else if (choice[e] > second) {
      second = choice[e];
    }
  }
  return rank == GroupRank::kBest ? best : best + second;
}

// Experts outside the best groups_per_token groups (ties: the lower group id) get choice 0.
void mask_groups(const RoutingArgs& a, float* choice, std::vector<float>& rank,
                 std::vector<char>& kept) {
  const int G = a.groups, per_group = a.n_experts / G;
  for (int g = 0; g < G; ++g)
    rank[size_t(g)] = group_rank(choice + g * per_group, per_group, a.group_rank);
  std::fill(kept.begin(), kept.end(), 0);
  for (int j = 0; j < a.groups_per_token; ++j) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (!kept[size_t(g)] && (best < 0 || rank[size_t(g)] > rank[size_t(best)])) best = g;
    kept[size_t(best)] = 1;
  }
  for (int e = 0; e < a.n_experts; ++e)
    if (!kept[size_t(e / per_group)]) choice[e] = 0.0f;
}

// Weights: renormalised over the chosen (sum in rank order) when asked, then scaled.
void finish_weights(const RoutingArgs& a, float* w) {
  if (a.renormalize) {
    float chosen_sum = 0;
    for (int j = 0; j < a.top_k; ++j) chosen_sum += w[j];
    for (int j = 0; j < a.top_k; ++j) w[j] /= chosen_sum;
  }
  if (a.scale != 1.0f)
    for (int j = 0; j < a.top_k; ++j) w[j] *= a.scale;
}

// DeepSeek's variants: scores, the biased and group-masked choice, the top-k of the choice by
// repeated scalar argmax (E <= a few hundred, k <= 8: negligible next to the GEMMs).
void route_general(const RoutingArgs& a, const RoutingKernels& kernels) {
  const int E = a.n_experts;
  std::vector<float> score(size_t(E + 7) / 8 * 8), choice(static_cast<size_t>(E)),
      rank(size_t(a.groups));
  std::vector<char> kept(size_t(a.groups));
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* logits = a.logits + t * E;
    if (a.score == RouterScoreFn::kSigmoid)
      sigmoid_scores(logits, E, score.data());
    else
      kernels.softmax(logits, E, score.data());
    for (int e = 0; e < E; ++e) {
      if (std::isnan(score[size_t(e)])) score[size_t(e)] = 0;
      choice[size_t(e)] = score[size_t(e)] + (a.selection_bias ? a.selection_bias[e] : 0.0f);
    }
    if (a.groups > 1) mask_groups(a, choice.data(), rank, kept);
    int32_t* ids = a.expert_ids + t * a.top_k;
    float* w = a.weights + t * a.top_k;
    for (int j = 0; j < a.top_k; ++j) {
      const int best = argmax_scalar(choice.data(), E);
      ids[j] = best;
      w[j] = score[size_t(best)];
      choice[size_t(best)] = -std::numeric_limits<float>::infinity();
    }
    finish_weights(a, w);
  }
}

}  // namespace

// Per token: the softmax, then k passes of "largest not yet taken, lowest id on ties", O(k·E),
// fine for E up to a few hundred.
void route_top_k(const RoutingArgs& a) {
  check(a);
  const RoutingKernels kernels = routing_kernels();
  if (!plain(a)) return route_general(a, kernels);
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

// transformers' order of operations, written plainly: scores, choice = scores + bias, group
// ranks by sorting each group, groups and experts ordered by stable sorts (ties: lower id).
void route_top_k_reference(const RoutingArgs& a) {
  check(a);
  const int E = a.n_experts, G = a.groups, per_group = E / G;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* logits = a.logits + t * E;
    std::vector<float> score(static_cast<size_t>(E));
    if (a.score == RouterScoreFn::kSigmoid)
      sigmoid_scores(logits, E, score.data());
    else
      softmax_scalar(logits, E, score.data());
    for (float& s : score)
      if (std::isnan(s)) s = 0;
    std::vector<float> choice = score;
    if (a.selection_bias)
      for (int e = 0; e < E; ++e) choice[size_t(e)] += a.selection_bias[e];
    if (G > 1) {
      std::vector<float> rank(static_cast<size_t>(G));
      for (int g = 0; g < G; ++g) {
        std::vector<float> m(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
        std::sort(m.begin(), m.end(), std::greater<float>());
        rank[size_t(g)] = a.group_rank == GroupRank::kBest ? m[0] : m[0] + m[1];
      }
      std::vector<int> groups(static_cast<size_t>(G));
      std::iota(groups.begin(), groups.end(), 0);
      std::stable_sort(groups.begin(), groups.end(),
                       [&](int x, int y) { return rank[size_t(x)] > rank[size_t(y)]; });
      std::vector<bool> kept(static_cast<size_t>(G), false);
      for (int j = 0; j < a.groups_per_token; ++j) kept[size_t(groups[size_t(j)])] = true;
      for (int e = 0; e < E; ++e)
        if (!kept[size_t(e / per_group)]) choice[size_t(e)] = 0.0f;
    }
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return choice[size_t(x)] > choice[size_t(y)]; });
    int32_t* ids = a.expert_ids + t * a.top_k;
    float* w = a.weights + t * a.top_k;
    for (int j = 0; j < a.top_k; ++j) {
      ids[j] = order[size_t(j)];
      w[j] = score[size_t(order[size_t(j)])];
    }
    finish_weights(a, w);
  }
}

}  // namespace sluice::cpu
