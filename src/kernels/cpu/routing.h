// MoE router: softmax over the E router logits of each token, the top-k experts, and optionally
// their weights renormalised to sum to 1.
// (transformers Mixtral: probs = softmax(logits, dim=-1, dtype=float); w, ids = topk(probs, k);
//  if norm_topk_prob: w /= w.sum(-1, keepdim=True))
// DeepSeek's variants, each off by default: sigmoid scores instead of the softmax; a selection
// bias added to the scores for the choice only (V3's e_score_correction_bias); group-limited
// choice (the experts in `groups` equal groups, each ranked by its best score or the sum of its
// best two, experts outside the best `groups_per_token` groups at choice 0, as transformers'
// masked_fill(~mask, 0.0)); the weights (the unbiased scores of the chosen experts, renormalised
// or not) multiplied by `scale` (routed_scaling_factor).
// Experts come out in descending probability; equal probabilities keep the lower expert id first,
// as torch.topk does in practice on CPU and CUDA.
//
// E is 8..160, so a token's routing is a few hundred operations next to the millions of its
// GEMMs; the AVX2 path (vector exp and sum) agrees with the scalar one to ~1e-7 relative, and
// experts with equal logits get bitwise equal probabilities on every path, so exact ties still go
// to the lower id.
#pragma once

#include <cstdint>

namespace sluice::cpu {

enum class RouterScoreFn { kSoftmax, kSigmoid };
enum class GroupRank { kBest, kBestTwoSum };

struct RoutingArgs {
  const float* logits = nullptr;  // [tokens, n_experts] fp32
  int64_t tokens = 0;
  int n_experts = 0, top_k = 0;
  bool renormalize = true;
  int32_t* expert_ids = nullptr;  // out [tokens, top_k]
  float* weights = nullptr;       // out [tokens, top_k]
  RouterScoreFn score = RouterScoreFn::kSoftmax;
  const float* selection_bias = nullptr;  // [n_experts] fp32, or null
  int groups = 1, groups_per_token = 1;   // groups must divide n_experts
  GroupRank group_rank = GroupRank::kBest;
  float scale = 1.0f;
};

void route_top_k(const RoutingArgs& args);
// The plain loops (scores, choice, top-k by stable sort), for tests.
void route_top_k_reference(const RoutingArgs& args);

}  // namespace sluice::cpu
