// The offload executor: an engine step run through the CGOPipe schedule of
// runtime/offload/step_pipeline.h on a Device, with the model's math (DeviceMath) on the device.
//
// Device memory, taken from the device's budget once, at construction:
//   resident   every layer's norms (with q/k norms), wq/wk/wv/wo and router, and the RoPE
//              table — small next to the experts (Mixtral-8x7B: 1.6 GB of 93 GB);
//   resident experts
//              every expert of `resident_expert_layers` layers, evenly spaced (layer_resident,
//              as the planner places them), so the copy engine streams the next layers' pages
//              while the device computes a resident one; copied once, never paged;
//   lm_head    the final norm and the bf16 lm_head, when LmHeadPlace allows and the budget has
//              room (kAuto): the sampled rows' logits are computed on the device and come back
//              to pinned host memory, so the host's lm_head GEMM leaves each step's critical path;
//   page slots the other layers' experts stream through PageSlots, one page per expert matrix
//              (gate, up and down are one page each, I·H bf16), so an expert is 3 pages and the
//              fewest slots a step can run with is 3 (none when every layer is resident);
//   buffers    the activations of the largest step (B decode tokens + a prefill chunk).
//   KV pool  the GPU share of attention's KV blocks, ceil((1-ω)·kv_blocks) in the host cache's
//            layout (none when ω = 1), the host cache holding the other kv_blocks
//            (host_kv_blocks); their block tables and the split's row indices are among the
//            buffers.
// Attention is split by sequence (`cpu_attention_share` ω), and the Scheduler makes the split:
// it keeps two KV pools, the host's PagedKvCache and the books of the device KV pool (a
// PagedKvCache without storage, device_kv_config, owned by the engine), and places each sequence
// in one of them when it admits it, for its whole life (see runtime/scheduler.h: the host pool
// while it holds fewer than round(ω·n) of the n live sequences, so each step's split stays near
// ω; the other pool when the first lacks room). A sequence in the device pool's books is in the
// GPU share, and its block table there indexes the executor's KV pool memory; the pool never
// overflows, since the Scheduler admits a sequence only with room for all it will hold. The host
// cache holds the CPU share's sequences only, so both pools together bound the batch
// (MoE-Gen's full KV offload is ω = 1, no device pool). In attention_in the device writes the GPU
// share's K/V into its KV pool and runs their attention there; only the CPU share's q/k/v go to
// the host, where the CPU writes the engine's PagedKvCache and runs paged attention, and only
// their outputs come back.
// Experts of streamed layers with at most `cpu_expert_max_tokens` tokens whose pages are not yet
// copied run on the host CPU on host weights, as step_pipeline decides; a resident layer's
// experts always run on the device.
// The embedding lookup and sampling stay on the host (the engine's own code), and so do the
// final norm and the lm_head when they are not on the device: then only the sampled rows'
// hidden states come back.
#pragma once

#include <memory>
#include <span>

#include "engine/batch_engine.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"
#include "runtime/offload/device.h"
#include "runtime/offload/device_math.h"
#include "runtime/policy.h"
#include "runtime/scheduler.h"

namespace sluice {

// Device memory of the executor, in bytes, for a model, a policy and a page size.
// The lm_head counts when the settings do not put it on the host (kAuto counts it: the executor
// then moves it to the host only when the budget has no room for it).
struct OffloadFootprint {
  size_t resident = 0;          // norms, attention and router weights, RoPE table
  size_t resident_experts = 0;  // every expert of the resident layers
  int resident_layers = 0;
  size_t lm_head = 0;     // lm_head and final norm weights (0: on the host)
  size_t buffers = 0;     // step activations (with the sampled rows' logits when lm_head > 0)
  size_t kv_pool = 0;     // the GPU share's KV blocks (0 when ω = 1)
  size_t page_bytes = 0;  // one slot
  int min_slots = 3;      // one expert's gate, up and down pages; 0 when every layer is resident
  size_t fixed() const { return resident + resident_experts + lm_head + buffers + kv_pool; }
  size_t with_slots(int slots) const { return fixed() + page_bytes * size_t(slots); }
  size_t minimum() const { return with_slots(min_slots); }
};
OffloadFootprint offload_footprint(const ModelConfig& c, const Policy& p, const OffloadSettings& s);

// A KV pool of `blocks` blocks of the policy's block size for the model's layers and KV heads.
KvCacheConfig kv_pool_config(const ModelConfig& c, const Policy& p, int64_t blocks,
                             bool with_storage);
// The books of the device KV pool (block tables, no storage: the K/V are on the device), in the
// host cache's block size; total_blocks is 0 when attention has no GPU share (ω = 1). The engine
// keeps a PagedKvCache of it for the Scheduler and hands it to the executor.
KvCacheConfig device_kv_config(const ModelConfig& c, const Policy& p, const OffloadSettings& s);

// One step's inputs, as the engine laid them out on the host.
struct OffloadStepInput {
  const StepPlan* plan = nullptr;
  std::span<const int> item_row;      // plan item i covers rows [item_row[i], item_row[i + 1])
  std::span<const int> positions;     // [T]
  const float* embeddings = nullptr;  // [T, H] host, the layers' input
  std::span<const int> sample_rows;   // rows whose final hidden state is wanted
  // Every sampled row picks its greedy token and nobody reads the logits: with the lm_head on
  // the device, the device takes each row's argmax and only the S tokens come back (S·4 bytes
  // instead of S·V·4).
  bool greedy = false;
};

// What a step returns to the engine's sampling, in host memory the executor owns, valid until
// the next step. Both empty when the lm_head is on the host (the final rows came back instead).
struct OffloadStepOutput {
  std::span<const float> logits;           // [S, V]: lm_head on the device, not greedy
  std::span<const int32_t> greedy_tokens;  // [S]: lm_head on the device, greedy
};

class DiskExperts;

class OffloadExecutor {
 public:
  // `weights` are the engine's (bf16 matrices, fp32 norms); they, `kv` (the host cache: the CPU
  // share's K/V) and `device_kv` (the device pool's books, of device_kv_config; null when that
  // has no block) outlive the executor. Fails if the device budget cannot hold the footprint
  // with the fewest slots, naming it.
  // `disk` (null: the routed experts are in `weights`) holds them in their files when they stay
  // on disk; it too outlives the executor.
  OffloadExecutor(const ModelConfig& c, const ModelWeights& weights, const Policy& p,
                  PagedKvCache& kv, const PagedKvCache* device_kv, const EngineDevice& device,
                  DiskExperts* disk = nullptr);
  ~OffloadExecutor();

  // Runs every layer of the step and adds to `stats`. With the lm_head on the device, returns
  // the sampled rows' logits (after the final norm and lm_head), or their greedy tokens;
  // otherwise writes the sampled rows' hidden states (before the final norm) to `final_rows`
  // [S, H] on the host and returns nothing.
  OffloadStepOutput run_layers(const OffloadStepInput& in, float* final_rows, EngineStats& stats);

  int page_slots() const;
  int resident_expert_layers() const;
  bool lm_head_on_device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
