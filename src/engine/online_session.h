// Requests that arrive while the engine runs (the server's continuous batching). One engine
// thread owns the BatchEngine's Scheduler and runs its steps; any thread submits or cancels. A
// request submitted while a step runs joins the batch at the next step boundary, within the
// policy's bounds (B sequences, the KV blocks); a cancelled one (its client went away) frees its
// slot and KV blocks before the next step. Nothing here knows about HTTP.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/batch_engine.h"

namespace sluice {

// What a submitted request hears, on the engine thread (so it must not block).
class OnlineListener {
 public:
  virtual ~OnlineListener() = default;
  // After each generated token, with all the request's generated tokens so far and, when the
  // request asked for them (Request::top_logprobs), their log probabilities.
  virtual void on_tokens(std::span<const int> generated,
                         std::span<const TokenLogprob> logprobs) = 0;
  // Once: the completion (FinishReason::kError with `error` when it failed or was dropped).
  virtual void on_finished(Completion&& c) = 0;
};

// Counters and gauges for /metrics; a consistent snapshot.
struct OnlineMetrics {
  int64_t requests_accepted = 0, requests_rejected = 0, requests_finished = 0;
  int64_t requests_cancelled = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t steps = 0;
  double step_seconds_sum = 0, last_step_seconds = 0;
  int64_t running_sum = 0;  // sequences running, summed over steps (mean batch = sum / steps)
  int64_t running = 0, waiting = 0;
  double kv_usage = 0;  // blocks in use over all blocks
};

class OnlineSession {
 public:
  // `max_waiting`: requests that may wait for a slot before submit answers kQueueFull.
  OnlineSession(BatchEngine& engine, size_t max_waiting);
  ~OnlineSession();  // shutdown(0)

  enum class Admission { kAccepted, kQueueFull, kStopping };
  struct Submitted {
    Admission admission = Admission::kAccepted;
    int64_t id = -1;  // the request's id (assigned here), for cancel
  };
  // `r.id` is replaced. A request that can never run is finished at once with kError.
  Submitted submit(Request r, std::shared_ptr<OnlineListener> listener);
  // Drops the request before the next step; its listener hears nothing more.
  void cancel(int64_t id);

  // Stops accepting; waiting requests fail at once, running ones get up to `grace_seconds` to
  // finish, then fail; returns when the engine thread has ended.
  void shutdown(double grace_seconds);
  OnlineMetrics metrics() const;

 private:
  void engine_loop();
  void admit_inbox(std::vector<std::pair<Request, std::shared_ptr<OnlineListener>>>& inbox);
  void run_one_step();
  void fail_all(const std::string& why, bool running_too);
  void finish(Completion&& c);

  BatchEngine& engine_;
  std::unique_ptr<Scheduler> sched_;  // the engine thread's
  std::unordered_map<int64_t, std::shared_ptr<OnlineListener>> listeners_;  // engine thread's
  const size_t max_waiting_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::pair<Request, std::shared_ptr<OnlineListener>>> inbox_;
  std::vector<int64_t> cancels_;
  bool stopping_ = false;
  bool fail_running_ = false;  // the grace period is over
  int64_t next_id_ = 0;
  OnlineMetrics metrics_;  // under mutex_
  std::thread thread_;
};

}  // namespace sluice
