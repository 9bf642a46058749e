#include "runtime/offload/step_pipeline.h"

#include <fmt/format.h>

#include "core/error.h"

namespace sluice::offload {

std::vector<std::vector<int>> step_task_uses(const std::vector<LayerPages>& layers,
                                             int micro_batches) {
  if (micro_batches <= 0)
    fail("step pipeline: field 'micro_batches': expected > 0, got {}", micro_batches);
  std::vector<std::vector<int>> uses;
  for (const LayerPages& L : layers) {
    uses.push_back(L.attention_in);
    for (int i = 0; i < micro_batches; ++i) {
      if (i + 1 < micro_batches) uses.push_back(L.attention_in);
      uses.push_back(L.attention_out);
    }
    for (const auto& e : L.experts) uses.push_back(e);
  }
  return uses;
}

StepPipelineStats run_step(Device& device, PageSlots& slots, std::vector<WeightPage> pages,
                           const std::vector<LayerPages>& layers, StepOps& ops,
                           const StepPipelineOptions& options, PageSource* source) {
  const int M = ops.micro_batches();
  PageStreamer streamer(device, slots, std::move(pages), step_task_uses(layers, M), source,
                        options.copy_window);
  StepPipelineStats stats;
  // `ops` is used by work that runs on the queues: the caller keeps it alive until it has
  // synchronised on the step.
  int task = 0;  // the streamer's next task, advanced in step_task_uses order
  streamer.prefetch();

  auto transfer_in = [&](const Transfer& t, std::string_view label) {
    if (t.bytes == 0) return;
    device.copy_to_device(Queue::kTransfer, t.dst, t.src, t.bytes, label);
  };

  for (int l = 0; l < int(layers.size()); ++l) {
    const LayerPages& layer = layers[size_t(l)];
    const int E = int(layer.experts.size());
    std::vector<EventPtr> qkv_on_host(static_cast<size_t>(M)),
        routing_on_host(static_cast<size_t>(M));

    // GPU attention_in(i), then its CPU share's q/k/v to the host.
    auto start_micro_batch = [&](int i) {
      streamer.run(
          task++, [&ops, l, i](void* s, std::span<void* const> p) { ops.attention_in(s, l, i, p); },
          fmt::format("L{}.attn_in{}", l, i));
      const Transfer t = ops.qkv_to_host(l, i);
      if (t.bytes == 0) return;
      device.wait(Queue::kTransfer, device.record(Queue::kCompute));
      device.copy_to_host(Queue::kTransfer, t.dst, t.src, t.bytes,
                          fmt::format("L{}.qkv{}>h", l, i));
      qkv_on_host[size_t(i)] = device.record(Queue::kTransfer);
    };

    start_micro_batch(0);
    for (int i = 0; i < M; ++i) {
      if (i + 1 < M) start_micro_batch(i + 1);  // the GPU works on i+1 while the CPU does i
      if (qkv_on_host[size_t(i)]) {
        device.synchronize(qkv_on_host[size_t(i)]);
        ops.cpu_attention(l, i);
        transfer_in(ops.attention_to_device(l, i), fmt::format("L{}.attn{}>d", l, i));
        device.wait(Queue::kCompute, device.record(Queue::kTransfer));
      }
      streamer.run(
          task++,
          [&ops, l, i](void* s, std::span<void* const> p) { ops.attention_out(s, l, i, p); },
          fmt::format("L{}.attn_out{}", l, i));
      const Transfer r = ops.routing_to_host(l, i);
      device.wait(Queue::kTransfer, device.record(Queue::kCompute));
      device.copy_to_host(Queue::kTransfer, r.dst, r.src, r.bytes,
                          fmt::format("L{}.route{}>h", l, i));
      routing_on_host[size_t(i)] = device.record(Queue::kTransfer);
    }

    // Expert phase: the host needs every token's routing to group tokens per expert.
    device.synchronize(routing_on_host[size_t(M - 1)]);  // transfers are in order: all arrived
    const std::vector<int> tokens = ops.expert_tokens(l);
    if (int(tokens.size()) != E)
      fail("step pipeline: layer {}: field 'expert_tokens': expected {} experts, got {}", l, E,
           tokens.size());
    transfer_in(ops.expert_rows_to_device(l), fmt::format("L{}.rows>d", l));
    device.wait(Queue::kCompute, device.record(Queue::kTransfer));
    // Decide every expert's place before enqueuing any of them: the host runs ahead of the
    // device, so once an expert is enqueued the copies of the next experts' pages are issued.
    enum class Place { kSkip, kCpu, kGpu };
    std::vector<Place> place(static_cast<size_t>(E), Place::kGpu);
    // Experts whose pages the device slots kept from before take them now: they run on the
    // device, and their pages are neither copied nor lent.
    std::vector<char> kept(static_cast<size_t>(E), 0);
    for (int e = 0; e < E; ++e)
      if (tokens[size_t(e)] > 0 && !layer.experts[size_t(e)].empty())
        kept[size_t(e)] = streamer.take_cached(task + e);
    std::vector<int> to_copy, on_cpu;
    for (int e = 0; e < E; ++e) {
      const int t = task + e, n = tokens[size_t(e)];
      if (n == 0) {
        streamer.drop_if_not_copied(t);
        place[size_t(e)] = Place::kSkip;
      } else if (n <= options.cpu_expert_max_tokens && !layer.experts[size_t(e)].empty() &&
                 streamer.drop_if_not_copied(t)) {
        // An expert without pages is resident on the device: the CPU would save no copy.
        place[size_t(e)] = Place::kCpu;
        on_cpu.push_back(e);
      }
      if (place[size_t(e)] == Place::kGpu && !kept[size_t(e)]) to_copy.push_back(e);
    }
    ops.experts_placed(l, to_copy, on_cpu);
    for (int e = 0; e < E; ++e) {
      const int t = task++;
      if (place[size_t(e)] != Place::kGpu) {
        streamer.skip(t);
        stats.skipped_experts += place[size_t(e)] == Place::kSkip;
        continue;
      }
      streamer.run(
          t, [&ops, l, e](void* s, std::span<void* const> p) { ops.gpu_expert(s, l, e, p); },
          fmt::format("L{}.e{}", l, e));
      ++stats.gpu_experts;
    }
    // The GPU streams and computes the big experts while the CPU does the small ones.
    for (int e : on_cpu) ops.cpu_expert(l, e);
    stats.cpu_experts += int64_t(on_cpu.size());
    if (!on_cpu.empty()) {
      transfer_in(ops.cpu_experts_to_device(l), fmt::format("L{}.cpu_experts>d", l));
      device.wait(Queue::kCompute, device.record(Queue::kTransfer));
      device.enqueue(
          Queue::kCompute, [&ops, l](void* s) { ops.add_cpu_experts(s, l); },
          fmt::format("L{}.add_cpu_experts", l));
    }
    device.enqueue(
        Queue::kCompute, [&ops, l](void* s) { ops.dense_mlp(s, l); },
        fmt::format("L{}.dense_mlp", l));
  }
  if (!streamer.finished()) fail("step pipeline: {} tasks left unrun (a bug)", task);
  stats.pages_copied = streamer.pages_copied();
  stats.bytes_copied = streamer.bytes_copied();
  stats.pages_reused = streamer.pages_reused();
  stats.bytes_reused = streamer.bytes_reused();
  return stats;
}

}  // namespace sluice::offload
