#include "engine/routing_rule.h"

namespace sluice {

cpu::RoutingArgs routing_rule(const ModelConfig& c) {
  cpu::RoutingArgs a;
  a.n_experts = c.num_experts;
  a.top_k = c.experts_per_token;
  a.renormalize = c.normalize_topk;
  a.score = c.router_score == RouterScore::kSigmoid ? cpu::RouterScoreFn::kSigmoid
                                                    : cpu::RouterScoreFn::kSoftmax;
  a.groups = c.expert_groups;
  a.groups_per_token = c.groups_per_token;
  a.group_rank =
      c.group_score == GroupScore::kTopTwoSum ? cpu::GroupRank::kBestTwoSum : cpu::GroupRank::kBest;
  a.scale = c.routed_scaling_factor;
  return a;
}

}  // namespace sluice
