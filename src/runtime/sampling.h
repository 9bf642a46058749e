// Next-token choice from logits: greedy at temperature 0, otherwise temperature, top-k and
// top-p (nucleus) filtering in that order, as transformers' logits warpers apply them.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace sluice {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: no limit
  uint64_t seed = 0;
};

void validate(const SamplingParams& p);  // fails naming the bad field

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int argmax(std::span<const float> logits);  // lowest index among equal maxima

// A generated token's log probability under the model's own distribution (log-softmax of the raw
// logits, before temperature, top-k and top-p, as vLLM reports it), and the `top` most likely
// tokens with theirs, most likely first (ties: lower id first).
struct TokenLogprob {
  int token = 0;
  float logprob = 0;
  std::vector<std::pair<int, float>> top;
};
TokenLogprob token_logprob(std::span<const float> logits, int token, int top);

}  // namespace sluice
