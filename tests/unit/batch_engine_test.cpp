// The engine against the reference forward: same greedy tokens, same logits.
#include "engine/batch_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "kernels/cpu/isa.h"
#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

using testing::relative_max_error;

using Case = testing::TinyModelCase;

constexpr int kNew = 32;
using testing::kPromptLengths;
using testing::prompt_of;

struct EngineRun {
  std::map<int64_t, Completion> done;
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;  // (request, position) -> row
  std::vector<Request> requests;
};

EngineRun run_engine(const Model& model, Precision precision) {
  BatchEngine engine(model, testing::exercising_policy(precision, kNew));
  EngineRun run;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    run.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  for (int i = 0; i < int(std::size(kPromptLengths)); ++i) {
    Request r;
    r.id = i;
    r.prompt = prompt_of(kPromptLengths[i], i, model.config.vocab_size);
    r.max_new_tokens = kNew;
    run.requests.push_back(r);
  }
  engine.run(run.requests, [&](Completion&& c) { run.done[c.id] = std::move(c); });
  return run;
}

// Each tiny model at every ISA level this run offers (SLUICE_ISA lowers the top): the engine runs
// at that level, the reference forward is plain C++ at any level.
// Every family's tiny model and its feature variants (family_cases, which the offload executor's
// tests run too), and two attention shapes.
std::vector<Case> engine_cases() {
  std::vector<Case> cases = testing::family_cases();
  cases.push_back({"attention_narrower_than_hidden",  // heads·head_dim 32 < hidden 64
                   [](ModelConfig& c) { c.head_dim = 8; }});
  cases.push_back({"one_kv_head_top1_tied", [](ModelConfig& c) {
                     c.num_heads = 4;
                     c.num_kv_heads = 1;
                     c.head_dim = 24;
                     c.experts_per_token = 1;
                     c.tie_word_embeddings = true;
                   }});
  return cases;
}

class BatchEngineMatchesReference
    : public ::testing::TestWithParam<std::tuple<Case, cpu::IsaLevel>> {
 protected:
  Model model() const {
    ModelConfig config = preset_config("tiny-mixtral");
    std::get<0>(GetParam()).edit(config);
    return make_random_model(config, 42);
  }
  EngineRun run_at_level(const Model& m, Precision precision) const {
    cpu::ScopedIsaLevel at(std::get<1>(GetParam()));
    return run_engine(m, precision);
  }
};

// fp32 precision: the engine computes what the reference computes with its KV cache stored in
// bf16, up to the order of additions: greedy continuations are identical token for token, each
// prompt alone through the reference. Logits agree to ~1e-6 until a K or V element lands on the
// other side of a bf16 rounding boundary in one path and not the other (their fp32 inputs differ
// in the last bits); one such flip moves logits by up to ~6e-4 relative (measured), hence 1e-3,
// ten times inside the foundation tolerance of 1e-2.
TEST_P(BatchEngineMatchesReference, Fp32GreedyContinuationsEqualTheReference) {
  const Model m = model();
  EngineRun run = run_at_level(m, Precision::kF32);
  ASSERT_EQ(run.done.size(), std::size(kPromptLengths));
  const size_t V = size_t(m.config.vocab_size);
  double worst = 0;
  for (const Request& r : run.requests) {
    ReferenceForward ref(m, {.bf16_gemm_inputs = false, .bf16_kv_cache = true});
    std::vector<float> logits = ref.forward(r.prompt);
    std::vector<int> expected;
    for (int i = 0; i < kNew; ++i) {
      std::span<const float> row(logits.data() + logits.size() - V, V);
      const int pos = int(r.prompt.size()) - 1 + i;
      const auto& got = run.logits[{r.id, pos}];
      ASSERT_EQ(got.size(), V) << "no logits for request " << r.id << " position " << pos;
      const double e = relative_max_error(got, row);
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-3) << "request " << r.id << " position " << pos;
      expected.push_back(argmax(row));
      int one[] = {expected.back()};
      logits = ref.forward(one);
    }
    EXPECT_EQ(run.done[r.id].tokens, expected)
        << "request " << r.id << " (prompt " << r.prompt.size() << ")";
  }
  std::printf("fp32 precision: worst relative logit error %.3g\n", worst);
}

// bf16 precision (the fast path) rounds activations at every GEMM input, as a bf16 transformers
// run does. Its reference is the reference forward rounding at the same points (teacher-forced
// along the engine's own continuation): every position within the foundation tolerance, same
// argmax everywhere. Against the pure fp32 semantics the bf16 path differs more where a near-tie
// between experts is decided the other way by rounding upstream of the (fp32) router — a
// property of bf16 MoE inference, not of this engine (measured on these models: ~90% of
// positions within 1e-2, 99.5% same argmax).
//
// DeepSeek-V3's tiny model, with FP8 weights and with bf16 ones, is left out here (its fp32 test
// above holds at every level): its
// sigmoid scores of random router logits crowd around 0.5, so the biased choice and the
// best-two group ranks have near-ties (measured: expert gaps down to 1e-4 and group gaps down to
// 2e-6 over the 224 positions), which bf16 rounding of the activations decides either way: at
// the AVX2 level 6 of 224 positions differ by up to 0.2 after one such flip, and the two best
// logits of a few positions lie within 1e-2 of each other.
TEST_P(BatchEngineMatchesReference, Bf16LogitsMatchTheBf16RoundingReference) {
  if (std::string(std::get<0>(GetParam()).name).rfind("tiny_deepseek_v3", 0) == 0)
    GTEST_SKIP() << "bf16 near-ties of sigmoid routing on random weights (see above)";
  const Model m = model();
  EngineRun run = run_at_level(m, Precision::kBf16);
  ASSERT_EQ(run.done.size(), std::size(kPromptLengths));
  const size_t V = size_t(m.config.vocab_size);
  double worst = 0;
  int positions = 0, same_argmax = 0, within = 0;
  for (const Request& r : run.requests) {
    std::vector<int> sequence = r.prompt;
    const auto& generated = run.done[r.id].tokens;
    sequence.insert(sequence.end(), generated.begin(), generated.end() - 1);
    ReferenceForward ref(m, {.bf16_gemm_inputs = true, .bf16_kv_cache = true});
    std::vector<float> logits = ref.forward(sequence);
    for (int i = 0; i < kNew; ++i) {
      const int pos = int(r.prompt.size()) - 1 + i;
      std::span<const float> row(logits.data() + size_t(pos) * V, V);
      const auto& got = run.logits[{r.id, pos}];
      ASSERT_EQ(got.size(), V);
      const double e = relative_max_error(got, row);
      worst = std::max(worst, e);
      within += e < 1e-2;
      ++positions;
      same_argmax += argmax(got) == argmax(row);
    }
  }
  std::printf("bf16 precision: %d of %d positions within 1e-2 (worst %.3g); same argmax at %d\n",
              within, positions, worst, same_argmax);
  EXPECT_EQ(within, positions);
  EXPECT_EQ(same_argmax, positions);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, BatchEngineMatchesReference,
                         ::testing::Combine(::testing::ValuesIn(engine_cases()),
                                            ::testing::ValuesIn(cpu::isa_levels_up_to_current())),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) + "_" +
                                  cpu::isa_name(std::get<1>(p.param));
                         });

// Requests that can never run (a prompt that fills the context; a sequence needing more KV blocks
// than the cache has) fail alone, reported first through on_finished; the others run as they run
// without them, token for token.
TEST(BatchEngineFailures, ARequestThatCanNeverRunFailsAloneAndTheOthersRun) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 42);
  const EngineRun want = run_engine(m, Precision::kF32);
  const Policy p = testing::exercising_policy(Precision::kF32, kNew);
  const int context = m.config.max_position_embeddings;
  std::vector<Request> requests = want.requests;
  Request too_long;
  too_long.id = 98;
  too_long.prompt = prompt_of(context, 98, m.config.vocab_size);
  too_long.max_new_tokens = 1;
  Request too_big;
  too_big.id = 99;
  too_big.prompt = prompt_of(p.kv_blocks * p.kv_block_size, 99, m.config.vocab_size);
  too_big.max_new_tokens = 1;
  requests.insert(requests.begin() + 2, too_big);
  requests.push_back(too_long);
  BatchEngine engine(m, p);
  std::vector<int64_t> order;
  std::map<int64_t, Completion> done;
  engine.run(requests, [&](Completion&& c) {
    order.push_back(c.id);
    done[c.id] = std::move(c);
  });
  ASSERT_EQ(done.size(), want.done.size() + 2);
  ASSERT_GE(order.size(), 2u);
  EXPECT_EQ(std::vector<int64_t>(order.begin(), order.begin() + 2), (std::vector<int64_t>{99, 98}));
  EXPECT_EQ(done[98].reason, FinishReason::kError);
  EXPECT_EQ(done[98].failure, RequestFailure::kPromptTooLong);
  EXPECT_EQ(done[99].reason, FinishReason::kError);
  EXPECT_EQ(done[99].failure, RequestFailure::kKvCacheTooSmall);
  EXPECT_NE(done[99].error.find("the largest KV pool has " + std::to_string(p.kv_blocks)),
            std::string::npos)
      << done[99].error;
  for (int64_t id : {98, 99}) {
    EXPECT_TRUE(done[id].tokens.empty());
    EXPECT_STREQ(finish_reason_name(done[id].reason), "error");
  }
  for (const auto& [id, c] : want.done) {
    EXPECT_EQ(done[id].tokens, c.tokens) << "request " << id;
    EXPECT_EQ(done[id].reason, c.reason) << "request " << id;
  }
}

}  // namespace
}  // namespace sluice
