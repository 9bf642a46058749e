// The device as the offload pipeline sees it: budgeted device memory, three in-order queues
// (weight copies, activation transfers, compute), events that order work across queues, host
// memory the device copies at full speed (pinned), and the time each queue spent working.
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

// Per-queue seconds, indexed by Queue.
struct QueueSeconds {
  double seconds[kQueueCount] = {};
  double& operator[](Queue q) { return seconds[int(q)]; }
  double operator[](Queue q) const { return seconds[int(q)]; }
};

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
  // Whether "device" memory is the host's (the CPU stand-in): it then counts in the process's
  // resident memory.
  virtual bool memory_is_host() const { return false; }

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

  // Host memory for what crosses the link every step (activations): page-locked on CUDA, so
  // copies run at full bandwidth and overlap with compute. Fails naming `what`.
  virtual void* allocate_host(size_t bytes, std::string_view what) = 0;
  virtual void free_host(void* ptr) = 0;
  // Page-locks an existing host range (the streamed weights) in place. Returns false, changing
  // nothing, when the device cannot (the caller warns: copies from it will be slow and staged).
  // Ranges must not overlap ones registered before; each is unregistered once, at teardown.
  virtual bool register_host(const void* ptr, size_t bytes) = 0;
  virtual void unregister_host(const void* ptr) = 0;

  // Seconds each queue spent running its copies and work (not waiting on events), for the
  // operations that completed since the last call; those still running count at a later call,
  // so the host never waits for them here. Measured on the device (timed events on CUDA).
  virtual QueueSeconds take_busy_seconds() = 0;

  // Host→device bandwidth from page-locked memory, bytes per second: `repeats` copies of `bytes`
  // on the weights queue into memory outside the budget, best of them. Call while idle.
  virtual double measure_host_to_device(size_t bytes, int repeats) = 0;
};

// Device memory charged to the device's budget, freed at scope exit.
struct DeviceBuffer {
  Device& device;
  size_t bytes;
  void* ptr;
  DeviceBuffer(Device& d, size_t n, std::string_view what)
      : device(d), bytes(n), ptr(d.allocate(n, what)) {}
  ~DeviceBuffer() { device.deallocate(ptr, bytes); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace sluice::offload
