// The tiny models the engine tests run on: tiny-mixtral as it is, a variant with a sliding
// window, grouped-query attention (3 query heads per KV head), top-3 routing over 5 experts and
// an odd vocabulary, and one tiny model of every other family; and the workload and policy both
// engine tests run them with. Shared by batch_engine_test (which adds more cases),
// offload_executor_test and the CUDA engine test; and the quantized cases of the offload tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/presets.h"
#include "runtime/policy.h"
#include "runtime/request.h"
#include "test_util.h"

namespace sluice::testing {

struct TinyModelCase {
  const char* name;
  // Applied to preset_config("tiny-mixtral"); a family's case replaces it with its own preset.
  std::function<void(ModelConfig&)> edit;
};

inline TinyModelCase tiny_mixtral_case() {
  return {"tiny_mixtral", [](ModelConfig&) {}};
}

inline TinyModelCase sliding_window_gqa_case() {
  return {"sliding_window_gqa3_top3_odd_vocab", [](ModelConfig& c) {
            c.sliding_window = 6;
            c.num_heads = 6;
            c.num_kv_heads = 2;
            c.head_dim = 16;
            c.experts_per_token = 3;
            c.num_experts = 5;
            c.vocab_size = 301;
            c.num_layers = 3;
          }};
}

// Qwen3-MoE: per-head q/k norms, head_dim unrelated to the hidden size, top-3 of 8 renormalised.
inline TinyModelCase tiny_qwen3_moe_case() {
  return {"tiny_qwen3_moe", [](ModelConfig& c) { c = preset_config("tiny-qwen3-moe"); }};
}

// OLMoE: q/k norms over the whole projection (k_norm over 2 KV heads), top-3 of 8 without
// renormalisation.
inline TinyModelCase tiny_olmoe_case() {
  return {"tiny_olmoe", [](ModelConfig& c) { c = preset_config("tiny-olmoe"); }};
}

// Every family's tiny model, and the features a description switches on (biases, clipping, a
// shared expert, dense layers), for the tests that run each engine path on each.
inline std::vector<TinyModelCase> family_cases() {
  std::vector<TinyModelCase> cases = {tiny_mixtral_case(), sliding_window_gqa_case(),
                                      tiny_qwen3_moe_case(), tiny_olmoe_case()};
  // Qwen3-MoE with attention_bias (q/k/v/o biases) and layer 1 a dense MLP. (The same without
  // renormalisation has bf16 near-ties: at 2 of 448 positions its two best logits lie 2.5e-5 and
  // 1.3e-3 apart, which bf16 rounding decides either way; OLMoE's case runs that routing.)
  cases.push_back({"qwen3_moe_biases_dense_layer", [](ModelConfig& c) {
                     c = preset_config("tiny-qwen3-moe");
                     c.num_layers = 3;
                     c.qkv_bias = c.o_bias = true;
                     c.dense_layers = {1};
                   }});
  // OLMoE with clip_qkv (q, k, v clamped to ±1.2 after the q/k norms: a good share of them
  // clamps) and attention_bias.
  cases.push_back({"olmoe_clip_qkv_biases", [](ModelConfig& c) {
                     c = preset_config("tiny-olmoe");
                     c.clip_qkv = 1.2f;
                     c.qkv_bias = c.o_bias = true;
                   }});
  // Qwen2-MoE: q/k/v biases and the sigmoid-gated shared expert beside top-4 of 8 without
  // renormalisation; and with layer 1 a dense MLP (mlp_only_layers). (With top-3, two bf16
  // positions of 224 are near-ties between the same two tokens, 6.7e-4 and 1.5e-3 apart on
  // 2.4-2.6, decided either way by bf16 rounding.)
  cases.push_back({"tiny_qwen2_moe", [](ModelConfig& c) { c = preset_config("tiny-qwen2-moe"); }});
  cases.push_back({"qwen2_moe_dense_layer", [](ModelConfig& c) {
                     c = preset_config("tiny-qwen2-moe");
                     c.num_layers = 3;
                     c.dense_layers = {1};
                   }});
  // DBRX: LayerNorm, the fused Wqkv clamped to ±1.5, flat experts (w2 transposed), top-3 of 7.
  cases.push_back({"tiny_dbrx", [](ModelConfig& c) { c = preset_config("tiny-dbrx"); }});
  // DeepSeek: multi-head latent attention (latent 24, RoPE key 8, q_nope 12, v 10 per head) with
  // interleaved YaRN RoPE and its mscale on the softmax, shared experts, dense first layers (one;
  // V3 two of four). V2-Lite: no q-LoRA, greedy softmax top-3 of 8 unnormalised. V2: q-LoRA,
  // top-2 of 12 limited to the best 2 of 4 groups (ranked by their best expert), routed weights
  // × 16 (with the preset's top-3, one bf16 position of 224 at the scalar level is a near-tie of
  // the two best logits, decided either way by rounding). V3: sigmoid scores with the selection
  // bias, groups ranked by their best two, top-4 of 16 renormalised and × 2.5; its projections
  // FP8 with block scales as the release (one partial 128 × 128 block each), and once in bf16.
  cases.push_back({"tiny_deepseek_v2_lite",
                   [](ModelConfig& c) { c = preset_config("tiny-deepseek-v2-lite"); }});
  cases.push_back({"tiny_deepseek_v2", [](ModelConfig& c) {
                     c = preset_config("tiny-deepseek-v2");
                     c.experts_per_token = 2;
                   }});
  cases.push_back(
      {"tiny_deepseek_v3", [](ModelConfig& c) { c = preset_config("tiny-deepseek-v3"); }});
  cases.push_back({"tiny_deepseek_v3_bf16", [](ModelConfig& c) {
                     c = preset_config("tiny-deepseek-v3");
                     c.fp8_weights = false;
                   }});
  return cases;
}

// Prompt lengths of the engine tests' requests: 1 token, several in one KV block, several blocks,
// and longer than a prefill chunk.
constexpr int kPromptLengths[] = {1, 3, 7, 12, 20, 33, 5};
constexpr int kLongestPrompt = 33;

// A deterministic prompt of `length` ids in [3, vocab), different for each salt.
inline std::vector<int> prompt_of(int length, int salt, int vocab) {
  std::vector<int> p;
  for (int i = 0; i < length; ++i) p.push_back(3 + (i * 37 + salt * 101) % (vocab - 3));
  return p;
}

// One request of each of kPromptLengths (ids 0, 1, ...), each asking for `new_tokens`.
inline std::vector<Request> prompt_length_requests(int vocab, int new_tokens) {
  std::vector<Request> requests;
  for (int i = 0; i < int(std::size(kPromptLengths)); ++i) {
    Request r;
    r.id = i;
    r.prompt = prompt_of(kPromptLengths[i], i, vocab);
    r.max_new_tokens = new_tokens;
    requests.push_back(r);
  }
  return requests;
}

// A policy that exercises every mechanism of the engine on those requests, each generating
// `new_tokens`: refill (B < requests), several attention micro-batches, prefill split into
// chunks and mixed with decode in one step, expert GEMMs split at b_e, KV blocks crossed; the KV
// cache holds exactly B of the longest sequences.
inline Policy exercising_policy(Precision precision, int new_tokens) {
  Policy p;
  p.batch = 4;
  p.attn_micro_batch = 8;
  p.prefill_chunk = 16;
  p.expert_batch = 5;
  p.kv_block_size = 4;
  p.kv_blocks = 4 * ((kLongestPrompt + new_tokens + 3) / 4);
  p.threads = 2;
  p.precision = precision;
  return p;
}

// A tiny preset with its experts quantized: the offload paths' quantized cases, against the CPU
// engine on the same quantized model. Named "tiny_mixtral_int8" and so on.
struct QuantizedTinyCase {
  const char* preset;
  ExpertDtype dtype;
  int group;
};

inline std::vector<QuantizedTinyCase> quantized_tiny_cases() {
  return {{"tiny-mixtral", ExpertDtype::kInt8, 32},
          {"tiny-mixtral", ExpertDtype::kInt4, 32},
          {"tiny-qwen2-moe", ExpertDtype::kInt8, 8},
          {"tiny-qwen2-moe", ExpertDtype::kInt4, 8}};
}

inline std::string quantized_case_name(const ::testing::TestParamInfo<QuantizedTinyCase>& info) {
  return preset_dtype_name(info.param.preset, info.param.dtype);
}

}  // namespace sluice::testing
