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

// DeepSeek's variants at every level against the plain loops: sigmoid or softmax scores, with and
// without the selection bias, groups ranked by their best or best two, renormalised or not, and
// scaled; expert counts and group sizes that fill no vector evenly.
TEST(CpuRouting, DeepseekVariantsMatchTheReferenceLoops) {
  struct Shape {
    int experts, groups, groups_per_token, top_k;
  };
  const Shape shapes[] = {{1, 1, 1, 1},  {6, 3, 1, 2},   {9, 3, 2, 4},   {20, 4, 2, 6},
                          {21, 7, 3, 8}, {64, 8, 3, 6},  {160, 8, 3, 6}, {256, 8, 4, 8},
                          {13, 1, 1, 5}, {34, 17, 9, 9}, {72, 9, 1, 3}};
  for (IsaLevel level : isa_levels_up_to_current())
    for (const Shape& sh : shapes)
      for (RouterScoreFn score : {RouterScoreFn::kSoftmax, RouterScoreFn::kSigmoid})
        for (GroupRank rank : {GroupRank::kBest, GroupRank::kBestTwoSum})
          for (bool biased : {false, true})
            for (bool renorm : {false, true}) {
              if (rank == GroupRank::kBestTwoSum && sh.groups > 1 && sh.experts / sh.groups < 2)
                continue;
              const int64_t tokens = 5;
              const uint32_t seed = uint32_t(sh.experts * 7 + sh.top_k);
              const auto logits = test::random_floats(size_t(tokens * sh.experts), seed, 3.0f);
              // Biases of the scores' size (V3's are ~0.1 around a few units).
              const auto bias = test::random_floats(size_t(sh.experts), seed + 1, 0.2f);
              RoutingArgs a{.logits = logits.data(),
                            .tokens = tokens,
                            .n_experts = sh.experts,
                            .top_k = sh.top_k,
                            .renormalize = renorm,
                            .score = score,
                            .selection_bias = biased ? bias.data() : nullptr,
                            .groups = sh.groups,
                            .groups_per_token = sh.groups_per_token,
                            .group_rank = rank,
                            .scale = 2.5f};
              std::vector<int32_t> ids(size_t(tokens * sh.top_k)), want_ids(ids.size());
              std::vector<float> w(ids.size()), want_w(ids.size());
              a.expert_ids = want_ids.data();
              a.weights = want_w.data();
              route_top_k_reference(a);
              a.expert_ids = ids.data();
              a.weights = w.data();
              {
                ScopedIsaLevel at(level);
                route_top_k(a);
              }
              SCOPED_TRACE(::testing::Message()
                           << isa_name(level) << " E=" << sh.experts << " groups=" << sh.groups
                           << " k=" << sh.top_k << " sigmoid=" << (score == RouterScoreFn::kSigmoid)
                           << " two=" << (rank == GroupRank::kBestTwoSum) << " bias=" << biased
                           << " renorm=" << renorm);
              ASSERT_EQ(ids, want_ids);
              for (size_t i = 0; i < w.size(); ++i)
                ASSERT_NEAR(w[i], want_w[i], 1e-6 * std::abs(want_w[i]) + 1e-9);
            }
}

// The bias decides the choice only: the weights are the unbiased scores. Groups: experts {0,1}
// {2,3} {4,5}; the best two's sums rank group 2 first, group 0 second (a strong single expert
// does not win group 1 a place).
TEST(CpuRouting, BiasChoosesAndGroupsLimitTheChoice) {
  const std::vector<float> logits = {1.0f, 1.0f, 3.0f, -4.0f, 2.0f, 2.0f};
  const std::vector<float> bias = {0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    std::vector<int32_t> ids(3);
    std::vector<float> w(3);
    route_top_k({.logits = logits.data(),
                 .tokens = 1,
                 .n_experts = 6,
                 .top_k = 3,
                 .renormalize = false,
                 .expert_ids = ids.data(),
                 .weights = w.data(),
                 .score = RouterScoreFn::kSigmoid,
                 .selection_bias = bias.data(),
                 .groups = 3,
                 .groups_per_token = 2,
                 .group_rank = GroupRank::kBestTwoSum,
                 .scale = 2.0f});
    // Choices: group 0 {0.731, 1.231}, group 1 {0.953, 0.018}, group 2 {0.881, 0.881}: sums
    // 1.96, 0.97, 1.76, so groups 0 and 2; the top 3 of their choices are 1, 4, 5.
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 4, 5})) << isa_name(level);
    const float s1 = 1.0f / (1.0f + std::exp(-1.0f)), s4 = 1.0f / (1.0f + std::exp(-2.0f));
    EXPECT_FLOAT_EQ(w[0], 2.0f * s1) << isa_name(level);
    EXPECT_FLOAT_EQ(w[1], 2.0f * s4) << isa_name(level);
  }
}

TEST(CpuRouting, RejectsGroupsThatDoNotDivideTheExperts) {
  float l[6] = {};
  int32_t id[2];
  float w[2];
  EXPECT_THROW(route_top_k({.logits = l,
                            .tokens = 1,
                            .n_experts = 6,
                            .top_k = 2,
                            .expert_ids = id,
                            .weights = w,
                            .groups = 4}),
               Error);
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
