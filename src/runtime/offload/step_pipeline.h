// The CGOPipe-style schedule of one engine step over a Device (MoE-Lightning's CPU-GPU-I/O
// pipeline combined with module-based batching).
//
// Per layer:
//   attention phase, micro-batch by micro-batch:
//     GPU   attention_in(i): norm, QKV projections, RoPE, KV write and attention of the GPU share
//     D2H   the CPU share's q/k/v                       (transfer queue)
//     CPU   cpu_attention(i) over the host KV cache      while the GPU runs attention_in(i+1)
//     H2D   the CPU share's attention output            (transfer queue)
//     GPU   attention_out(i): O-projection + residual, FFN norm, router, top-k
//     D2H   routing of micro-batch i, accumulated per expert on the host
//   expert phase: each expert once over all its tokens (one task per expert, streaming its
//     pages while earlier experts compute); experts with at most `cpu_expert_max_tokens` tokens
//     whose pages are not copied yet run on the CPU instead, their output added on the GPU.
//     An expert with no pages (its weights resident on the GPU) always runs on the GPU.
//   dense MLP: the layer's shared expert or dense FFN (resident) over every row, after the
//     experts, as the CPU engine adds them.
// Weight pages of the whole step (every layer) stream through one PageStreamer, so the next
// layer's attention pages and experts are prefetched during this layer's expert phase. The host
// waits only on single events (a micro-batch's q/k/v, the routing); never on the whole device.
#pragma once

#include <span>
#include <vector>

#include "runtime/offload/page_streamer.h"

namespace sluice::offload {

struct Transfer {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// The math of a step, supplied by the backend (CUDA kernels) or a test double. GPU functions
// enqueue on `stream`; `pages` are the device addresses of the task's streamed pages (empty for
// resident weights, which the ops hold themselves).
class StepOps {
 public:
  virtual ~StepOps() = default;
  virtual int micro_batches() const = 0;
  virtual void attention_in(void* stream, int layer, int mb, std::span<void* const> pages) = 0;
  virtual Transfer qkv_to_host(int layer, int mb) = 0;  // bytes 0: no CPU share
  virtual void cpu_attention(int layer, int mb) = 0;
  virtual Transfer attention_to_device(int layer, int mb) = 0;
  virtual void attention_out(void* stream, int layer, int mb, std::span<void* const> pages) = 0;
  virtual Transfer routing_to_host(int layer, int mb) = 0;
  // After every micro-batch's routing arrived: tokens per expert (index = expert), and the
  // upload of the per-expert row lists the expert kernels gather by.
  virtual std::vector<int> expert_tokens(int layer) = 0;
  virtual Transfer expert_rows_to_device(int layer) = 0;
  // Every expert's place is decided: `to_copy` are the GPU experts whose pages are still to be
  // copied (in the order their tasks run next; the others run from pages the device slots kept),
  // then `cpu` (cpu_expert, in this order, after the GPU ones are enqueued). No page of the
  // layer's experts has been copied yet when they come from a PageSource.
  virtual void experts_placed(int layer, const std::vector<int>& to_copy,
                              const std::vector<int>& cpu) {
    (void)layer, (void)to_copy, (void)cpu;
  }
  virtual void gpu_expert(void* stream, int layer, int expert, std::span<void* const> pages) = 0;
  virtual void cpu_expert(int layer, int expert) = 0;
  virtual Transfer cpu_experts_to_device(int layer) = 0;  // bytes 0: none ran on the CPU
  virtual void add_cpu_experts(void* stream, int layer) = 0;
  // After the layer's experts: its dense MLP over every row (a shared expert or a dense layer's
  // FFN), which reads the FFN-normed rows and adds into the residual; nothing without one.
  virtual void dense_mlp(void* stream, int layer) = 0;
};

// Which streamed pages each kind of task reads. Resident weights have no pages.
struct LayerPages {
  std::vector<int> attention_in, attention_out;  // indices into the step's page list
  std::vector<std::vector<int>> experts;         // per expert
};

struct StepPipelineOptions {
  int cpu_expert_max_tokens = 0;  // 0: every expert runs on the GPU
  int copy_window = 0;  // PageStreamer's window: pages copied ahead at most (0: every slot)
};

struct StepPipelineStats {
  int64_t gpu_experts = 0, cpu_experts = 0, skipped_experts = 0;
  int64_t pages_copied = 0, bytes_copied = 0;
  int64_t pages_reused = 0, bytes_reused = 0;  // taken from the device slots' cache
};

// Task order of a step: for each layer, attention_in(0), then for each micro-batch i
// attention_in(i+1) (if any) before attention_out(i), then the experts in id order. Returns
// uses[t] for the PageStreamer; `layers` holds each layer's page indices.
std::vector<std::vector<int>> step_task_uses(const std::vector<LayerPages>& layers,
                                             int micro_batches);

// Runs one step: enqueues all GPU work, runs the CPU work on the calling thread, and returns
// once everything is enqueued (the caller synchronises on its final event). `source` lends the
// host memory of borrowed pages (PageStreamer); it makes a layer's expert pages available only
// once experts_placed has told it the layer's experts.
StepPipelineStats run_step(Device& device, PageSlots& slots, std::vector<WeightPage> pages,
                           const std::vector<LayerPages>& layers, StepOps& ops,
                           const StepPipelineOptions& options, PageSource* source = nullptr);

}  // namespace sluice::offload
