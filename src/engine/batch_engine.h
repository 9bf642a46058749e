// The throughput engine: module-based batching over a paged host KV cache.
//
// Every step runs all scheduled tokens through the model layer by layer. Within a layer the
// attention phase goes micro-batch by micro-batch (norm, QKV (+ biases), q/k norms, clipping,
// RoPE, KV write, attention, O-projection, router), appending each token to the lists of its top-k
// experts; the expert phase then runs each expert once over all its tokens of the whole step
// (gather, gate/up GEMM, SiLU·mul, down GEMM, weighted scatter-add), at most b_e tokens per
// GEMM, and the dense MLP (a shared expert, or a dense layer's MLP) once over every token. So a
// decode step over B sequences reads each expert's weights once and uses them for ~B·k/E
// tokens. What a layer has (biases, norms, experts, dense MLP) is read from the model's weights:
// the engine never asks which family it runs.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine_device.h"
#include "model/weights.h"
#include "runtime/disk/expert_page_pool.h"
#include "runtime/policy.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"

namespace sluice {

// Where the time of a run went, and what was moved and computed.
struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // step time split by each step's token mix
  double attention_seconds = 0, expert_seconds = 0, dense_seconds = 0;
  double sampling_seconds = 0, scheduling_seconds = 0;
  double expert_gemm_seconds = 0;  // inside expert_seconds: the GEMMs alone
  double weight_bytes = 0;         // weight bytes the GEMMs read
  double kv_bytes = 0;             // KV bytes attention read
  double flops = 0;                // all GEMM and attention arithmetic
  double expert_flops = 0;
  int64_t expert_gemm_calls = 0, expert_tokens = 0;
  int64_t concurrent_expert_calls = 0;  // inside expert_gemm_calls: experts run one per thread
  size_t kv_cache_bytes = 0;  // the host KV cache (the device KV pool is in device memory)
  // What the host KV cache's writes stored: bf16 bytes, over (token, layer) pairs. Their ratio
  // is the cache's bytes per token and layer (MLA: the latent and the RoPE key).
  int64_t kv_stored_bytes = 0, kv_stored_token_layers = 0;
  // Fraction of KV blocks in use at most, over the host cache and the device KV pool together.
  double peak_kv_usage = 0;
  // The offload executor only (zero on the CPU engine).
  int64_t device_pages_copied = 0;  // expert weight pages copied host→device
  // Expert weight pages the device's slots kept from an earlier step (the device half of the
  // expert cache), not copied again, and their bytes.
  int64_t device_pages_reused = 0;
  double device_bytes_reused = 0;
  double device_bytes_to_device = 0;  // weight pages and activations, host→device
  double device_bytes_to_host = 0;    // activations, device→host
  int64_t device_gpu_experts = 0, device_cpu_experts = 0;  // expert runs by place
  // Token rows whose attention ran on the device (the GPU share), summed over layers.
  int64_t device_gpu_attention_rows = 0;
  // Sequences whose turn for the GPU share found the device KV pool without room for them: the
  // Scheduler placed them in the host cache (the CPU share) instead.
  int64_t device_gpu_share_full = 0;
  size_t device_peak_bytes = 0;           // most device memory held at once
  double device_weight_bytes = 0;         // inside device_bytes_to_device: the expert pages
  size_t device_pinned_weight_bytes = 0;  // streamed weights page-locked in place (0: none)
  // Seconds each device queue spent copying or computing (measured on the device).
  double device_weights_busy_seconds = 0, device_transfer_busy_seconds = 0;
  double device_compute_busy_seconds = 0;
  // Steps without prompt tokens (pure decode), where the decode rate and its bounds are read.
  int64_t decode_only_steps = 0, decode_only_tokens = 0;
  double decode_only_seconds = 0, decode_only_device_weight_bytes = 0;
  double decode_only_flops = 0, decode_only_bytes = 0;  // arithmetic, and weight + KV bytes read
  double decode_only_expert_flops = 0;                  // of decode_only_flops
  // The time of the other steps: those with prompt tokens (and the decode tokens riding along).
  double prompt_step_seconds() const {
    return prefill_seconds + decode_seconds - decode_only_seconds;
  }
  // The disk tier (the routed experts read from their files into the host page pool): the pool's
  // books, and how it reads (empty without the disk tier).
  ExpertPoolStats disk;
  std::string disk_reads;
  double decode_only_disk_bytes = 0;  // read from disk in the steps with no prompt tokens
};

class BatchEngine {
 public:
  // The CPU engine.
  BatchEngine(const Model& model, const Policy& policy);
  // Steps through the offload executor on `device` (owned by the caller, alive as long as the
  // engine); a null device.device means the CPU engine.
  BatchEngine(const Model& model, const Policy& policy, const EngineDevice& device);
  // On the device the command line chose (opened and owned by the engine).
  BatchEngine(const Model& model, const Policy& policy, const DeviceOptions& device);
  ~BatchEngine();

  // Runs every request to completion; `on_finished` receives each completion as soon as its
  // sequence retires (so results can be written while others still run). A request that can
  // never run (its prompt fills the context, or its sequence needs more KV blocks than a KV pool
  // has) fails alone: its Completion, FinishReason::kError with the reason, comes first.
  void run(std::vector<Request> requests, const std::function<void(Completion&&)>& on_finished);

  // For callers that drive the steps themselves (engine/online_session.h): a scheduler over
  // the engine's KV cache (one at a time), and one step of it, which must have work; returns
  // the sequences that finished in it.
  std::unique_ptr<Scheduler> make_scheduler();
  std::vector<Completion> step(Scheduler& sched);

  // Called with the logits row of every sampled position (tests and debugging).
  using LogitsObserver =
      std::function<void(int64_t request_id, int position, std::span<const float>)>;
  void set_logits_observer(LogitsObserver observer);

  // Called with the experts every token was routed to in every MoE layer, in rank order (tests
  // replay them through the reference forward). The CPU engine's: the offload executor routes on
  // its device, and an engine with one refuses the observer.
  using RoutingObserver = std::function<void(int64_t request_id, int position, int layer,
                                             std::span<const int> experts)>;
  void set_routing_observer(RoutingObserver observer);

  // Called after every step, with the statistics so far and the KV-cache use (progress displays).
  struct Progress {
    int64_t finished = 0, active = 0, waiting = 0;
    double kv_usage = 0;  // blocks in use over all blocks, the device KV pool's included
  };
  using StepObserver = std::function<void(const EngineStats&, const Progress&)>;
  void set_step_observer(StepObserver observer);

  const Policy& policy() const;
  const EngineStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
