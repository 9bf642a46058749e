// A CPU stand-in for the GPU: one worker thread per queue runs that queue's work in order,
// copies are memcpy (optionally slowed to a simulated link bandwidth), events are flags with a
// condition variable. "Device memory" is host memory charged to the same hard budget.
//
// It exists so the page pool and the pipeline schedule (dependency order, prefetch window,
// budget, releases) are exercised on every machine, including CI without a GPU. Every operation
// is traced with global ticks taken when it starts and ends, so a test can check orderings:
// if operation B waited (through events) for A, then A.end_tick < B.start_tick.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/offload/device.h"

namespace sluice::offload {

struct TraceEntry {
  Queue queue;
  std::string label;
  const void* dst = nullptr;  // copies: the device (or host) address written
  size_t bytes = 0;           // copies: bytes moved
  int64_t start_tick = 0, end_tick = 0;
};

class CpuStandinDevice final : public Device {
 public:
  // copy_bytes_per_second: 0 copies at memcpy speed; otherwise copies take bytes / rate.
  explicit CpuStandinDevice(size_t budget_bytes, double copy_bytes_per_second = 0);
  ~CpuStandinDevice() override;

  std::string name() const override { return "cpu-standin"; }
  void* allocate(size_t bytes, std::string_view what) override;
  void deallocate(void* ptr, size_t bytes) override;
  const MemoryBudget& budget() const override { return budget_; }
  bool memory_is_host() const override { return true; }

  void copy_to_device(Queue q, void* dst, const void* src, size_t bytes,
                      std::string_view label) override;
  void copy_to_host(Queue q, void* dst, const void* src, size_t bytes,
                    std::string_view label) override;
  void enqueue(Queue q, QueueWork work, std::string_view label) override;
  EventPtr record(Queue q) override;
  void wait(Queue q, const EventPtr& event) override;
  void synchronize(const EventPtr& event) override;
  void synchronize_all() override;
  void* allocate_host(size_t bytes, std::string_view what) override;
  void free_host(void* ptr) override;
  bool register_host(const void* ptr, size_t bytes) override;
  void unregister_host(const void* ptr) override;
  QueueSeconds take_busy_seconds() override;
  double measure_host_to_device(size_t bytes, int repeats) override;

  // Host bytes registered now (register_host less unregister_host), for tests.
  size_t registered_bytes() const;

  // Every traced operation so far (copies and work; not records or waits), in completion order.
  std::vector<TraceEntry> trace() const;

 private:
  struct Op {
    std::function<void()> run;
    bool traced = false;
    TraceEntry entry;
  };
  struct Worker {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Op> ops;
    bool busy = false;
    std::thread thread;
  };
  void push(Queue q, Op op);
  void worker_loop(Worker& w, Queue q);
  void copy(Queue q, void* dst, const void* src, size_t bytes, std::string_view label);
  void rethrow_worker_error();

  MemoryBudget budget_;
  double copy_rate_ = 0;
  Worker workers_[kQueueCount];
  std::atomic<int64_t> tick_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex trace_mutex_;
  std::vector<TraceEntry> trace_;
  std::mutex error_mutex_;
  std::exception_ptr error_;
  mutable std::mutex host_mutex_;
  std::map<const char*, size_t> registered_;  // start -> bytes
  std::mutex busy_mutex_;
  QueueSeconds busy_;  // since the last take_busy_seconds
};

}  // namespace sluice::offload
