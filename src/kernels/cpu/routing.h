// MoE router: softmax over the E router logits of each token, the top-k experts, and optionally
// their weights renormalised to sum to 1.
// (transformers Mixtral: probs = softmax(logits, dim=-1, dtype=float); w, ids = topk(probs, k);
//  if norm_topk_prob: w /= w.sum(-1, keepdim=True))
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

struct RoutingArgs {
  const float* logits = nullptr;  // [tokens, n_experts] fp32
  int64_t tokens = 0;
  int n_experts = 0, top_k = 0;
  bool renormalize = true;
  int32_t* expert_ids = nullptr;  // out [tokens, top_k]
  float* weights = nullptr;       // out [tokens, top_k]
};

void route_top_k(const RoutingArgs& args);

}  // namespace sluice::cpu
