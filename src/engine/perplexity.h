// Perplexity of a model over a text, as llama.cpp's perplexity tool measures it, through the
// batch engine; and the KL divergence and top-1 agreement of a second model (or precision)
// against the first, over the same positions.
//
// The text's tokens (no BOS) are cut into non-overlapping windows of ctx tokens; the tokens left
// over at the end are not scored. Each window's first token is replaced by BOS when the tokenizer
// has one. In each window the predictions of tokens [ctx/2 + 1, ctx) are scored, each from the
// window's tokens before it, so every scored token has at least ctx/2 tokens of context:
//     NLL(t) = logsumexp(logits) − logits[t]          perplexity = exp(mean NLL)
// with the standard error exp(mean)·stddev(NLL)/√N (the delta method, as llama.cpp reports it).
// scripts/train-demo-model.py computes the same figure for the model it trains.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/batch_engine.h"

namespace sluice {

struct PerplexityWindows {
  int ctx = 0;
  int first = 0;                          // logits of positions [first, ctx − 1) are scored
  std::vector<std::vector<int>> inputs;   // each window's tokens [0, ctx − 1): the prompt
  std::vector<std::vector<int>> targets;  // each window's tokens [first + 1, ctx)
  int64_t scored_tokens() const { return int64_t(targets.size()) * (ctx - 1 - first); }
};

// Fails (naming the values) when ctx < 4 or the text holds fewer than ctx tokens.
PerplexityWindows make_windows(std::span<const int32_t> tokens, int ctx, int bos);

// Running sums of a per-token quantity: its mean and the standard error of the mean.
struct RunningMean {
  double sum = 0, sum_sq = 0;
  int64_t count = 0;
  void add(double v) { sum += v, sum_sq += v * v, ++count; }
  double mean() const;
  double std_error() const;  // 0 for fewer than two values
};

struct PerplexityResult {
  RunningMean nll;
  double perplexity() const;
  double std_error() const;
};

struct ComparisonResult {
  PerplexityResult base, other;
  RunningMean kl;         // KL(base ‖ other) per scored position, in nats
  int64_t same_top1 = 0;  // positions where both put the highest logit on the same token
  double top1_agreement() const;
};

// Called after each window is scored: windows done, windows in all, the result so far.
using PerplexityProgress = std::function<void(int64_t, int64_t, const PerplexityResult&)>;

// Scores every window in one run of the engine (its policy bounds how many run at once).
PerplexityResult score_perplexity(BatchEngine& engine, const PerplexityWindows& w,
                                  const PerplexityProgress& progress = {});

// Scores the windows with both engines, `windows_at_once` windows at a time (each engine's
// log-probabilities of those windows are held in memory together: windows × (ctx/2) × vocab
// floats).
ComparisonResult compare_models(BatchEngine& base, BatchEngine& other, const PerplexityWindows& w,
                                int windows_at_once, const PerplexityProgress& progress = {});

}  // namespace sluice
