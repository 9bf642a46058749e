// The device as the offload pipeline sees it: budgeted device memory, three in-order queues
// (weight copies, activation transfers, compute) and events that order work across queues.
//
// The model is CUDA's streams and events, so the CUDA backend maps onto it one to one
// (runtime/gpu/cuda_device.h); the CPU stand-in (cpu_standin_device.h) implements it with one
// thread per queue and memcpy, so the page pool and the pipeline schedule are tested on every
// machine. Nothing here synchronises the whole device: the host waits only on single events.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/offload/memory_budget.h"

namespace sluice::offload {

enum class Queue : int {
  kWeights = 0,  // host→device weight pages (one copy engine)
  kTransfer,     // activations, both directions (the other copy engine)
  kCompute,      // kernels
};
constexpr int kQueueCount = 3;
const char* queue_name(Queue q);

// A point in one queue's work; opaque, shared between the host and the queues that wait on it.
class Event {
 public:
  virtual ~Event() = default;
};
using EventPtr = std::shared_ptr<Event>;

// Work enqueued on a queue. On CUDA the function runs on the host at enqueue time and launches
// kernels on `stream` (a cudaStream_t); on the stand-in it runs on the queue's thread, in order.
using QueueWork = std::function<void(void* stream)>;

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;

  // Device memory, charged to the budget first; fails naming `what`, the size and the budget.
  virtual void* allocate(size_t bytes, std::string_view what) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual const MemoryBudget& budget() const = 0;

  // Asynchronous copies in queue order; the host buffer must stay valid (and for CUDA pinned)
  // until an event recorded after the copy has completed.
  virtual void copy_to_device(Queue q, void* dst, const void* src, size_t bytes,
                              std::string_view label) = 0;
  virtual void copy_to_host(Queue q, void* dst, const void* src, size_t bytes,
                            std::string_view label) = 0;
  virtual void enqueue(Queue q, QueueWork work, std::string_view label) = 0;

  virtual EventPtr record(Queue q) = 0;                   // marks the work enqueued so far
  virtual void wait(Queue q, const EventPtr& event) = 0;  // later work on q waits for it
  virtual void synchronize(const EventPtr& event) = 0;    // the host waits for it
  virtual void synchronize_all() = 0;                     // end of a run or teardown only
};

}  // namespace sluice::offload
