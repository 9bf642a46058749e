#include "kernels/cpu/routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

// Expert counts below, at and around whole vectors of 8, 1 token and 9.
TEST(CpuRouting, SoftmaxTopKMatchesSortedProbabilities) {
  for (IsaLevel level : isa_levels_up_to_current())
    for (int e : {1, 3, 7, 8, 9, 17, 60, 64, 128, 129, 160})
      for (int k : {1, 2, 3, 4, 8}) {
        if (k > e) continue;
        for (int64_t tokens : {1, 9}) {
          auto logits = test::random_floats(size_t(tokens * e), uint32_t(e * 10 + k), 2.0f);
          std::vector<int32_t> ids(size_t(tokens * k));
          std::vector<float> w(size_t(tokens * k));
          for (bool renorm : {false, true}) {
            {
              ScopedIsaLevel at(level);
              route_top_k({.logits = logits.data(),
                           .tokens = tokens,
                           .n_experts = e,
                           .top_k = k,
                           .renormalize = renorm,
                           .expert_ids = ids.data(),
                           .weights = w.data()});
            }
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
                ASSERT_EQ(ids[size_t(t * k + j)], order[size_t(j)])
                    << isa_name(level) << " e=" << e << " k=" << k << " token " << t;
                const double expected = p[size_t(order[size_t(j)])] / sum / (renorm ? chosen : 1.0);
                ASSERT_NEAR(w[size_t(t * k + j)], expected, 1e-6 * expected + 1e-9)
                    << isa_name(level) << " e=" << e << " k=" << k << " token " << t;
              }
            }
          }
        }
      }
}

TEST(CpuRouting, TiesGoToTheLowerExpertId) {
  // Ties inside one vector of 8 and across vectors (experts 1, 2, 4 and 11).
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.5f,  3.0f, 1.0f, -2.0f,
                               0.0f, 0.0f, 1.0f, -1.0f, 3.0f, 2.0f};
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    std::vector<int32_t> ids(6);
    std::vector<float> w(6);
    route_top_k({.logits = logits.data(),
                 .tokens = 1,
                 .n_experts = 13,
                 .top_k = 6,
                 .renormalize = true,
                 .expert_ids = ids.data(),
                 .weights = w.data()});
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4, 11, 12, 0})) << isa_name(level);
    EXPECT_EQ(w[0], w[1]) << isa_name(level);
    EXPECT_EQ(w[0], w[3]) << isa_name(level);
    EXPECT_FLOAT_EQ(w[0] + w[1] + w[2] + w[3] + w[4] + w[5], 1.0f) << isa_name(level);
  }
}

TEST(CpuRouting, NanLogitsStillGiveDistinctExperts) {
  // A NaN logit poisons the softmax sum; every probability ranks as 0, so the lowest ids win.
  std::vector<float> logits(10, 0.5f);
  logits[3] = std::numeric_limits<float>::quiet_NaN();
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    std::vector<int32_t> ids(3);
    std::vector<float> w(3);
    route_top_k({.logits = logits.data(),
                 .tokens = 1,
                 .n_experts = 10,
                 .top_k = 3,
                 .renormalize = false,
                 .expert_ids = ids.data(),
                 .weights = w.data()});
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2})) << isa_name(level);
  }
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
