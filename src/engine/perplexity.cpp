#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sluice {
namespace {

double log_sum_exp(std::span<const float> row) {
  const float top = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float v : row) sum += std::exp(double(v) - top);
  return top + std::log(sum);
}

// One request per window: its prompt is the window less its last token, whose prompt rows from
// `first` on are scored; the one token generated is not used.
std::vector<Request> window_requests(const PerplexityWindows& w, size_t begin, size_t end) {
  std::vector<Request> requests;
  for (size_t i = begin; i < end; ++i) {
    Request r;
    r.id = int64_t(i);
    r.prompt = w.inputs[i];
    r.max_new_tokens = 1;
    r.ignore_eos = true;
    r.score_prompt_from = w.first;
    requests.push_back(std::move(r));
  }
  return requests;
}

// Runs windows [begin, end) through the engine, handing each scored row to `on_row` with its
// window and its index among the window's scored rows.
void run_windows(BatchEngine& engine, const PerplexityWindows& w, size_t begin, size_t end,
                 const std::function<void(size_t, int, std::span<const float>)>& on_row,
                 const std::function<void(const Completion&)>& on_window) {
  const int scored = w.ctx - 1 - w.first;
  engine.set_logits_observer([&](int64_t id, int position, std::span<const float> row) {
    const int index = position - w.first;
    if (index >= 0 && index < scored) on_row(size_t(id), index, row);
  });
  engine.run(window_requests(w, begin, end), [&](Completion&& c) {
    if (c.reason == FinishReason::kError)
      fail("perplexity: window {} could not run: {}", c.id, c.error);
    on_window(c);
  });
  engine.set_logits_observer({});
}

}  // namespace

PerplexityWindows make_windows(std::span<const int32_t> tokens, int ctx, int bos) {
  if (ctx < 4) fail("perplexity: --ctx is {}, expected at least 4", ctx);
  if (int64_t(tokens.size()) < ctx)
    fail("perplexity: the text has {} tokens, fewer than one window of --ctx {}", tokens.size(),
         ctx);
  PerplexityWindows w;
  w.ctx = ctx;
  w.first = ctx / 2;
  for (size_t start = 0; start + size_t(ctx) <= tokens.size(); start += size_t(ctx)) {
    std::vector<int> window(tokens.begin() + ptrdiff_t(start),
                            tokens.begin() + ptrdiff_t(start) + ctx);
    if (bos >= 0) window[0] = bos;
    w.targets.emplace_back(window.begin() + w.first + 1, window.end());
    window.pop_back();
    w.inputs.push_back(std::move(window));
  }
  return w;
}

double RunningMean::mean() const {
  return count > 0 ? sum / double(count) : 0.0;
}

double RunningMean::std_error() const {
  if (count < 2) return 0.0;
  const double m = mean();
  const double variance = std::max(0.0, (sum_sq - double(count) * m * m) / double(count - 1));
  return std::sqrt(variance / double(count));
}

double PerplexityResult::perplexity() const {
  return std::exp(nll.mean());
}

double PerplexityResult::std_error() const {
  return perplexity() * nll.std_error();
}

double ComparisonResult::top1_agreement() const {
  return kl.count > 0 ? double(same_top1) / double(kl.count) : 0.0;
}

PerplexityResult score_perplexity(BatchEngine& engine, const PerplexityWindows& w,
                                  const PerplexityProgress& progress) {
  PerplexityResult result;
  int64_t done = 0;
  run_windows(
      engine, w, 0, w.inputs.size(),
      [&](size_t window, int index, std::span<const float> row) {
        result.nll.add(log_sum_exp(row) - row[size_t(w.targets[window][size_t(index)])]);
      },
      [&](const Completion&) {
        if (progress) progress(++done, int64_t(w.inputs.size()), result);
      });
  return result;
}

ComparisonResult compare_models(BatchEngine& base, BatchEngine& other, const PerplexityWindows& w,
                                int windows_at_once, const PerplexityProgress& progress) {
  if (windows_at_once < 1)
    fail("perplexity: windows at once is {}, expected >= 1", windows_at_once);
  ComparisonResult result;
  const int scored = w.ctx - 1 - w.first;
  std::vector<float> base_logp;  // [window in chunk][scored row][vocab]
  std::vector<int> base_top1;    // [window in chunk][scored row]
  size_t vocab = 0;
  int64_t done = 0;
  for (size_t begin = 0; begin < w.inputs.size(); begin += size_t(windows_at_once)) {
    const size_t end = std::min(w.inputs.size(), begin + size_t(windows_at_once));
    base_top1.assign((end - begin) * size_t(scored), -1);
    run_windows(
        base, w, begin, end,
        [&](size_t window, int index, std::span<const float> row) {
          vocab = row.size();
          base_logp.resize((end - begin) * size_t(scored) * vocab);
          const size_t at = (window - begin) * size_t(scored) + size_t(index);
          const double lse = log_sum_exp(row);
          for (size_t v = 0; v < vocab; ++v) base_logp[at * vocab + v] = float(row[v] - lse);
          base_top1[at] = argmax(row);
          result.base.nll.add(lse - row[size_t(w.targets[window][size_t(index)])]);
        },
        [](const Completion&) {});
    run_windows(
        other, w, begin, end,
        [&](size_t window, int index, std::span<const float> row) {
          if (row.size() != vocab)
            fail("perplexity: the compared models' vocabularies differ ({} and {} tokens)", vocab,
                 row.size());
          const size_t at = (window - begin) * size_t(scored) + size_t(index);
          const double lse = log_sum_exp(row);
          double kl = 0;
          for (size_t v = 0; v < vocab; ++v) {
            // Both sides' log-probabilities rounded to float alike (the base's are stored so).
            const double lp = base_logp[at * vocab + v];
            kl += std::exp(lp) * (lp - double(float(row[v] - lse)));
          }
          result.kl.add(kl);
          result.same_top1 += argmax(row) == base_top1[at] ? 1 : 0;
          result.other.nll.add(lse - row[size_t(w.targets[window][size_t(index)])]);
        },
        [&](const Completion&) {
          if (progress) progress(++done, int64_t(w.inputs.size()), result.other);
        });
  }
  return result;
}

}  // namespace sluice
