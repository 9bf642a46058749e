#include "runtime/planner/planner.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/units.h"
#include "model/expert_quant.h"
#include "runtime/disk/expert_page_pool.h"
#include "runtime/planner/gpu_kv_blocks.h"

namespace sluice {

// As the CPU engine holds them: matrices in bf16, or with FP8 weights 1 byte each and 4 per
// 128 × 128 block of scales (experts and dense MLPs packed when quantized); norms, q/k norms and
// biases in fp32.
size_t model_weight_bytes(const ModelConfig& c) {
  const size_t H = size_t(c.hidden_size), I = size_t(c.expert_intermediate_size);
  const size_t E = size_t(c.num_experts), V = size_t(c.vocab_size);
  const size_t qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim());
  size_t bytes = 2 * V * H * (c.tie_word_embeddings ? 1 : 2) + H * 4;
  for (int l = 0; l < c.num_layers; ++l) {
    const size_t attention = size_t(c.attention_weight_elements());
    bytes += (c.fp8_weights ? attention + attention / 4096 : 2 * attention) + 2 * H * 4;
    bytes += 4 * (size_t(c.q_norm_size()) + size_t(c.k_norm_size()) +
                  (c.qkv_bias ? qd + 2 * kvd : 0) + (c.o_bias ? H : 0));
    if (c.is_moe_layer(l))
      bytes += 2 * E * H + E * (2 * expert_matrix_bytes(c, int64_t(I), int64_t(H)) +
                                expert_matrix_bytes(c, int64_t(H), int64_t(I)));
    if (const int64_t D = c.dense_mlp_size(l); D > 0)
      bytes += 2 * expert_matrix_bytes(c, D, int64_t(H)) + expert_matrix_bytes(c, int64_t(H), D);
    if (c.is_moe_layer(l) && c.shared_expert_gate && c.dense_mlp_size(l) > 0) bytes += 2 * H;
    if (c.attention == AttentionKind::kLatent)  // q_a_layernorm and kv_a_layernorm
      bytes += 4 * size_t(c.mla.q_lora_rank + c.mla.kv_lora_rank);
    if (c.is_moe_layer(l) && c.router_selection_bias) bytes += 4 * E;
  }
  return bytes;
}

size_t routed_expert_bytes(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  size_t bytes = 0;
  for (int l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l))
      bytes +=
          size_t(c.num_experts) * (2 * expert_matrix_bytes(c, I, H) + expert_matrix_bytes(c, H, I));
  return bytes;
}

bool experts_stay_on_disk(const ModelConfig& c, size_t host_bytes) {
  return model_weight_bytes(c) > host_bytes && routed_expert_bytes(c) > 0;
}

// The engine's step buffers (BatchEngine::Impl::grow and expert_phase) at the largest step:
// a full prefill chunk plus one decode token for every other sequence.
HostMemoryUse host_memory_use(const ModelConfig& c, const Policy& p) {
  HostMemoryUse m;
  m.weights = model_weight_bytes(c);
  if (p.pool_experts > 0)
    m.weights += size_t(p.pool_experts) * expert_slot_bytes(c) - routed_expert_bytes(c);
  m.kv_cache = size_t(p.kv_blocks) * kv_bytes_per_token(c) * size_t(p.kv_block_size);
  const size_t T = size_t(p.prefill_chunk + p.batch), H = size_t(c.hidden_size);
  const size_t I = size_t(c.expert_intermediate_size), be = size_t(p.expert_batch);
  // q and the attention output; K and V, or with MLA the latent and RoPE key (and q-LoRA rows).
  const bool latent = c.attention == AttentionKind::kLatent;
  const size_t attention_rows =
      size_t(c.q_dim()) * 4 + size_t(c.attn_out_dim()) * 4 +
      (latent ? size_t(c.kv_cache_values_per_token() + c.mla.q_lora_rank) * 4
              : size_t(c.kv_dim()) * 4 * 2);
  const size_t per_token = H * 4 * 2 + attention_rows + size_t(c.num_experts) * 4 + H * 2 +
                           size_t(c.experts_per_token) * 8 + H * 2 /* bf16 GEMM input scratch */;
  size_t mlp = I;  // the expert phase's and the dense MLP's scratch are shared
  for (int l = 0; l < c.num_layers; ++l) mlp = std::max(mlp, size_t(c.dense_mlp_size(l)));
  m.activations = T * (per_token + 4 /* dense MLP scale */) + be * (H * 4 + mlp * 4 * 3 + H * 4) +
                  size_t(p.batch) * size_t(c.vocab_size) * 4;
  return m;
}

// With the GPU pipeline the host KV cache holds the CPU share's blocks only; the GPU share's
// live in the device pool (gpu_memory_use).
HostMemoryUse host_memory_use(const ModelConfig& c, const Policy& p, const OffloadPlan& o) {
  HostMemoryUse m = host_memory_use(c, p);
  if (o.gpu)
    m.kv_cache = size_t(host_kv_blocks(p.kv_blocks, o.cpu_attention_share)) *
                 kv_bytes_per_token(c) * size_t(p.kv_block_size);
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

Prediction predict(const HardwareProfile& hw, const ModelConfig& c, const Policy& policy,
                   const OffloadPlan& offload, const std::vector<WorkloadRequest>& workload) {
  if (!offload.gpu) return predict(hw, c, policy, workload);
  const OffloadCostModel model(hw, c, policy, offload);
  return predict_workload(
      policy, c, [&](const StepShape& s) { return model.step_seconds(s); }, workload);
}

std::string PhaseBottleneck::sentence() const {
  const std::string tail = fmt::format(": {:.0f}% of step time ({:.1f} ms per step of {} tokens)",
                                       100 * fraction, 1e3 * step_seconds, step.tokens());
  switch (resource) {
    case Resource::kHostToDevice:
      return fmt::format("{} is bound by PCIe host-to-device bandwidth while streaming {}{}", phase,
                         group, tail);
    case Resource::kDeviceToHost:
      return fmt::format("{} is bound by PCIe device-to-host bandwidth in {}{}", phase, group,
                         tail);
    case Resource::kGpu:
      return fmt::format("{} is bound by GPU {} in {}{}", phase,
                         bound == Bound::kCompute ? "compute" : "memory bandwidth", group, tail);
    case Resource::kDisk:
      return fmt::format("{} is bound by the disk's O_DIRECT read bandwidth in {}{}", phase, group,
                         tail);
    case Resource::kCpu:
      break;
  }
  const bool attention = group.find("attention (KV") != std::string::npos;
  const char* what = bound == Bound::kCompute ? "GEMM compute" : "DRAM bandwidth";
  const char* verb = bound == Bound::kCompute ? "in" : "while reading weights in";
  if (attention)
    what = bound == Bound::kCompute ? "attention compute" : "DRAM bandwidth",
    verb = bound == Bound::kCompute ? "in" : "while reading the KV cache in";
  if (bound == Bound::kLink) what = "link bandwidth";
  if (group.find("norms") != std::string::npos || group.find("SiLU") != std::string::npos ||
      group.find("gather") != std::string::npos)
    what = "memory bandwidth", verb = "in the elementwise passes:";
  return fmt::format(
      "{} is bound by {} {} {}: {:.0f}% of step time ({:.1f} ms per step of {} tokens)", phase,
      what, verb, group, 100 * fraction, 1e3 * step_seconds, step.tokens());
}

namespace {

PhaseBottleneck bottleneck_of(const TaskGraph& g, const std::string& phase, const StepShape& step,
                              bool pipeline) {
  const double path = g.critical_path_seconds();
  const double total = pipeline ? pipeline_step_seconds(g) : path;
  std::map<std::string, double> by_group, compute_by_group;
  std::map<std::string, Resource> resource_of;
  for (int v : g.critical_path()) {
    const Task& t = g.tasks()[size_t(v)];
    by_group[t.group] += t.seconds;
    resource_of[t.group] = t.resource;
    if (t.bound == Bound::kCompute) compute_by_group[t.group] += t.seconds;
  }
  PhaseBottleneck b;
  b.phase = phase;
  b.step = step;
  b.step_seconds = total;
  for (const auto& [group, s] : by_group)
    if (s > b.fraction * total) b.group = group, b.fraction = s / total;
  b.bound = compute_by_group[b.group] > 0.5 * by_group[b.group] ? Bound::kCompute : Bound::kMemory;
  if (total > path) {
    // A direction of the link is busier than the critical path: all the copies on it are the
    // bottleneck, not the path.
    double h2d = 0, d2h = 0;
    for (const Task& t : g.tasks()) {
      if (t.resource == Resource::kHostToDevice) h2d += t.seconds;
      if (t.resource == Resource::kDeviceToHost) d2h += t.seconds;
    }
    const Resource busiest = h2d >= d2h ? Resource::kHostToDevice : Resource::kDeviceToHost;
    by_group.clear(), b.fraction = 0, b.group.clear();
    for (const Task& t : g.tasks())
      if (t.resource == busiest) by_group[t.group] += t.seconds, resource_of[t.group] = t.resource;
    for (const auto& [group, s] : by_group)
      if (s > b.fraction * total) b.group = group, b.fraction = s / total;
  }
  b.resource = resource_of[b.group];
  if (b.resource == Resource::kHostToDevice || b.resource == Resource::kDeviceToHost)
    b.bound = Bound::kLink;
  b.use = resource_use(g);
  return b;
}

// The largest prefill step and the largest pure decode step of the workload's schedule.
void representative_steps(const Policy& policy, const ModelConfig& c,
                          const std::vector<WorkloadRequest>& work,
                          std::optional<StepShape>* prefill, std::optional<StepShape>* decode) {
  replay_schedule(
      policy, c.max_position_embeddings, c.sliding_window, work, [&](const StepShape& s) {
        if (s.prefill_tokens > 0 && (!*prefill || s.prefill_tokens > (*prefill)->prefill_tokens))
          *prefill = s;
        if (s.prefill_tokens == 0 && (!*decode || s.decode_tokens > (*decode)->decode_tokens))
          *decode = s;
      });
}

// The bottleneck of the largest prefill step and of the largest pure decode step under either
// cost model; `pipeline` says whether the graph is the GPU pipeline's.
template <typename Model>
std::vector<PhaseBottleneck> explain_steps(const Model& model,
                                           const std::vector<WorkloadRequest>& work,
                                           bool pipeline) {
  std::optional<StepShape> prefill, decode;
  representative_steps(model.policy(), model.config(), work, &prefill, &decode);
  std::vector<PhaseBottleneck> out;
  if (prefill)
    out.push_back(bottleneck_of(model.step_graph(*prefill), "prefill", *prefill, pipeline));
  if (decode) out.push_back(bottleneck_of(model.step_graph(*decode), "decode", *decode, pipeline));
  return out;
}

}  // namespace

std::vector<PhaseBottleneck> explain(const CpuCostModel& model,
                                     const std::vector<WorkloadRequest>& work) {
  return explain_steps(model, work, false);
}

std::vector<PhaseBottleneck> explain(const OffloadCostModel& model,
                                     const std::vector<WorkloadRequest>& work) {
  return explain_steps(model, work, true);
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

std::vector<int> powers_of_two(int lo, int hi) {
  std::vector<int> v;
  for (int x = lo; x <= hi; x *= 2) v.push_back(x);
  return v;
}

// The searched dimensions, as integers: policy fields first, then the offload plan (fixed to the
// CPU engine's values when there is no GPU limit).
enum Dim { kBatch, kAttn, kExpert, kChunk, kOmegaQuarters, kResident, kPage, kDepth, kCpuExpert };
constexpr int kDims = 9;
using Key = std::array<int, kDims>;

constexpr int kMinPrefetchDepth = 2;  // double buffering: one expert computes, the next arrives

// plan_policy's search, step by step: the inputs checked and the fields it does not vary
// resolved (constructor); the values each searched dimension takes (choose_dimensions); the
// smallest policy checked against the memory limits, since if it does not fit nothing does
// (check_smallest_fits); coordinate descent over the dimensions from the old defaults
// (descend); and the evaluated policies ranked (ranked_plan).
class PolicySearch {
 public:
  PolicySearch(const HardwareProfile& hw, const ModelConfig& c, const Policy& requested,
               const std::vector<WorkloadRequest>& workload, const MemoryLimits& limits,
               const OffloadConstraints& fixed)
      : hw_(hw), c_(c), limits_(limits), fixed_(fixed), gpu_(limits.gpu_bytes > 0) {
    check_inputs(requested, workload);
    for (const WorkloadRequest& r : workload)
      longest_ =
          std::max(longest_, std::min(r.prompt_tokens + r.new_tokens, c.max_position_embeddings));
    blocks_per_seq_ = (longest_ + requested.kv_block_size - 1) / requested.kv_block_size;
    resolve_base(requested);
    choose_dimensions(int(workload.size()));
    check_smallest_fits();
    const size_t sample_cap = size_t(std::max(512, 2 * dims_[kBatch].back()));
    sim_ = sample_workload(workload, sample_cap, &scale_);
  }

  Plan run() {
    descend(start());
    return ranked_plan();
  }

 private:
  void check_inputs(const Policy& requested, const std::vector<WorkloadRequest>& workload) const {
    if (workload.empty()) fail("planner: the workload has no requests");
    if (requested.kv_block_size <= 0)
      fail("planner: policy field 'kv_block_size': expected > 0, got {}", requested.kv_block_size);
    if (gpu_ && !hw_.gpu)
      fail(
          "planner: a GPU memory limit ({}) was given, but the hardware profile ({}) has no GPU "
          "section: no GPU was measured on this machine. Run `sluice profile --refresh` where "
          "the GPU is, and plan with that profile (--profile FILE)",
          human_bytes(double(limits_.gpu_bytes)), hw_.source);
  }

  // The fields the search does not vary: threads, and the disk tier's pool when it is fixed.
  void resolve_base(const Policy& requested) {
    base_ = requested;
    if (base_.threads <= 0) base_.threads = omp_get_num_procs();
    if (!limits_.experts_on_disk) base_.pool_experts = 0;
    pool_fixed_ = base_.pool_experts;
    for (int l = 0; l < c_.num_layers; ++l) all_experts_ += c_.is_moe_layer(l) ? c_.num_experts : 0;
    // Page sizes: one expert weight matrix (the largest of the three), or 16, 32 and 64 MiB.
    page_sizes_ = {expert_weight_bytes(c_) / 3, size_t(16) << 20, size_t(32) << 20,
                   size_t(64) << 20};
    if (base_.kv_blocks > 0 && base_.kv_blocks < blocks_per_seq_)
      fail(
          "planner: policy field 'kv_blocks': {} blocks of {} tokens cannot hold one sequence of "
          "{} tokens (needs {})",
          base_.kv_blocks, base_.kv_block_size, longest_, blocks_per_seq_);
  }

  // The disk tier's pool: what the rest of the policy (with the GPU pipeline, `o`) leaves of
  // host memory, at most every expert; at least kMinPoolExperts, or the policy does not fit.
  void fill_pool(Policy& p, const OffloadPlan& o) const {
    if (!limits_.experts_on_disk || pool_fixed_ > 0) return;
    p.pool_experts = kMinPoolExperts;
    const size_t least = host_memory_use(c_, p, o).total();
    if (least < limits_.host_bytes)
      p.pool_experts = int(std::min<int64_t>(
          all_experts_,
          kMinPoolExperts + int64_t((limits_.host_bytes - least) / expert_slot_bytes(c_))));
  }

  OffloadPlan offload_of(const Key& k) const {
    OffloadPlan o;
    if (!gpu_) return o;
    o.gpu = true;
    // A fixed share is planned as given (the executor runs it so), the searched ones in quarters.
    o.cpu_attention_share =
        fixed_.cpu_attention_share ? *fixed_.cpu_attention_share : k[kOmegaQuarters] / 4.0;
    o.resident_expert_layers = k[kResident];
    o.page_bytes = page_sizes_[size_t(k[kPage])];
    o.prefetch_depth = k[kDepth];
    o.cpu_expert_max_tokens = k[kCpuExpert];
    return o;
  }

  // The device's expert cache, as the offload executor sizes it: the pages asked for, or
  // default_cache_pages of the budget.
  int device_cache_pages(size_t used, const OffloadPlan& o) const {
    if (fixed_.cache_pages) return *fixed_.cache_pages;
    const int64_t per_expert = pages_per_expert(c_, o.page_bytes);
    return default_cache_pages(
        limits_.gpu_bytes, used, o.page_bytes,
        streamed_expert_layers(c_, o.resident_expert_layers) * per_expert * c_.num_experts,
        o.prefetch_depth * per_expert);
  }

  Policy policy_of(const Key& k) const {
    Policy p = base_;
    p.batch = k[kBatch], p.attn_micro_batch = k[kAttn], p.expert_batch = k[kExpert];
    p.prefill_chunk = k[kChunk];
    if (p.kv_blocks <= 0) p.kv_blocks = p.batch * blocks_per_seq_;
    p.batch = std::min(p.batch, p.kv_blocks / blocks_per_seq_);
    fill_pool(p, offload_of(k));
    return p;
  }

  // The values each dimension takes: the requested one where fixed, else the searched range.
  void choose_dimensions(int requests) {
    auto fixed_or = [](int requested_value, std::vector<int> values) {
      return requested_value > 0 ? std::vector<int>{requested_value} : values;
    };
    std::vector<int> batches = powers_of_two(1, std::min(requests, 1024));
    if (requests <= 1024 && batches.back() != requests) batches.push_back(requests);
    dims_[kBatch] = fixed_or(base_.batch, batches);
    dims_[kAttn] = fixed_or(base_.attn_micro_batch, powers_of_two(16, 2048));
    dims_[kExpert] = fixed_or(base_.expert_batch, powers_of_two(16, 4096));
    dims_[kChunk] = fixed_or(base_.prefill_chunk, powers_of_two(16, 4096));
    if (!gpu_) {
      dims_[kOmegaQuarters] = {4};
      dims_[kResident] = {-1};
      dims_[kPage] = {0};
      dims_[kDepth] = {0};
      dims_[kCpuExpert] = {0};
      return;
    }
    auto fixed_or_values = [](const std::optional<int>& f, std::vector<int> values) {
      return f ? std::vector<int>{*f} : values;
    };
    const std::optional<int> quarters =
        fixed_.cpu_attention_share
            ? std::optional<int>(int(std::lround(*fixed_.cpu_attention_share * 4)))
            : std::nullopt;
    if (c_.attention == AttentionKind::kLatent && quarters && *quarters != 4)
      fail(
          "planner: field 'cpu_attention_share': multi-head latent attention runs on the host "
          "only (the offload executor has no GPU share of it); expected 1, got {}",
          *fixed_.cpu_attention_share);
    // Multi-head latent attention: the CPU's share is all of it.
    dims_[kOmegaQuarters] = fixed_or_values(quarters, c_.attention == AttentionKind::kLatent
                                                          ? std::vector<int>{4}
                                                          : std::vector<int>{4, 3, 2, 1, 0});
    std::vector<int> resident = {0};
    for (int r = 1; r < c_.num_layers; r *= 2) resident.push_back(r);
    resident.push_back(c_.num_layers);
    dims_[kResident] = fixed_or_values(fixed_.resident_expert_layers, resident);
    dims_[kPage] = fixed_.expert_matrix_pages ? std::vector<int>{0} : std::vector<int>{0, 1, 2, 3};
    dims_[kDepth] = fixed_or_values(fixed_.prefetch_depth, {kMinPrefetchDepth, 3, 4});
    dims_[kCpuExpert] = fixed_or_values(fixed_.cpu_expert_max_tokens, {0, 4, 16});
  }

  // What the smallest policy needs must fit, or nothing does: the error names what it needs.
  void check_smallest_fits() const {
    Policy smallest = base_;
    smallest.batch = base_.batch > 0 ? base_.batch : 1;
    smallest.attn_micro_batch = base_.attn_micro_batch > 0 ? base_.attn_micro_batch : 16;
    smallest.expert_batch = base_.expert_batch > 0 ? base_.expert_batch : 16;
    smallest.prefill_chunk = base_.prefill_chunk > 0 ? base_.prefill_chunk : 16;
    smallest.kv_blocks = base_.kv_blocks > 0 ? base_.kv_blocks : blocks_per_seq_ * smallest.batch;
    if (limits_.experts_on_disk && pool_fixed_ == 0) smallest.pool_experts = kMinPoolExperts;
    // The least GPU memory: the largest CPU share of attention (ω = 1: no GPU KV), the fewest
    // resident experts and the shallowest prefetch allowed, with pages of one expert matrix.
    Key least_key = {0, 0, 0, 0, 4, 0, 0, kMinPrefetchDepth, 0};
    if (gpu_)
      for (int d : {kOmegaQuarters, kResident, kPage, kDepth, kCpuExpert})
        least_key[size_t(d)] =
            d == kOmegaQuarters
                ? *std::max_element(dims_[size_t(d)].begin(), dims_[size_t(d)].end())
                : *std::min_element(dims_[size_t(d)].begin(), dims_[size_t(d)].end());
    const HostMemoryUse least = host_memory_use(c_, smallest, offload_of(least_key));
    if (least.total() > limits_.host_bytes)
      fail(
          "planner: needs at least {} host memory for weights ({}{}) + minimum KV ({}) + "
          "activations ({}); got {}. Give more with --host-mem, or a model with fewer layers",
          human_bytes(double(least.total())), human_bytes(double(least.weights)),
          smallest.pool_experts > 0
              ? fmt::format(": all but the routed experts, which stay on disk, and a page pool of "
                            "{} experts",
                            smallest.pool_experts)
              : "",
          human_bytes(double(least.kv_cache)), human_bytes(double(least.activations)),
          human_bytes(double(limits_.host_bytes)));
    if (!gpu_) return;
    const GpuMemoryUse g = gpu_memory_use(c_, smallest, offload_of(least_key));
    if (g.total() > limits_.gpu_bytes)
      fail(
          "planner: needs at least {} GPU memory for resident attention weights ({}), router, "
          "norms and lm_head ({}), dense MLPs ({}) + {} experts' page slots ({}) + step buffers "
          "({}); got {}. Give more with --gpu-mem",
          human_bytes(double(g.total())), human_bytes(double(g.attention_weights)),
          human_bytes(double(g.router_norms_head)), human_bytes(double(g.dense_mlps)),
          least_key[kDepth], human_bytes(double(g.page_slots)), human_bytes(double(g.step_buffers)),
          human_bytes(double(limits_.gpu_bytes)));
  }

  // The policy of `key` predicted over the sampled workload (its times scaled to the whole), or
  // null when it does not fit the memory limits. Each key is evaluated once.
  const PlannedPolicy* evaluate(const Key& key) {
    if (auto it = evaluated_.find(key); it != evaluated_.end())
      return it->second.prediction.total_seconds > 0 ? &it->second : nullptr;
    PlannedPolicy& pp = evaluated_[key];
    pp.policy = policy_of(key);
    pp.offload = offload_of(key);
    pp.memory = host_memory_use(c_, pp.policy, pp.offload);
    if (pp.memory.total() > limits_.host_bytes) return nullptr;  // total_seconds stays 0
    if (gpu_) {
      pp.gpu_memory = gpu_memory_use(c_, pp.policy, pp.offload);
      if (pp.gpu_memory.total() > limits_.gpu_bytes) return nullptr;
      pp.offload.cache_pages = device_cache_pages(pp.gpu_memory.total(), pp.offload);
      if (pp.gpu_memory.total() + size_t(pp.offload.cache_pages) * pp.offload.page_bytes >
          limits_.gpu_bytes)
        return nullptr;
    }
    pp.prediction = predict(hw_, c_, pp.policy, pp.offload, sim_);
    pp.prediction.total_seconds *= scale_;
    pp.prediction.prefill_seconds *= scale_;
    pp.prediction.decode_seconds *= scale_;
    pp.prediction.prefill_tokens = int64_t(double(pp.prediction.prefill_tokens) * scale_);
    pp.prediction.decode_tokens = int64_t(double(pp.prediction.decode_tokens) * scale_);
    pp.prediction.generated_tokens = int64_t(double(pp.prediction.generated_tokens) * scale_);
    return &pp;
  }

  static double value(const PlannedPolicy* p) {
    return p ? p->prediction.total_tokens_per_s() : -1.0;
  }

  // The most resident layers that fit the GPU with the other dimensions as in `k`.
  int most_resident(Key k) const {
    for (int r = c_.num_layers; r > 0; --r) {
      k[kResident] = r;
      if (gpu_memory_use(c_, policy_of(k), offload_of(k)).total() <= limits_.gpu_bytes) return r;
    }
    return 0;
  }

  // The old defaults (or the nearest allowed values); the smallest values where those do not fit
  // memory (check_smallest_fits showed that they do).
  Key start() {
    auto nearest = [](const std::vector<int>& v, int want) {
      int best = v.front();
      for (int x : v)
        if (std::abs(x - want) < std::abs(best - want)) best = x;
      return best;
    };
    Key k;
    for (int d = 0; d < kDims; ++d) k[size_t(d)] = dims_[size_t(d)].front();
    k[kBatch] = nearest(dims_[kBatch], 256);
    k[kAttn] = nearest(dims_[kAttn], 256);
    k[kExpert] = nearest(dims_[kExpert], 1024);
    k[kChunk] = nearest(dims_[kChunk], 512);
    if (!evaluate(k))
      for (int d = 0; d < kDims; ++d) k[size_t(d)] = dims_[size_t(d)].front();
    return k;
  }

  // Coordinate descent: each dimension in turn moved to its best value, for up to 4 rounds.
  void descend(Key cur) {
    for (int round = 0; round < 4; ++round) {
      bool changed = false;
      for (int d = 0; d < kDims; ++d) {
        std::vector<int> values = dims_[size_t(d)];
        if (gpu_ && d == kResident && !fixed_.resident_expert_layers)
          values.push_back(most_resident(cur));
        double best = value(evaluate(cur));
        for (int x : values) {
          Key trial = cur;
          trial[size_t(d)] = x;
          const double v = value(evaluate(trial));
          if (v > best * (1 + 1e-9)) best = v, cur[size_t(d)] = x, changed = true;
        }
      }
      if (!changed) break;
    }
  }

  // The best evaluated policy, its runners-up and its bottlenecks.
  Plan ranked_plan() const {
    std::vector<const PlannedPolicy*> ranked;
    for (const auto& [key, pp] : evaluated_)
      if (pp.prediction.total_seconds > 0) ranked.push_back(&pp);
    if (ranked.empty())
      fail("planner: no policy fits {} of host memory{} for this workload",
           human_bytes(double(limits_.host_bytes)),
           gpu_ ? " and " + human_bytes(double(limits_.gpu_bytes)) + " of GPU memory" : "");
    // Best first. Policies within 0.1% of each other are the same to the model: of those tied
    // with the best, the one that needs the least memory is chosen.
    auto same = [](const PlannedPolicy* x, const PlannedPolicy* y) {
      return std::abs(value(x) - value(y)) <= 1e-3 * std::max(value(x), value(y));
    };
    std::stable_sort(
        ranked.begin(), ranked.end(),
        [](const PlannedPolicy* x, const PlannedPolicy* y) { return value(x) > value(y); });
    auto memory = [](const PlannedPolicy* p) { return p->memory.total() + p->gpu_memory.total(); };
    for (size_t i = 1; i < ranked.size() && same(ranked[i], ranked[0]); ++i)
      if (memory(ranked[i]) < memory(ranked[0])) std::swap(ranked[i], ranked[0]);
    Plan plan;
    plan.evaluated = int(ranked.size());
    plan.chosen = *ranked.front();
    plan.offload = plan.chosen.offload;
    // Runners-up: the next best with a different prediction (equal ones differ only in fields
    // that change nothing here, such as b_e above the most tokens an expert gets).
    const PlannedPolicy* last = ranked.front();
    for (size_t i = 1; i < ranked.size() && plan.runners_up.size() < 4; ++i) {
      if (same(ranked[i], last)) continue;
      plan.runners_up.push_back(*ranked[i]);
      last = ranked[i];
    }
    plan.bottlenecks =
        gpu_ ? explain(OffloadCostModel(hw_, c_, plan.chosen.policy, plan.chosen.offload), sim_)
             : explain(CpuCostModel(hw_, c_, plan.chosen.policy), sim_);
    return plan;
  }

  const HardwareProfile& hw_;
  const ModelConfig& c_;
  const MemoryLimits& limits_;
  const OffloadConstraints& fixed_;
  const bool gpu_;
  int longest_ = 0, blocks_per_seq_ = 0;
  Policy base_;
  int pool_fixed_ = 0;
  int64_t all_experts_ = 0;
  std::vector<size_t> page_sizes_;
  std::array<std::vector<int>, kDims> dims_;
  double scale_ = 1;
  std::vector<WorkloadRequest> sim_;
  std::map<Key, PlannedPolicy> evaluated_;
};

}  // namespace

Plan plan_policy(const HardwareProfile& hw, const ModelConfig& c, const Policy& requested,
                 const std::vector<WorkloadRequest>& workload, const MemoryLimits& limits,
                 const OffloadConstraints& fixed) {
  return PolicySearch(hw, c, requested, workload, limits, fixed).run();
}

}  // namespace sluice
