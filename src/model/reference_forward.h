// The reference forward pass: a plain, readable transcription of the Hugging Face
// `transformers` modeling code, fp32 arithmetic over the stored weights. Fast paths are
// tested against it; it is also what `sluice logits` runs.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/weights.h"

namespace sluice {

// Receives named intermediates for debugging and golden tests: `name` is "embed",
// "layer.{i}.attn_out" (the attention block's output), "layer.{i}.moe_out" (the FFN block's:
// routed experts plus the shared expert, or a dense layer's MLP), "layer.{i}.out", "final_norm"
// or "logits"; `data` holds `rows` rows of `cols` floats, one row per token of the current call.
using DumpFn = std::function<void(const std::string& name, const float* data, int rows, int cols)>;

// By default the arithmetic is fp32 throughout, the transformers semantics with weights upcast.
// The options round values to bf16 where a fast engine stores them in bf16, so that engine and
// reference compute the same function and differ only in the order of fp32 additions.
struct ReferenceOptions {
  bool bf16_gemm_inputs = false;  // round each matmul's activation input to bf16 (not the router's)
  bool bf16_kv_cache = false;     // round K and V to bf16 as they enter the cache
};

// One token's routing in one MoE layer, as the reference decides it.
struct RouterDecision {
  int layer = 0;
  int position = 0;               // the token's, in its sequence
  std::span<const float> logits;  // the router's, one per expert (fp32)
  std::span<const int> experts;   // the reference's choice: select_experts(logits), rank order
};
// The experts a token runs instead of the reference's choice: experts_per_token distinct ids.
using ExpertChoiceFn = std::function<std::vector<int>(const RouterDecision&)>;

// The model's routing rule on one token's router logits in layer `L`: softmax or sigmoid scores,
// plus the selection bias, limited to the best expert groups, top experts_per_token. Returns the
// chosen experts in rank order.
std::vector<int> select_experts(const ModelConfig& c, const LayerWeights& L,
                                std::span<const float> logits);

class ReferenceForward {
 public:
  explicit ReferenceForward(const Model& model, ReferenceOptions options = {});

  // Runs `tokens` at positions [length(), length() + tokens.size()), appending to the KV cache.
  // Returns the logits, one row of vocab_size floats per token.
  std::vector<float> forward(std::span<const int> tokens, const DumpFn& dump = {});

  // Teacher-forced routing: from now on every routed token runs the experts `choose` returns,
  // weighted by the reference's own scores of them. A test replays a fast path's recorded choices
  // with it, so that a near-tie of the router which rounding decided the other way there does not
  // send the two computations through different experts.
  void set_expert_choice(ExpertChoiceFn choose) { choose_experts_ = std::move(choose); }

  int length() const { return length_; }
  void reset() {
    length_ = 0;
    for (auto& k : k_cache_) k.clear();
    for (auto& v : v_cache_) v.clear();
  }

 private:
  // The blocks of one decoder layer over the call's T rows, in place on the residual x.
  void attention_block(int l, int T, std::vector<float>& x, const DumpFn& dump);
  void latent_attention_block(int l, int T, std::vector<float>& x, const DumpFn& dump);
  // MLA's query [T, heads·head_dim], RoPE applied.
  std::vector<float> latent_query(const LayerWeights& L, const std::vector<float>& h, int T);
  // MLA: appends the call's tokens to the layer's cache as each head's key [k_nope | k_pe] and
  // value, decompressed by kv_b_proj from the (optionally bf16-rounded) latent and RoPE key.
  void append_latent_kv(int l, const std::vector<float>& h, int T);
  void ffn_block(int l, int T, std::vector<float>& x, const DumpFn& dump);

  const Model& model_;
  ReferenceOptions options_;
  ExpertChoiceFn choose_experts_;  // empty: the reference routes by its own rule
  int length_ = 0;
  // Per layer: [position][kv_dim]; with MLA [position][heads·head_dim] and
  // [position][heads·v_head_dim].
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::vector<float> inv_freq_;  // RoPE's frequencies
};

}  // namespace sluice
