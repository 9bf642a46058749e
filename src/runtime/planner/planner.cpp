#include "runtime/planner/planner.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/units.h"

namespace sluice {

size_t model_weight_bytes(const ModelConfig& c) {
  const size_t H = size_t(c.hidden_size), I = size_t(c.expert_intermediate_size);
  const size_t E = size_t(c.num_experts), V = size_t(c.vocab_size);
  const size_t layer =
      H * size_t(c.q_dim()) * 2 + H * size_t(c.kv_dim()) * 2 + E * H + E * 3 * H * I;
  return 2 * (V * H * (c.tie_word_embeddings ? 1 : 2) + size_t(c.num_layers) * layer) +
         size_t(c.num_layers) * 2 * H * 4 + H * 4;
}

// The engine's step buffers (BatchEngine::Impl::grow and expert_phase) at the largest step:
// a full prefill chunk plus one decode token for every other sequence.
HostMemoryUse host_memory_use(const ModelConfig& c, const Policy& p) {
  HostMemoryUse m;
  m.weights = model_weight_bytes(c);
  m.kv_cache = size_t(p.kv_blocks) * kv_bytes_per_token(c) * size_t(p.kv_block_size);
  const size_t T = size_t(p.prefill_chunk + p.batch), H = size_t(c.hidden_size);
  const size_t I = size_t(c.expert_intermediate_size), be = size_t(p.expert_batch);
  const size_t per_token = H * 4 * 2 + size_t(c.q_dim()) * 4 * 2 + size_t(c.kv_dim()) * 4 * 2 +
                           size_t(c.num_experts) * 4 + H * 2 + size_t(c.experts_per_token) * 8 +
                           H * 2 /* bf16 GEMM input scratch */;
  m.activations =
      T * per_token + be * (H * 4 + I * 4 * 3 + H * 4) + size_t(p.batch) * size_t(c.vocab_size) * 4;
  return m;
}

std::vector<WorkloadRequest> uniform_workload(int requests, int prompt_tokens, int new_tokens) {
  return std::vector<WorkloadRequest>(size_t(std::max(0, requests)),
                                      WorkloadRequest{prompt_tokens, new_tokens});
}

Prediction predict(const HardwareProfile& hw, const ModelConfig& c, const Policy& policy,
                   const std::vector<WorkloadRequest>& workload) {
  return predict_workload(CpuCostModel(hw, c, policy), workload);
}

std::string PhaseBottleneck::sentence() const {
  const char* what = bound == Bound::kCompute ? "GEMM compute" : "DRAM bandwidth";
  if (group.rfind("attention (KV", 0) == 0 && bound == Bound::kMemory) what = "DRAM bandwidth";
  if (bound == Bound::kLink) what = "link bandwidth";
  const char* verb = bound == Bound::kCompute ? "in" : "while reading weights in";
  if (group.rfind("attention (KV", 0) == 0) verb = "in";
  if (group.find("norms") != std::string::npos || group.find("SiLU") != std::string::npos ||
      group.find("gather") != std::string::npos)
    what = "memory bandwidth", verb = "in the elementwise passes:";
  return fmt::format(
      "{} is bound by {} {} {}: {:.0f}% of step time ({:.1f} ms per step of {} tokens)", phase,
      what, verb, group, 100 * fraction, 1e3 * step_seconds, step.tokens());
}

namespace {

PhaseBottleneck bottleneck_of(const CpuCostModel& model, const std::string& phase,
                              const StepShape& step) {
  const TaskGraph g = model.step_graph(step);
  const double total = g.critical_path_seconds();
  std::map<std::string, double> by_group, compute_by_group;
  for (int v : g.critical_path()) {
    const Task& t = g.tasks()[size_t(v)];
    by_group[t.group] += t.seconds;
    if (t.bound == Bound::kCompute) compute_by_group[t.group] += t.seconds;
  }
  PhaseBottleneck b;
  b.phase = phase;
  b.step = step;
  b.step_seconds = total;
  for (const auto& [group, s] : by_group)
    if (s > b.fraction * total) b.group = group, b.fraction = s / total;
  b.bound = compute_by_group[b.group] > 0.5 * by_group[b.group] ? Bound::kCompute : Bound::kMemory;
  return b;
}

}  // namespace

std::vector<PhaseBottleneck> explain(const CpuCostModel& model,
                                     const std::vector<WorkloadRequest>& work) {
  std::optional<StepShape> prefill, decode;
  const ModelConfig& c = model.config();
  replay_schedule(
      model.policy(), c.max_position_embeddings, c.sliding_window, work, [&](const StepShape& s) {
        if (s.prefill_tokens > 0 && (!prefill || s.prefill_tokens > prefill->prefill_tokens))
          prefill = s;
        if (s.prefill_tokens == 0 && (!decode || s.decode_tokens > decode->decode_tokens))
          decode = s;
      });
  std::vector<PhaseBottleneck> out;
  if (prefill) out.push_back(bottleneck_of(model, "prefill", *prefill));
  if (decode) out.push_back(bottleneck_of(model, "decode", *decode));
  return out;
}

namespace {

// The workload the search simulates: all of it when small; otherwise an evenly strided sample
// of `cap` requests (same length distribution), whose times are scaled up by the sampling ratio.
std::vector<WorkloadRequest> sample_workload(const std::vector<WorkloadRequest>& w, size_t cap,
                                             double* scale) {
  *scale = 1;
  if (w.size() <= cap) return w;
  std::vector<WorkloadRequest> s;
  for (size_t i = 0; i < cap; ++i) s.push_back(w[i * w.size() / cap]);
  *scale = double(w.size()) / double(cap);
  return s;
}

struct SearchSpace {
  std::vector<int> batch, attn, expert, chunk;
};

std::vector<int> powers_of_two(int lo, int hi) {
  std::vector<int> v;
  for (int x = lo; x <= hi; x *= 2) v.push_back(x);
  return v;
}

}  // namespace

Plan plan_policy(const HardwareProfile& hw, const ModelConfig& c, const Policy& requested,
                 const std::vector<WorkloadRequest>& workload, const MemoryLimits& limits) {
  if (workload.empty()) fail("planner: the workload has no requests");
  if (requested.kv_block_size <= 0)
    fail("planner: policy field 'kv_block_size': expected > 0, got {}", requested.kv_block_size);
  int longest = 0;
  for (const WorkloadRequest& r : workload)
    longest =
        std::max(longest, std::min(r.prompt_tokens + r.new_tokens, c.max_position_embeddings));
  const int blocks_per_seq = (longest + requested.kv_block_size - 1) / requested.kv_block_size;
  const int requests = int(workload.size());

  // Resolve the non-searched fields once.
  Policy base = requested;
  if (base.threads <= 0) base.threads = omp_get_num_procs();

  // What the smallest policy needs: it must fit, or nothing does.
  Policy smallest = base;
  smallest.batch = base.batch > 0 ? base.batch : 1;
  smallest.attn_micro_batch = base.attn_micro_batch > 0 ? base.attn_micro_batch : 16;
  smallest.expert_batch = base.expert_batch > 0 ? base.expert_batch : 16;
  smallest.prefill_chunk = base.prefill_chunk > 0 ? base.prefill_chunk : 16;
  smallest.kv_blocks = base.kv_blocks > 0 ? base.kv_blocks : blocks_per_seq * smallest.batch;
  const HostMemoryUse least = host_memory_use(c, smallest);
  if (least.total() > limits.host_bytes)
    fail(
        "planner: needs at least {} host memory for weights ({}) + minimum KV ({}) + "
        "activations ({}); got {}. Give more with --host-mem, or a model with fewer layers",
        human_bytes(double(least.total())), human_bytes(double(least.weights)),
        human_bytes(double(least.kv_cache)), human_bytes(double(least.activations)),
        human_bytes(double(limits.host_bytes)));
  if (base.kv_blocks > 0 && base.kv_blocks < blocks_per_seq)
    fail(
        "planner: policy field 'kv_blocks': {} blocks of {} tokens cannot hold one sequence of {} "
        "tokens (needs {})",
        base.kv_blocks, base.kv_block_size, longest, blocks_per_seq);

  auto fixed_or = [](int requested_value, std::vector<int> values) {
    return requested_value > 0 ? std::vector<int>{requested_value} : values;
  };
  SearchSpace space;
  std::vector<int> batches = powers_of_two(1, std::min(requests, 1024));
  if (requests <= 1024 && batches.back() != requests) batches.push_back(requests);
  space.batch = fixed_or(base.batch, batches);
  space.attn = fixed_or(base.attn_micro_batch, powers_of_two(16, 2048));
  space.expert = fixed_or(base.expert_batch, powers_of_two(16, 4096));
  space.chunk = fixed_or(base.prefill_chunk, powers_of_two(16, 4096));

  double scale = 1;
  const size_t sample_cap = size_t(std::max(512, 2 * space.batch.back()));
  const std::vector<WorkloadRequest> sim = sample_workload(workload, sample_cap, &scale);

  std::map<std::tuple<int, int, int, int>, PlannedPolicy> evaluated;
  auto evaluate = [&](int B, int ba, int be, int chunk) -> const PlannedPolicy* {
    auto key = std::make_tuple(B, ba, be, chunk);
    if (auto it = evaluated.find(key); it != evaluated.end())
      return it->second.prediction.total_seconds > 0 ? &it->second : nullptr;
    PlannedPolicy& pp = evaluated[key];
    Policy p = base;
    p.batch = B, p.attn_micro_batch = ba, p.expert_batch = be, p.prefill_chunk = chunk;
    if (p.kv_blocks <= 0) p.kv_blocks = B * blocks_per_seq;
    p.batch = std::min(p.batch, p.kv_blocks / blocks_per_seq);
    pp.policy = p;
    pp.memory = host_memory_use(c, p);
    if (pp.memory.total() > limits.host_bytes) return nullptr;  // total_seconds stays 0
    pp.prediction = predict(hw, c, p, sim);
    pp.prediction.total_seconds *= scale;
    pp.prediction.prefill_seconds *= scale;
    pp.prediction.decode_seconds *= scale;
    pp.prediction.prefill_tokens = int64_t(double(pp.prediction.prefill_tokens) * scale);
    pp.prediction.decode_tokens = int64_t(double(pp.prediction.decode_tokens) * scale);
    pp.prediction.generated_tokens = int64_t(double(pp.prediction.generated_tokens) * scale);
    return &pp;
  };
  auto value = [](const PlannedPolicy* p) { return p ? p->prediction.total_tokens_per_s() : -1.0; };

  // Coordinate descent from the old defaults (or the nearest allowed values).
  auto nearest = [](const std::vector<int>& v, int want) {
    int best = v.front();
    for (int x : v)
      if (std::abs(x - want) < std::abs(best - want)) best = x;
    return best;
  };
  int cur[4] = {nearest(space.batch, 256), nearest(space.attn, 256), nearest(space.expert, 1024),
                nearest(space.chunk, 512)};
  const std::vector<int>* dims[4] = {&space.batch, &space.attn, &space.expert, &space.chunk};
  // The start may not fit memory: fall back to the smallest values, which do (checked above).
  if (!evaluate(cur[0], cur[1], cur[2], cur[3]))
    for (int d = 0; d < 4; ++d) cur[d] = dims[d]->front();
  for (int round = 0; round < 4; ++round) {
    bool changed = false;
    for (int d = 0; d < 4; ++d) {
      double best = value(evaluate(cur[0], cur[1], cur[2], cur[3]));
      for (int x : *dims[d]) {
        int trial[4] = {cur[0], cur[1], cur[2], cur[3]};
        trial[d] = x;
        const double v = value(evaluate(trial[0], trial[1], trial[2], trial[3]));
        if (v > best * (1 + 1e-9)) best = v, cur[d] = x, changed = true;
      }
    }
    if (!changed) break;
  }

  std::vector<const PlannedPolicy*> ranked;
  for (const auto& [key, pp] : evaluated)
    if (pp.prediction.total_seconds > 0) ranked.push_back(&pp);
  if (ranked.empty())
    fail("planner: no policy fits {} of host memory for this workload",
         human_bytes(double(limits.host_bytes)));
  // Best first. Policies within 0.1% of each other are the same to the model: of those tied
  // with the best, the one that needs the least memory is chosen.
  auto same = [&](const PlannedPolicy* x, const PlannedPolicy* y) {
    return std::abs(value(x) - value(y)) <= 1e-3 * std::max(value(x), value(y));
  };
  std::stable_sort(
      ranked.begin(), ranked.end(),
      [&](const PlannedPolicy* x, const PlannedPolicy* y) { return value(x) > value(y); });
  for (size_t i = 1; i < ranked.size() && same(ranked[i], ranked[0]); ++i)
    if (ranked[i]->memory.total() < ranked[0]->memory.total()) std::swap(ranked[i], ranked[0]);
  Plan plan;
  plan.evaluated = int(ranked.size());
  plan.chosen = *ranked.front();
  // Runners-up: the next best with a different prediction (equal ones differ only in fields
  // that change nothing here, such as b_e above the most tokens an expert gets).
  const PlannedPolicy* last = ranked.front();
  for (size_t i = 1; i < ranked.size() && plan.runners_up.size() < 4; ++i) {
    if (same(ranked[i], last)) continue;
    plan.runners_up.push_back(*ranked[i]);
    last = ranked[i];
  }
  plan.bottlenecks = explain(CpuCostModel(hw, c, plan.chosen.policy), sim);
  return plan;
}

}  // namespace sluice
