// The engine against the reference forward: same greedy tokens, same logits.
#include "engine/batch_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"

namespace sluice {
namespace {

struct Case {
  const char* name;
  std::function<void(ModelConfig&)> edit;
};

ModelConfig case_config(const Case& c) {
  ModelConfig config = preset_config("tiny-mixtral");
  c.edit(config);
  return config;
}

std::vector<int> prompt_of(int length, int salt, int vocab) {
  std::vector<int> p;
  for (int i = 0; i < length; ++i) p.push_back(3 + (i * 37 + salt * 101) % (vocab - 3));
  return p;
}

// Greedy continuation of one prompt through the reference forward, logits of each step kept.
std::vector<int> reference_greedy(const Model& m, const std::vector<int>& prompt, int n,
                                  ReferenceOptions options, std::vector<std::vector<float>>* rows) {
  ReferenceForward f(m, options);
  std::vector<float> logits = f.forward(prompt);
  std::vector<int> out;
  const size_t V = size_t(m.config.vocab_size);
  for (int i = 0; i < n; ++i) {
    std::vector<float> row(logits.end() - V, logits.end());
    int next = argmax(row);
    rows->push_back(std::move(row));
    out.push_back(next);
    int one[] = {next};
    logits = f.forward(one);
  }
  return out;
}

double relative_max_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

class BatchEngineMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(BatchEngineMatchesReference, GreedyTokensAndLogits) {
  const ModelConfig config = case_config(GetParam());
  Model model = make_random_model(config, 42);
  const int kNew = 32;
  const int lengths[] = {1, 3, 7, 12, 20, 33, 5};

  // A policy that exercises every mechanism on a tiny model: refill (B < requests), several
  // micro-batches, prefill split into chunks, expert GEMMs split at b_e, KV blocks crossed.
  Policy p;
  p.batch = 4;
  p.attn_micro_batch = 8;
  p.prefill_chunk = 16;
  p.expert_batch = 5;
  p.kv_block_size = 4;
  p.kv_blocks = 4 * ((33 + kNew + 3) / 4);
  p.threads = 2;
  BatchEngine engine(model, p);
  std::map<std::pair<int64_t, int>, std::vector<float>> engine_logits;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    engine_logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  std::vector<Request> requests;
  for (int i = 0; i < int(std::size(lengths)); ++i) {
    Request r;
    r.id = i;
    r.prompt = prompt_of(lengths[i], i, config.vocab_size);
    r.max_new_tokens = kNew;
    requests.push_back(r);
  }
  std::map<int64_t, Completion> done;
  engine.run(requests, [&](Completion&& c) { done[c.id] = std::move(c); });
  ASSERT_EQ(done.size(), std::size(lengths));

  double worst_emulated = 0, worst_fp32 = 0;
  for (const Request& r : requests) {
    std::vector<std::vector<float>> emulated_rows, fp32_rows;
    std::vector<int> expected =
        reference_greedy(model, r.prompt, kNew, {true, true}, &emulated_rows);
    EXPECT_EQ(done[r.id].tokens, expected) << "request " << r.id << " (prompt " << r.prompt.size() << ")";
    std::vector<int> fp32_tokens = reference_greedy(model, r.prompt, 1, {}, &fp32_rows);
    for (int i = 0; i < kNew; ++i) {
      const int pos = int(r.prompt.size()) - 1 + i;
      const auto& row = engine_logits[{r.id, pos}];
      ASSERT_EQ(row.size(), size_t(config.vocab_size));
      double e = relative_max_error(row, emulated_rows[i]);
      worst_emulated = std::max(worst_emulated, e);
      EXPECT_LT(e, 1e-4) << "request " << r.id << " position " << pos;
    }
    // The first generated position against the pure fp32 transformers semantics.
    const auto& first = engine_logits[{r.id, int(r.prompt.size()) - 1}];
    double e = relative_max_error(first, fp32_rows[0]);
    worst_fp32 = std::max(worst_fp32, e);
    EXPECT_LT(e, 1e-2) << "request " << r.id;
    EXPECT_EQ(argmax(first), fp32_tokens[0]) << "request " << r.id;
  }
  RecordProperty("worst_relative_error_vs_bf16_emulating_reference", std::to_string(worst_emulated));
  RecordProperty("worst_relative_error_vs_fp32_reference", std::to_string(worst_fp32));
  std::printf("worst relative logit error: %.3g vs bf16-storage reference, %.3g vs fp32 reference\n",
              worst_emulated, worst_fp32);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, BatchEngineMatchesReference,
    ::testing::Values(
        Case{"tiny_mixtral", [](ModelConfig&) {}},
        Case{"sliding_window_gqa3_top3_odd_vocab",
             [](ModelConfig& c) {
               c.sliding_window = 6;
               c.num_heads = 6;
               c.num_kv_heads = 2;
               c.head_dim = 16;
               c.experts_per_token = 3;
               c.num_experts = 5;
               c.vocab_size = 301;
               c.num_layers = 3;
             }},
        Case{"one_kv_head_top1_tied",
             [](ModelConfig& c) {
               c.num_heads = 4;
               c.num_kv_heads = 1;
               c.head_dim = 24;
               c.experts_per_token = 1;
               c.tie_word_embeddings = true;
             }}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sluice
