// The hierarchical roofline cost model of the CPU batch engine (engine/batch_engine.cpp).
//
// A step is described by its attention micro-batches (tokens, and the KV positions their queries
// read) and the rows that sample. Each task of the step gets its bytes and FLOPs from the model
// shape, and its time from the hardware profile:
//   GEMMs        the measured time-versus-m curve of the nearest weight shape, interpolated
//                (it already holds the loss of small-m GEMMs below both ceilings), never below
//                the roofline max(weight bytes / DRAM bandwidth, FLOPs / GEMM peak);
//   attention    max(KV bytes / measured attention bandwidth, FLOPs / measured attention rate);
//   elementwise  bytes / measured elementwise bandwidth (norms, RoPE, SiLU·mul, gather, scatter).
// Every task also pays the measured overhead of one kernel call (HardwareProfile::
// call_overhead_seconds: the OpenMP pool and the dispatch), which is what the steps of a small
// model, or the small-m GEMMs of a large one at low batch, are mostly made of.
// A task is called compute bound when FLOPs / compute ceiling exceeds bytes / bandwidth, else
// memory bound; for GEMMs the ceiling is the machine's (HardwareProfile::compute_ceiling_flops:
// the instruction peak of the ISA level), not sluice's own GEMM peak.
//
// Expert work is an expectation over routing: with uniform routing, the tokens an expert gets in
// a step of T tokens follow Binomial(T, k/E), so an expert costs Σ_m P(m)·cost(m), where cost(m)
// splits m into GEMMs of at most b_e rows and cost(0) = 0 (the engine skips idle experts). This
// matters at small T: one decode token reads 2 experts' weights, not 8 quarter-experts.
//
// The engine runs every task in order on one OpenMP pool, so its step graph is a chain and the
// critical path is the sum; the graph type (task_graph.h) also carries the parallel resources
// of the GPU pipeline.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "runtime/planner/hardware_profile.h"
#include "runtime/planner/task_graph.h"
#include "runtime/policy.h"

namespace sluice {

struct MicroBatchShape {
  int tokens = 0;
  double kv_positions = 0;  // Σ over its sequences of the KV positions attention reads
  double qk_pairs = 0;      // Σ over its query rows of the KV positions each attends to
};

struct StepShape {
  std::vector<MicroBatchShape> micro_batches;
  int sampled = 0;  // rows that go through the final norm, lm_head and sampling
  int prefill_tokens = 0, decode_tokens = 0;  // how the engine splits the step's time
  int tokens() const;
};

class CpuCostModel {
 public:
  CpuCostModel(const HardwareProfile& profile, const ModelConfig& config, const Policy& policy);

  // Every task of the step (all layers), as the engine's chain.
  TaskGraph step_graph(const StepShape& step) const;
  // The same critical path, with the per-shape pieces memoised (the simulator calls this for
  // every step of a workload).
  double step_seconds(const StepShape& step) const;

  // Pieces, public for tests and reports.
  Task gemm_task(const std::string& name, const std::string& group, double m, int64_t n, int64_t k,
                 bool exact_f32 = false) const;
  // A GEMM of an expert or a dense MLP (shared experts): gemm_task's, or with int8 / int4 experts
  // the int8 GEMM's: their weight bytes, and the bf16 curve's time divided by the profile's
  // measured speedup of the int8 (int4) GEMM over the bf16 one at m (QuantGemmSpeedups::at;
  // from older profiles the ratio of the instruction peaks, which held on an AVX512-VNNI Zen 5
  // but overstated int8 by 1.3x at the avx2 level, where each product needs a vpsignb more).
  Task mlp_gemm_task(const std::string& name, const std::string& group, double m, int64_t n,
                     int64_t k) const;
  Task elementwise_task(const std::string& name, const std::string& group, double bytes) const;
  Task attention_task(const std::string& name, const MicroBatchShape& mb) const;
  // Expected tasks of one expert over a step of T tokens (gather, gate, up, SiLU·mul, down,
  // scatter-add), each with expected bytes, FLOPs and seconds. Only the outcomes where the expert
  // gets between `min_tokens` and `max_tokens` tokens count (the GPU pipeline runs experts with
  // few tokens on the CPU); an expert with no token costs nothing.
  std::vector<Task> expert_tasks(int expert, int step_tokens, int min_tokens = 1,
                                 int max_tokens = std::numeric_limits<int>::max()) const;
  // P(an expert gets m of T tokens) under uniform top-k routing.
  std::vector<std::pair<int, double>> tokens_per_expert_distribution(int step_tokens) const;
  // With the experts on disk (policy pool_experts > 0): the expected reads of one MoE layer's
  // experts over a step of T tokens, the experts it uses, E·(1 - (1 - k/E)^T), less those the pool
  // keeps from step to step (its slots beyond the two layers it streams through, spread over all
  // experts), at the profile's O_DIRECT bandwidth. Empty without the disk tier or a measured disk.
  // `kept_elsewhere`: the share of the experts an offload device keeps (never asked of the pool,
  // whose slots then keep others).
  std::optional<Task> disk_read_task(int step_tokens, double kept_elsewhere = 0) const;

  const ModelConfig& config() const { return c_; }
  const Policy& policy() const { return p_; }
  const HardwareProfile& profile() const { return hw_; }

 private:
  void add_micro_batch(TaskGraph& g, int layer, int index, const MicroBatchShape& mb) const;
  // Its attention with MLA, and its FFN norm, router and top-k (any attention).
  void add_latent_attention(TaskGraph& g, const std::string& prefix,
                            const MicroBatchShape& mb) const;
  void add_ffn_routing(TaskGraph& g, int layer, const std::string& prefix, double n) const;
  // The dense MLP of layer `layer` (a shared expert, or a dense layer's MLP) over the step's T
  // rows, b_e rows per GEMM (empty when the layer has none).
  std::vector<Task> dense_mlp_tasks(int layer, int step_tokens) const;
  double layer_seconds(int layer, const StepShape& step) const;
  double micro_batch_dense_seconds(int layer, int tokens) const;
  double expert_phase_seconds(int step_tokens) const;
  double dense_mlp_seconds(int layer, int step_tokens) const;
  double head_seconds(int tokens, int sampled) const;
  // Layers that cost the same: MoE or dense, and the dense MLP's size.
  int64_t layer_kind(int layer) const {
    return int64_t(c_.dense_mlp_size(layer)) * 2 + (c_.is_moe_layer(layer) ? 1 : 0);
  }

  HardwareProfile hw_;
  ModelConfig c_;
  Policy p_;
  // Keyed by (layer kind, tokens).
  mutable std::map<std::pair<int64_t, int>, double> dense_memo_, mlp_memo_;
  mutable std::unordered_map<int, double> expert_memo_;
};

}  // namespace sluice
