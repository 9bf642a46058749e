// The cost model of the GPU offload pipeline (runtime/offload/step_pipeline.h): a step as a DAG
// over four resources that overlap (GPU compute, CPU compute, the PCIe host-to-device copy
// engine for weights, and activation copies in both directions), its time the critical path.
//
// Per layer, for micro-batch i of n tokens (ω = OffloadPlan::cpu_attention_share):
//   GPU  attention_in(i): norm, QKV GEMMs (measured GPU GEMM curve), RoPE + KV write, and
//        attention over the GPU's (1-ω) share of the KV cache (GPU memory bandwidth bound)
//   D2H  the CPU share's q/k/v: ω·n·(q_dim + 2·kv_dim) bf16 values
//   CPU  attention over the host KV cache for the ω share (CpuCostModel::attention_task)
//   H2D  its output: ω·n·q_dim bf16 values
//   GPU  attention_out(i): O-projection, FFN norm, router GEMM, top-k
//   D2H  routing of micro-batch i: n·k (expert id, weight) pairs
// The GPU stream runs attention_in(i+1) before attention_out(i), so the CPU attention of
// micro-batch i overlaps the GPU work of micro-batch i+1. Then the expert phase: the host knows
// every expert's token count once the last routing arrived; an expert with at most
// cpu_expert_max_tokens tokens runs on the CPU (CpuCostModel's expert tasks), the others run on
// the GPU as one GEMM per weight over all their tokens, after their weight pages arrived.
//
// Expert weights of non-resident layers stream host→device on one copy engine in the order the
// experts run, across layers, so the next layer's experts are prefetched while this layer
// computes. A copy may start only when a slot is free: the pool holds prefetch_depth experts'
// pages, so the copy of the j-th streamed expert waits for the GPU task of the (j - depth)-th.
// With the experts on disk (Policy::pool_experts > 0), a fifth resource: the disk reads a
// streamed layer's experts into the host page pool (CpuCostModel::disk_read_task, the expected
// misses at the profile's O_DIRECT bandwidth), one layer after another on the pool's thread, and
// the layer's first expert copy and GPU and CPU experts wait for them. Experts the device's
// cache keeps (OffloadPlan::cache_pages, device_cache_hit) are neither copied nor read.
//
// Routing is an expectation, as in the CPU model: an expert gets Binomial(T, k/E) tokens, so its
// copy moves P(it runs on the GPU) · its bytes (an expert with no token, or one the CPU takes, is
// never copied), and its GPU time is Σ_m P(m)·cost(m) over the m it runs on the GPU.
//
// Assumed, not measured (the constants below say where each comes from): the launch cost of a
// copy and of an elementwise kernel, GPU attention's FLOP rate, and the device memory bandwidth
// when the profile predates its measurement. The weight copy engine and the activation transfer
// queue share the link, which the graph's edges do not say: the step time is the larger of the
// critical path and, for each direction of the link, the sum of its copies' times. Not modelled:
// copies that start before the step does (the first layer's pages are not prefetched during
// the previous step); the embedding lookup runs on the host and its rows are copied over.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/planner/cost_model.h"
#include "runtime/planner/gpu_kv_blocks.h"
#include "runtime/planner/hardware_profile.h"
#include "runtime/planner/layer_resident.h"
#include "runtime/planner/task_graph.h"
#include "runtime/policy.h"

namespace sluice {

struct OffloadPlan {
  bool gpu = false;                  // false: the CPU engine; the other fields are unused
  double cpu_attention_share = 1.0;  // ω: the fraction of sequences whose attention the CPU runs
  int resident_expert_layers = -1;  // layers whose experts stay on the GPU (evenly spaced); -1: all
  size_t page_bytes = 0;            // an expert's weights are cut into pages of this size
  int prefetch_depth = 0;           // experts whose pages the slot pool holds at once
  int cpu_expert_max_tokens = 0;    // experts with 1..this many tokens run on the CPU; 0: none
  // Device page slots beyond the prefetch window that keep streamed pages from step to step (the
  // device half of the expert cache; the executor's OffloadSettings::cache_pages). 0: none.
  int cache_pages = 0;
};

// "omega=0.50 resident=5 page=112.00MiB depth=3 cpu_experts<=16"
std::string describe(const OffloadPlan& o);

// Assumptions of the model, each a constant with its source.
// Device memory bandwidth when the profile has none: the HBM3 spec of an H100 SXM is 3.35 TB/s
// (H200: 4.8 TB/s); kernels reach a fraction of it, so 2 TB/s. A guess, not a measurement.
inline constexpr double kAssumedGpuMemoryBytesPerS = 2.0e12;
// Host-side cost of one cudaMemcpyAsync or kernel launch: a few microseconds is the usual CUDA
// figure; 5 µs is an assumption, not measured here. GEMM curves already include it (each point
// times one call).
inline constexpr double kLaunchSeconds = 5e-6;
// GPU paged attention (kernels/cuda/attention.cu, not a tuned tensor-core kernel) at a quarter of
// the measured GEMM peak when compute bound: an assumption, not measured.
inline constexpr double kGpuAttentionPeakFraction = 0.25;

// Gate, up and down of one expert as the executor holds and streams them: bf16, or packed
// (--expert-dtype int8/int4), three pages of the largest matrix.
size_t expert_weight_bytes(const ModelConfig& c);
int pages_per_expert(const ModelConfig& c, size_t page_bytes);

// MoE layers whose experts stream (those not resident on the device).
int streamed_expert_layers(const ModelConfig& c, int resident_expert_layers);
// The device's expert cache when not asked for a size: what the budget `free` leaves beyond
// `used` and a margin of max(256 MiB, 10%) (for what the device math allocates later, and other
// processes on the GPU), in pages, at most the `streamed` pages beyond the copy `window`.
int default_cache_pages(size_t free, size_t used, size_t page_bytes, int64_t streamed,
                        int64_t window);

struct GpuMemoryUse {
  size_t attention_weights = 0;  // Q, K, V, O of every layer (bf16)
  size_t router_norms_head = 0;  // routers, norms, q/k norms, biases, final norm, lm_head
  size_t dense_mlps = 0;         // shared experts and dense layers' MLPs, with their gates
  size_t resident_experts = 0;   // experts of the resident layers
  size_t kv_cache = 0;           // the GPU's (1-ω) share of the KV cache
  size_t page_slots = 0;         // prefetch_depth experts' pages
  size_t step_buffers = 0;       // activations of the largest step, cuBLASLt workspace
  size_t total() const {
    return attention_weights + router_norms_head + dense_mlps + resident_experts + kv_cache +
           page_slots + step_buffers;
  }
};
GpuMemoryUse gpu_memory_use(const ModelConfig& c, const Policy& p, const OffloadPlan& o);

// The step time of a pipeline graph: its critical path, but at least the busy time of each
// direction of the PCIe link (its copies share the link whichever queue they are on).
double pipeline_step_seconds(const TaskGraph& g);

// Time of each resource and the link traffic in one step, from its graph.
struct ResourceUse {
  double step_seconds = 0;
  double gpu_busy = 0, cpu_busy = 0, h2d_busy = 0, d2h_busy = 0;  // fractions of step_seconds
  double h2d_bytes = 0, d2h_bytes = 0;
};
ResourceUse resource_use(const TaskGraph& g);

class OffloadCostModel {
 public:
  OffloadCostModel(const HardwareProfile& profile, const ModelConfig& config, const Policy& policy,
                   const OffloadPlan& plan);

  // Every task of the step (all layers) with names and groups, for reports and tests.
  TaskGraph step_graph(const StepShape& step) const;
  // pipeline_step_seconds of that graph (computed without building it).
  double step_seconds(const StepShape& step) const;

  const ModelConfig& config() const { return cpu_.config(); }
  const Policy& policy() const { return cpu_.policy(); }
  const OffloadPlan& plan() const { return o_; }
  const HardwareProfile& profile() const { return cpu_.profile(); }
  const GpuProfile& gpu() const { return *cpu_.profile().gpu; }
  // The host's side of the step: CPU attention and experts, elementwise work.
  const CpuCostModel& cpu() const { return cpu_; }

  // Pieces, public for tests.
  double gpu_gemm_seconds(double m, int64_t n, int64_t k) const;
  // The same on one of the checkpoint's weight matrices: with FP8 weights CudaMath::gemm_fp8
  // first dequantises W into a bf16 tile (1 byte read and 2 written a weight), then runs it.
  double gpu_weight_gemm_seconds(double m, int64_t n, int64_t k) const;
  double gpu_memory_bytes_per_s() const;
  double h2d_seconds(double bytes, double copies) const;
  // Expected GPU time of one expert over a step of T tokens (outcomes with more than
  // cpu_expert_max_tokens tokens), and the probability that it runs on the GPU at all.
  double gpu_expert_seconds(int step_tokens) const;
  double gpu_expert_probability(int step_tokens) const;
  // The share of a streamed layer's experts the device's cache keeps: it holds a fixed part of
  // the streamed experts from step to step (its slot choice keeps a part of the cyclic scan), so
  // under independent routing an expert chosen is kept with the probability of that part.
  double device_cache_hit() const;

 private:
  TaskGraph build(const StepShape& step, bool named) const;

  CpuCostModel cpu_;
  OffloadPlan o_;
};

}  // namespace sluice
