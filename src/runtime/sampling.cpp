#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace sluice {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    fail("temperature: expected a number >= 0, got {}", p.temperature);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p: expected a number in (0, 1], got {}", p.top_p);
  if (p.top_k < 0) fail("top_k: expected an integer >= 0, got {}", p.top_k);
}

int argmax(std::span<const float> logits) {
  return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TokenLogprob token_logprob(std::span<const float> logits, int token, int top) {
  const int n = int(logits.size());
  if (token < 0 || token >= n) fail("token_logprob: token {} outside [0, {})", token, n);
  const double peak = logits[size_t(argmax(logits))];
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - peak);
  const double log_z = peak + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - log_z);
  top = std::clamp(top, 0, n);
  if (top == 0) return out;
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  auto logit = [&](int i) { return logits[size_t(i)]; };
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int a, int b) {
    return logit(a) > logit(b) || (logit(a) == logit(b) && a < b);
  });
  for (int i = 0; i < top; ++i) {
    const int id = order[size_t(i)];
    out.top.emplace_back(id, float(double(logit(id)) - log_z));
  }
  return out;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  validate(params);
}

int Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  const int n = int(logits.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  int keep = n;
  if (params_.top_k > 0 && params_.top_k < n) keep = params_.top_k;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  order.resize(keep);
  // Softmax of logits / temperature over the survivors, in descending order.
  std::vector<double> prob(keep);
  const double top = logits[order[0]] / params_.temperature;
  double sum = 0;
  for (int i = 0; i < keep; ++i)
    sum += prob[i] = std::exp(logits[order[i]] / params_.temperature - top);
  for (double& p : prob) p /= sum;
  if (params_.top_p < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (at least one token).
    double mass = 0;
    int cut = 0;
    while (cut < keep) {
      mass += prob[cut++];
      if (mass >= params_.top_p) break;
    }
    keep = cut;
    double kept = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
    for (int i = 0; i < keep; ++i) prob[i] /= kept;
  }
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_), acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace sluice
