// The engine against the reference forward: same greedy tokens, same logits.
#include "engine/batch_engine.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

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
  // (request, position, layer) -> the experts the token was routed to, in rank order
  std::map<std::tuple<int64_t, int, int>, std::vector<int>> experts;
  std::vector<Request> requests;
  EngineStats stats;
};

EngineRun run_engine(const Model& model, const Policy& policy) {
  BatchEngine engine(model, policy);
  EngineRun run;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    run.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  engine.set_routing_observer([&](int64_t id, int pos, int layer, std::span<const int> experts) {
    run.experts[{id, pos, layer}].assign(experts.begin(), experts.end());
  });
  for (int i = 0; i < int(std::size(kPromptLengths)); ++i) {
    Request r;
    r.id = i;
    r.prompt = prompt_of(kPromptLengths[i], i, model.config.vocab_size);
    r.max_new_tokens = kNew;
    run.requests.push_back(r);
  }
  engine.run(run.requests, [&](Completion&& c) { run.done[c.id] = std::move(c); });
  run.stats = engine.stats();
  return run;
}

EngineRun run_engine(const Model& model, Precision precision) {
  return run_engine(model, testing::exercising_policy(precision, kNew));
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
    return run_at_level(m, testing::exercising_policy(precision, kNew));
  }
  EngineRun run_at_level(const Model& m, const Policy& policy) const {
    cpu::ScopedIsaLevel at(std::get<1>(GetParam()));
    return run_engine(m, policy);
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

// The bf16 path's tolerance against its reference, relative to the largest value compared:
// 1e-2, between 1.3 and 2.6 bf16 ulps of that value (bf16 keeps 8 significant bits).
constexpr double kBf16Tolerance = 1e-2;

// How close two candidates of a choice (two experts' router logits, two tokens' logits) may lie
// for bf16 rounding to decide between them either way: the tolerance, of the largest value. The
// test holds each compared value to that much (measured worst: 0.0059 of the largest logit), so
// two candidates closer than it may be ordered either way in the two computations.
float bf16_noise(std::span<const float> values) {
  float largest = 0;
  for (float v : values) largest = std::max(largest, std::abs(v));
  return float(kBf16Tolerance) * largest;
}

bool same_experts(std::vector<int> a, std::vector<int> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// Whether the experts `chosen` become the reference's own choice once their router logits are
// raised by bf16 noise: a near-tie, which rounding can decide either way.
bool within_bf16_noise(const Model& m, const RouterDecision& d, const std::vector<int>& chosen) {
  std::vector<float> raised(d.logits.begin(), d.logits.end());
  for (int e : chosen) raised[size_t(e)] += bf16_noise(d.logits);
  return same_experts(select_experts(m.config, m.weights.layers[size_t(d.layer)], raised), chosen);
}

// bf16 precision (the fast path) rounds activations at every GEMM input, as a bf16 transformers
// run does. Its reference is the reference forward rounding at the same points, teacher-forced
// along the engine's own continuation and routed to the experts the engine chose: every position
// within the tolerance; the same argmax, or the engine's within bf16 noise of the best.
//
// The two computations differ in the order of fp32 additions, so now and then a value lands on
// the other side of a bf16 rounding boundary in one of them: an error of one bf16 ulp, which
// spreads to the values computed from it. Where a router's k-th and (k+1)-th logits lie closer
// than that noise, the two pick different experts and part by far more than rounding (measured:
// with clang's build, two logits 0.0028 apart at 1.52 sent one position of 224 to 0.081). So the
// reference replays the engine's choices, and wherever they differ from its own, the test asserts
// a near-tie: the engine's experts win once raised by bf16 noise. (Measured over every case and
// level: such near-ties need up to 0.2% of the largest router logit, a different argmax 0.3% of
// the largest logit; a wrong expert or token is typically tens of percent away.)
TEST_P(BatchEngineMatchesReference, Bf16LogitsMatchTheBf16RoundingReference) {
  const Model m = model();
  EngineRun run = run_at_level(m, Precision::kBf16);
  ASSERT_EQ(run.done.size(), std::size(kPromptLengths));
  const size_t V = size_t(m.config.vocab_size);
  double worst = 0;
  int positions = 0, same_argmax = 0, within = 0, routings = 0, other_experts = 0;
  for (const Request& r : run.requests) {
    std::vector<int> sequence = r.prompt;
    const auto& generated = run.done[r.id].tokens;
    sequence.insert(sequence.end(), generated.begin(), generated.end() - 1);
    ReferenceForward ref(m, {.bf16_gemm_inputs = true, .bf16_kv_cache = true});
    ref.set_expert_choice([&](const RouterDecision& d) {
      const auto found = run.experts.find({r.id, d.position, d.layer});
      if (found == run.experts.end()) {
        ADD_FAILURE() << "the engine did not route request " << r.id << " position " << d.position
                      << " in layer " << d.layer;
        return std::vector<int>(d.experts.begin(), d.experts.end());
      }
      ++routings;
      if (!same_experts(found->second, {d.experts.begin(), d.experts.end()})) {
        ++other_experts;
        EXPECT_TRUE(within_bf16_noise(m, d, found->second))
            << "request " << r.id << " position " << d.position << " layer " << d.layer;
      }
      return found->second;
    });
    std::vector<float> logits = ref.forward(sequence);
    for (int i = 0; i < kNew; ++i) {
      const int pos = int(r.prompt.size()) - 1 + i;
      std::span<const float> row(logits.data() + size_t(pos) * V, V);
      const auto& got = run.logits[{r.id, pos}];
      ASSERT_EQ(got.size(), V);
      const double e = relative_max_error(got, row);
      worst = std::max(worst, e);
      within += e < kBf16Tolerance;
      ++positions;
      const int best = argmax(row), picked = argmax(got);
      same_argmax += picked == best;
      EXPECT_LE(row[size_t(best)] - row[size_t(picked)], bf16_noise(row))
          << "request " << r.id << " position " << pos;
    }
  }
  std::printf(
      "bf16 precision: %d of %d positions within %g (worst %.3g); same argmax at %d; the "
      "engine's experts differ from the reference's own at %d of %d token-layers\n",
      within, positions, kBf16Tolerance, worst, same_argmax, other_experts, routings);
  EXPECT_EQ(within, positions);
}

// Runs of experts with few rows run at once, one per thread, and the others one after another,
// each GEMM on every thread. Either way their outputs join each token in expert order, so one
// thread and two give the same bits. With an expert batch of 64, the prefill steps' 16 tokens
// give each of 8 experts a few rows (a concurrent run); with this suite's policy (b_e = 5) no
// run fits, and every expert runs alone.
TEST_P(BatchEngineMatchesReference, OneThreadAndTwoGiveTheSameBits) {
  const Model m = model();
  for (const int expert_batch : {5, 64}) {
    Policy p = testing::exercising_policy(Precision::kBf16, kNew);
    p.expert_batch = expert_batch;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const EngineRun one = run_at_level(m, p);
    omp_set_num_threads(2);
    const EngineRun two = run_at_level(m, p);
    omp_set_num_threads(saved);
    EXPECT_EQ(one.stats.concurrent_expert_calls, 0);
    if (expert_batch == 64 && m.config.num_experts >= 8) {
      EXPECT_GT(two.stats.concurrent_expert_calls, 0) << "no experts ran at once";
    }
    ASSERT_EQ(one.logits.size(), two.logits.size());
    ASSERT_FALSE(one.logits.empty());
    for (const auto& [at, row] : one.logits)
      EXPECT_EQ(row, two.logits.at(at))
          << "b_e " << expert_batch << ", request " << at.first << " position " << at.second;
  }
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
