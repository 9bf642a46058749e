#include "kernels/cpu/routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernel_test_util.h"

namespace sluice::cpu {
namespace {

TEST(CpuRouting, SoftmaxTopKMatchesSortedProbabilities) {
  for (int e : {8, 60, 64, 128}) {
    for (int k : {1, 2, 4, 8}) {
      const int64_t tokens = 9;
      auto logits = test::random_floats(size_t(tokens * e), uint32_t(e * 10 + k), 2.0f);
      std::vector<int32_t> ids(size_t(tokens * k));
      std::vector<float> w(size_t(tokens * k));
      for (bool renorm : {false, true}) {
        route_top_k({.logits = logits.data(),
                     .tokens = tokens,
                     .n_experts = e,
                     .top_k = k,
                     .renormalize = renorm,
                     .expert_ids = ids.data(),
                     .weights = w.data()});
        for (int64_t t = 0; t < tokens; ++t) {
          const float* l = logits.data() + t * e;
          double max_l = *std::max_element(l, l + e), sum = 0;
          std::vector<double> p(static_cast<size_t>(e));
          for (int i = 0; i < e; ++i) sum += p[size_t(i)] = std::exp(l[i] - max_l);
          std::vector<int> order(static_cast<size_t>(e));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
          double chosen = 0;
          for (int j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])] / sum;
          for (int j = 0; j < k; ++j) {
            ASSERT_EQ(ids[size_t(t * k + j)], order[size_t(j)]);
            const double expected = p[size_t(order[size_t(j)])] / sum / (renorm ? chosen : 1.0);
            ASSERT_NEAR(w[size_t(t * k + j)], expected, 1e-6 * expected + 1e-9);
          }
        }
      }
    }
  }
}

TEST(CpuRouting, TiesGoToTheLowerExpertId) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.5f, 3.0f, 1.0f};
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  route_top_k({.logits = logits.data(),
               .tokens = 1,
               .n_experts = 6,
               .top_k = 4,
               .renormalize = true,
               .expert_ids = ids.data(),
               .weights = w.data()});
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4, 0}));
  EXPECT_FLOAT_EQ(w[0], w[1]);
  EXPECT_FLOAT_EQ(w[0] + w[1] + w[2] + w[3], 1.0f);
}

TEST(CpuRouting, RejectsTopKLargerThanExperts) {
  float l[2] = {};
  int32_t id[3];
  float w[3];
  EXPECT_THROW(
      route_top_k(
          {.logits = l, .tokens = 1, .n_experts = 2, .top_k = 3, .expert_ids = id, .weights = w}),
      Error);
}

}  // namespace
}  // namespace sluice::cpu
