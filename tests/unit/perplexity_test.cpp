// Scored prompts through the engine (Request::score_prompt_from), and the perplexity and model
// comparison built on them, against the reference forward.
#include "engine/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

Model tiny_model(uint64_t seed) {
  return make_random_model(preset_config("tiny-mixtral"), seed);
}

std::vector<int32_t> some_tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 37 + salt * 11 + 5) % (vocab - 3)) + 3);
  return t;
}

Policy fp32_policy() {
  return testing::exercising_policy(Precision::kF32, 4);
}

// The reference's logits for every position of `prompt`, fp32 GEMMs and a bf16 KV cache as the
// engine's fp32 precision keeps it.
std::vector<float> reference_logits(const Model& m, std::span<const int> prompt) {
  ReferenceForward ref(m, {.bf16_gemm_inputs = false, .bf16_kv_cache = true});
  return ref.forward(prompt);
}

// Every scored position of every request, on the CPU engine and the offload path: the logits
// the reference forward gives the same prompt, within the engine tests' fp32 bound (1e-3, see
// batch_engine_test.cpp). The prompts are longer than the policy's prefill chunk (16), so their
// scored rows come from several steps.
TEST(PromptScoring, EveryScoredPositionHasTheReferenceLogits) {
  const Model m = tiny_model(42);
  std::vector<Request> requests;
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.id = i;
    auto t = some_tokens(20 + 7 * i, m.config.vocab_size, i);
    r.prompt.assign(t.begin(), t.end());
    r.max_new_tokens = 2;
    r.score_prompt_from = 3 + 5 * i;
    requests.push_back(r);
  }
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload (stand-in)" : "cpu");
    offload::CpuStandinDevice device(size_t(1) << 30);
    offload::HostMath math;
    EngineDevice on = offload ? EngineDevice{&device, &math, {}} : EngineDevice{};
    Policy p = fp32_policy();
    p.logit_rows = p.batch + p.prefill_chunk;
    BatchEngine engine(m, p, on);
    std::map<std::pair<int64_t, int>, std::vector<float>> seen;
    engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
      EXPECT_TRUE(seen.emplace(std::pair{id, pos}, std::vector(row.begin(), row.end())).second)
          << "request " << id << " position " << pos << " observed twice";
    });
    engine.run(requests, [](Completion&&) {});
    const size_t V = size_t(m.config.vocab_size);
    for (const Request& r : requests) {
      const std::vector<float> want = reference_logits(m, r.prompt);
      for (int pos = 0; pos < int(r.prompt.size()); ++pos) {
        auto it = seen.find({r.id, pos});
        if (pos < r.score_prompt_from) {
          EXPECT_EQ(it, seen.end()) << "position " << pos << " is before the scored range";
          continue;
        }
        ASSERT_NE(it, seen.end()) << "request " << r.id << " position " << pos;
        std::span<const float> ref(want.data() + size_t(pos) * V, V);
        EXPECT_LT(testing::relative_max_error(it->second, ref), 1e-3)
            << "request " << r.id << " position " << pos;
      }
    }
  }
}

TEST(Perplexity, WindowsAreLlamaCppsSplit) {
  std::vector<int32_t> t(23);
  for (int i = 0; i < 23; ++i) t[size_t(i)] = 100 + i;
  const PerplexityWindows w = make_windows(t, 8, 1);
  ASSERT_EQ(w.inputs.size(), 2u);  // 23 tokens: two windows of 8, 7 left unscored
  EXPECT_EQ(w.first, 4);
  EXPECT_EQ(w.inputs[1], (std::vector<int>{1, 109, 110, 111, 112, 113, 114}));
  EXPECT_EQ(w.targets[1], (std::vector<int>{113, 114, 115}));
  EXPECT_EQ(w.scored_tokens(), 6);
  const PerplexityWindows no_bos = make_windows(t, 8, -1);
  EXPECT_EQ(no_bos.inputs[0][0], 100);
  EXPECT_THROW(make_windows(t, 3, 1), std::runtime_error);
  EXPECT_THROW(make_windows(t, 24, 1), std::runtime_error);
}

// The perplexity of the engine's scored rows, against the same sums over the reference forward's
// logits of each window.
TEST(Perplexity, MatchesTheReferenceForward) {
  const Model m = tiny_model(7);
  const auto tokens = some_tokens(100, m.config.vocab_size, 3);
  const PerplexityWindows w = make_windows(tokens, 24, 1);
  BatchEngine engine(m, fp32_policy());
  int64_t progress_calls = 0;
  const PerplexityResult got =
      score_perplexity(engine, w, [&](int64_t done, int64_t total, const PerplexityResult&) {
        ++progress_calls;
        EXPECT_LE(done, total);
      });
  EXPECT_EQ(progress_calls, int64_t(w.inputs.size()));
  const size_t V = size_t(m.config.vocab_size);
  RunningMean want;
  for (size_t i = 0; i < w.inputs.size(); ++i) {
    const std::vector<float> logits = reference_logits(m, w.inputs[i]);
    for (size_t j = 0; j < w.targets[i].size(); ++j) {
      std::span<const float> row(logits.data() + (size_t(w.first) + j) * V, V);
      double sum = 0;
      for (float v : row) sum += std::exp(double(v));
      want.add(std::log(sum) - row[size_t(w.targets[i][j])]);
    }
  }
  ASSERT_EQ(got.nll.count, w.scored_tokens());
  EXPECT_NEAR(got.perplexity(), std::exp(want.mean()), 1e-4 * std::exp(want.mean()));
  EXPECT_NEAR(got.std_error(), std::exp(want.mean()) * want.std_error(), 1e-3 * got.std_error());
}

TEST(Perplexity, ComparisonOfAModelWithItselfHasNoDivergence) {
  const Model m = tiny_model(7);
  const PerplexityWindows w = make_windows(some_tokens(80, m.config.vocab_size, 1), 16, 1);
  BatchEngine a(m, fp32_policy()), b(m, fp32_policy());
  const ComparisonResult r = compare_models(a, b, w, 2);
  EXPECT_EQ(r.kl.count, w.scored_tokens());
  EXPECT_NEAR(r.kl.mean(), 0.0, 1e-9);
  EXPECT_EQ(r.top1_agreement(), 1.0);
  EXPECT_DOUBLE_EQ(r.base.perplexity(), r.other.perplexity());
}

// Against another model: the KL of the engines' rows equals the KL of the reference rows.
TEST(Perplexity, ComparisonMatchesTheReferenceDivergence) {
  const Model m = tiny_model(7), other = tiny_model(8);
  const PerplexityWindows w = make_windows(some_tokens(64, m.config.vocab_size, 2), 16, 1);
  BatchEngine a(m, fp32_policy()), b(other, fp32_policy());
  const ComparisonResult r = compare_models(a, b, w, 3);
  const size_t V = size_t(m.config.vocab_size);
  RunningMean kl;
  int64_t same = 0;
  for (size_t i = 0; i < w.inputs.size(); ++i) {
    const auto la = reference_logits(m, w.inputs[i]), lb = reference_logits(other, w.inputs[i]);
    for (size_t j = 0; j < w.targets[i].size(); ++j) {
      const float* pa = la.data() + (size_t(w.first) + j) * V;
      const float* pb = lb.data() + (size_t(w.first) + j) * V;
      double za = 0, zb = 0;
      for (size_t v = 0; v < V; ++v) za += std::exp(double(pa[v])), zb += std::exp(double(pb[v]));
      double d = 0;
      for (size_t v = 0; v < V; ++v) {
        const double lpa = pa[v] - std::log(za), lpb = pb[v] - std::log(zb);
        d += std::exp(lpa) * (lpa - lpb);
      }
      kl.add(d);
      same += std::max_element(pa, pa + V) - pa == std::max_element(pb, pb + V) - pb;
    }
  }
  EXPECT_GT(kl.mean(), 1e-3);  // two random models disagree
  EXPECT_NEAR(r.kl.mean(), kl.mean(), 1e-3 * kl.mean());
  EXPECT_EQ(r.same_top1, same);
}

TEST(PerplexityCli, ScoresATextFileAndSaysWhatIsWrong) {
  testing::TempDir dir;
  const ModelConfig config = preset_config("tiny-mixtral");
  std::filesystem::create_directories(dir / "model");
  write_random_checkpoint(config, dir / "model", 3);
  write_synthetic_tokenizer(config, dir / "model");
  std::string text;
  for (int i = 0; i < 40; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  testing::write_file(dir / "text.txt", text);
  auto r = testing::run_command(
      testing::sluice_command("perplexity --model " + (dir / "model").string() + " --file " +
                              (dir / "text.txt").string() + " --ctx 32 --json"),
      false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["ctx"], 32);
  EXPECT_GT(j["windows"].get<int>(), 1);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
  EXPECT_EQ(j["tokens_scored"].get<int64_t>(), j["windows"].get<int64_t>() * 15);

  // --expert-dtype alone: the model against its own int8 experts.
  r = testing::run_command(
      testing::sluice_command("perplexity --model " + (dir / "model").string() + " --file " +
                              (dir / "text.txt").string() +
                              " --ctx 32 --json --expert-dtype int8 --expert-group 16"),
      false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto q = nlohmann::json::parse(r.output);
  EXPECT_DOUBLE_EQ(q["perplexity"].get<double>(), j["perplexity"].get<double>());
  EXPECT_GT(q["compare"]["mean_kl_divergence"].get<double>(), 0.0);
  EXPECT_LT(q["compare"]["mean_kl_divergence"].get<double>(), 0.05);
  EXPECT_GT(q["compare"]["top1_agreement"].get<double>(), 0.5);
  EXPECT_NE(q["compare"]["model"].get<std::string>().find("int8 experts"), std::string::npos);

  r = testing::run_command(testing::sluice_command("perplexity --model " +
                                                   (dir / "model").string() + " --file " +
                                                   (dir / "missing.txt").string()));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("missing.txt: cannot open the text file"), std::string::npos) << r.output;
  r = testing::run_command(testing::sluice_command("perplexity --model " +
                                                   (dir / "model").string() + " --file " +
                                                   (dir / "text.txt").string() + " --ctx 100000"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("max_position_embeddings"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sluice
