// Token choice and log probabilities (runtime/sampling): token_logprob against a plain
// long-double log-softmax at awkward vocabulary sizes, its ordering of ties, and the sampler's
// greedy and seeded behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/sampling.h"

namespace sluice {
namespace {

std::vector<float> random_logits(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// The scalar reference: log softmax in long double.
long double reference_logprob(const std::vector<float>& logits, int token) {
  long double peak = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (float v : logits) sum += std::exp((long double)v - peak);
  return (long double)logits[size_t(token)] - peak - std::log(sum);
}

TEST(TokenLogprob, MatchesALongDoubleLogSoftmaxAtAwkwardSizes) {
  for (int n : {1, 2, 7, 33, 1000, 32001}) {
    const std::vector<float> logits = random_logits(n, uint64_t(n));
    const int top = std::min(n, 5);
    for (int token : {0, n / 2, n - 1}) {
      const TokenLogprob t = token_logprob(logits, token, top);
      EXPECT_EQ(t.token, token);
      EXPECT_NEAR(t.logprob, double(reference_logprob(logits, token)), 1e-5) << n;
      ASSERT_EQ(int(t.top.size()), top) << n;
      // The alternatives are the most likely tokens, most likely first, with their logprobs.
      std::vector<int> order(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) order[size_t(i)] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
      for (int i = 0; i < top; ++i) {
        EXPECT_EQ(t.top[size_t(i)].first, order[size_t(i)]) << n << " rank " << i;
        EXPECT_NEAR(t.top[size_t(i)].second,
                    double(reference_logprob(logits, order[size_t(i)])), 1e-5);
      }
    }
  }
}

TEST(TokenLogprob, ProbabilitiesSumToOneAndTiesGoToTheLowerId) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 3.0f};
  double mass = 0;
  for (int i = 0; i < 5; ++i) mass += std::exp(double(token_logprob(logits, i, 0).logprob));
  EXPECT_NEAR(mass, 1.0, 1e-6);
  const TokenLogprob t = token_logprob(logits, 3, 5);
  ASSERT_EQ(t.top.size(), 5u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 2);
  EXPECT_EQ(t.top[2].first, 4);
  EXPECT_EQ(t.top[3].first, 0);
  EXPECT_EQ(t.top[4].first, 3);
  EXPECT_TRUE(token_logprob(logits, 0, 0).top.empty());
  EXPECT_EQ(token_logprob(logits, 0, 99).top.size(), 5u);  // at most the vocabulary
}

TEST(TokenLogprob, ATokenOutsideTheVocabularyFails) {
  const std::vector<float> logits = {0.0f, 1.0f};
  EXPECT_THROW(token_logprob(logits, 2, 0), Error);
  EXPECT_THROW(token_logprob(logits, -1, 0), Error);
}

TEST(Sampler, GreedyAndTopKOneTakeTheArgmaxAndASeedRepeats) {
  const std::vector<float> logits = random_logits(1000, 3);
  const int best = argmax(logits);
  Sampler greedy({0.0f, 1.0f, 0, 1});
  Sampler top1({1.5f, 1.0f, 1, 2});
  Sampler a({1.0f, 0.9f, 50, 7}), b({1.0f, 0.9f, 50, 7});
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(greedy.sample(logits), best);
    EXPECT_EQ(top1.sample(logits), best);
    EXPECT_EQ(a.sample(logits), b.sample(logits));
  }
}

}  // namespace
}  // namespace sluice
