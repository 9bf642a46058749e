#include "runtime/offload/cpu_standin_device.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "core/clock.h"
#include "core/error.h"

namespace sluice::offload {

const char* queue_name(Queue q) {
  switch (q) {
    case Queue::kWeights:
      return "weights";
    case Queue::kTransfer:
      return "transfer";
    case Queue::kCompute:
      return "compute";
  }
  return "?";
}

namespace {

// Set once by the queue that reached the event; waiters block on the condition variable.
class StandinEvent final : public Event {
 public:
  void set() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

StandinEvent& as_standin(const EventPtr& e) {
  auto* s = dynamic_cast<StandinEvent*>(e.get());
  if (!s) fail("cpu-standin device: field 'event': expected an event recorded on this device");
  return *s;
}

}  // namespace

CpuStandinDevice::CpuStandinDevice(size_t budget_bytes, double copy_bytes_per_second)
    : budget_(budget_bytes), copy_rate_(copy_bytes_per_second) {
  for (int q = 0; q < kQueueCount; ++q)
    workers_[q].thread = std::thread([this, q] { worker_loop(workers_[q], Queue(q)); });
}

CpuStandinDevice::~CpuStandinDevice() {
  stop_ = true;
  for (Worker& w : workers_) {
    { std::lock_guard lock(w.mutex); }
    w.cv.notify_all();
  }
  for (Worker& w : workers_) w.thread.join();
}

void* CpuStandinDevice::allocate(size_t bytes, std::string_view what) {
  budget_.charge(bytes, what);
  // 256-byte aligned, as cudaMalloc's: kernels may use aligned vector loads on device memory
  // (the packed quantized experts' 64-byte lines).
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!p) {
    budget_.refund(bytes);
    fail("cpu-standin device: allocating {} bytes for {}: out of host memory", bytes, what);
  }
  return p;
}

void CpuStandinDevice::deallocate(void* ptr, size_t bytes) {
  std::free(ptr);
  budget_.refund(bytes);
}

void CpuStandinDevice::push(Queue q, Op op) {
  Worker& w = workers_[int(q)];
  {
    std::lock_guard lock(w.mutex);
    w.ops.push_back(std::move(op));
  }
  w.cv.notify_all();
}

void CpuStandinDevice::worker_loop(Worker& w, Queue q) {
  for (;;) {
    Op op;
    {
      std::unique_lock lock(w.mutex);
      w.cv.wait(lock, [&] { return stop_ || !w.ops.empty(); });
      if (w.ops.empty()) return;  // stopping and drained
      op = std::move(w.ops.front());
      w.ops.pop_front();
      w.busy = true;
    }
    op.entry.queue = q;
    op.entry.start_tick = tick_++;
    const auto t0 = Clock::now();
    try {
      op.run();
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    op.entry.end_tick = tick_++;
    if (op.traced) {  // copies and work; an event wait is not busy time
      const double s = seconds_since(t0);
      std::lock_guard lock(busy_mutex_);
      busy_[q] += s;
    }
    if (op.traced) {
      std::lock_guard lock(trace_mutex_);
      trace_.push_back(std::move(op.entry));
    }
    {
      std::lock_guard lock(w.mutex);
      w.busy = false;
    }
    w.cv.notify_all();
  }
}

void CpuStandinDevice::copy(Queue q, void* dst, const void* src, size_t bytes,
                            std::string_view label) {
  Op op;
  op.traced = true;
  op.entry.label = std::string(label);
  op.entry.dst = dst;
  op.entry.bytes = bytes;
  const double rate = copy_rate_;
  op.run = [dst, src, bytes, rate] {
    const auto t0 = Clock::now();
    std::memcpy(dst, src, bytes);
    if (rate > 0)
      std::this_thread::sleep_until(t0 + std::chrono::duration<double>(double(bytes) / rate));
  };
  push(q, std::move(op));
}

void CpuStandinDevice::copy_to_device(Queue q, void* dst, const void* src, size_t bytes,
                                      std::string_view label) {
  copy(q, dst, src, bytes, label);
}

void CpuStandinDevice::copy_to_host(Queue q, void* dst, const void* src, size_t bytes,
                                    std::string_view label) {
  copy(q, dst, src, bytes, label);
}

void CpuStandinDevice::enqueue(Queue q, QueueWork work, std::string_view label) {
  Op op;
  op.traced = true;
  op.entry.label = std::string(label);
  op.run = [work = std::move(work)] { work(nullptr); };
  push(q, std::move(op));
}

EventPtr CpuStandinDevice::record(Queue q) {
  auto event = std::make_shared<StandinEvent>();
  Op op;
  op.run = [event] { event->set(); };
  push(q, std::move(op));
  return event;
}

void CpuStandinDevice::wait(Queue q, const EventPtr& event) {
  StandinEvent& e = as_standin(event);
  Op op;
  op.run = [&e, keep = event] { e.wait(); };
  push(q, std::move(op));
}

void CpuStandinDevice::synchronize(const EventPtr& event) {
  as_standin(event).wait();
  rethrow_worker_error();
}

void CpuStandinDevice::synchronize_all() {
  for (Worker& w : workers_) {
    std::unique_lock lock(w.mutex);
    w.cv.wait(lock, [&] { return w.ops.empty() && !w.busy; });
  }
  rethrow_worker_error();
}

void CpuStandinDevice::rethrow_worker_error() {
  std::lock_guard lock(error_mutex_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void* CpuStandinDevice::allocate_host(size_t bytes, std::string_view what) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p)
    fail("cpu-standin device: allocating {} bytes of host memory for {}: out of memory", bytes,
         what);
  return p;
}

void CpuStandinDevice::free_host(void* ptr) {
  std::free(ptr);
}

// Host memory needs no pinning here; the ranges are kept so tests can check that the executor
// registers what it streams, without overlaps, and releases it all.
bool CpuStandinDevice::register_host(const void* ptr, size_t bytes) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard lock(host_mutex_);
  auto next = registered_.lower_bound(p);
  const bool overlaps_next = next != registered_.end() && next->first < p + bytes;
  const bool overlaps_prev =
      next != registered_.begin() && std::prev(next)->first + std::prev(next)->second > p;
  if (overlaps_next || overlaps_prev || bytes == 0)
    fail(
        "cpu-standin device: register_host: field 'range': expected a non-empty range that no "
        "registered range overlaps, got {} bytes at {}",
        bytes, ptr);
  registered_[p] = bytes;
  return true;
}

void CpuStandinDevice::unregister_host(const void* ptr) {
  std::lock_guard lock(host_mutex_);
  if (registered_.erase(static_cast<const char*>(ptr)) == 0)
    fail("cpu-standin device: unregister_host: field 'ptr': expected a registered range, got {}",
         ptr);
}

size_t CpuStandinDevice::registered_bytes() const {
  std::lock_guard lock(host_mutex_);
  size_t total = 0;
  for (const auto& [p, bytes] : registered_) total += bytes;
  return total;
}

QueueSeconds CpuStandinDevice::take_busy_seconds() {
  std::lock_guard lock(busy_mutex_);
  return std::exchange(busy_, QueueSeconds{});
}

double CpuStandinDevice::measure_host_to_device(size_t bytes, int repeats) {
  std::vector<char> src(bytes, 1), dst(bytes);
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    if (copy_rate_ > 0)
      std::this_thread::sleep_until(t0 + std::chrono::duration<double>(double(bytes) / copy_rate_));
    best = std::min(best, seconds_since(t0));
  }
  return best > 0 ? double(bytes) / best : 0;
}

std::vector<TraceEntry> CpuStandinDevice::trace() const {
  std::lock_guard lock(trace_mutex_);
  return trace_;
}

}  // namespace sluice::offload
