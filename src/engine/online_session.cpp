#include "engine/online_session.h"

#include <chrono>
#include <exception>

#include "core/clock.h"

namespace sluice {
namespace {

Completion failed_completion(int64_t id, int prompt_tokens, std::string why) {
  Completion c;
  c.id = id;
  c.prompt_tokens = prompt_tokens;
  c.reason = FinishReason::kError;
  c.error = std::move(why);
  return c;
}

}  // namespace

OnlineSession::OnlineSession(BatchEngine& engine, size_t max_waiting)
    : engine_(engine), sched_(engine.make_scheduler()), max_waiting_(max_waiting) {
  thread_ = std::thread([this] { engine_loop(); });
}

OnlineSession::~OnlineSession() {
  shutdown(0);
}

OnlineSession::Submitted OnlineSession::submit(Request r,
                                               std::shared_ptr<OnlineListener> listener) {
  std::lock_guard lock(mutex_);
  if (stopping_) return {Admission::kStopping, -1};
  if (size_t(metrics_.waiting) + inbox_.size() >= max_waiting_) {
    ++metrics_.requests_rejected;
    return {Admission::kQueueFull, -1};
  }
  r.id = next_id_++;
  OnlineListener* hears = listener.get();
  r.on_generated = [hears](std::span<const int> generated, std::span<const TokenLogprob> logprobs) {
    hears->on_tokens(generated, logprobs);
  };
  const int64_t id = r.id;
  ++metrics_.requests_accepted;
  inbox_.emplace_back(std::move(r), std::move(listener));
  wake_.notify_one();
  return {Admission::kAccepted, id};
}

void OnlineSession::cancel(int64_t id) {
  std::lock_guard lock(mutex_);
  cancels_.push_back(id);
  wake_.notify_one();
}

void OnlineSession::shutdown(double grace_seconds) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake_.notify_one();
  }
  if (!thread_.joinable()) return;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(grace_seconds));
  {
    std::unique_lock lock(mutex_);
    while (metrics_.running + metrics_.waiting + int64_t(inbox_.size()) > 0 &&
           Clock::now() < deadline)
      wake_.wait_until(lock, std::min<Clock::time_point>(
                                 deadline, Clock::now() + std::chrono::milliseconds(20)));
    fail_running_ = true;
    wake_.notify_one();
  }
  thread_.join();
}

OnlineMetrics OnlineSession::metrics() const {
  std::lock_guard lock(mutex_);
  OnlineMetrics m = metrics_;
  m.waiting += int64_t(inbox_.size());  // submitted during the running step
  return m;
}

void OnlineSession::finish(Completion&& c) {
  auto it = listeners_.find(c.id);
  if (it == listeners_.end()) return;
  std::shared_ptr<OnlineListener> listener = std::move(it->second);
  listeners_.erase(it);
  {
    std::lock_guard lock(mutex_);
    ++metrics_.requests_finished;
    if (c.reason != FinishReason::kError) {
      metrics_.prompt_tokens += c.prompt_tokens;
      metrics_.generated_tokens += int64_t(c.tokens.size());
    }
  }
  listener->on_finished(std::move(c));
}

// Fails every waiting request, and the running ones too when `running_too`.
void OnlineSession::fail_all(const std::string& why, bool running_too) {
  std::vector<int64_t> ids;
  for (const auto& [id, listener] : listeners_) ids.push_back(id);
  for (int64_t id : ids) {
    const bool running = sched_->is_running(id);
    if (running && !running_too) continue;
    sched_->cancel(id);
    finish(failed_completion(id, 0, why));
  }
}

void OnlineSession::admit_inbox(
    std::vector<std::pair<Request, std::shared_ptr<OnlineListener>>>& inbox) {
  for (auto& [request, listener] : inbox) {
    const int64_t id = request.id;
    listeners_[id] = std::move(listener);
    if (std::optional<Completion> failed = sched_->submit(std::move(request)))
      finish(std::move(*failed));
  }
}

void OnlineSession::run_one_step() {
  const int running = sched_->active();
  const auto t0 = Clock::now();
  std::vector<Completion> done;
  try {
    done = engine_.step(*sched_);
  } catch (const std::exception& e) {
    fail_all(std::string("engine: ") + e.what(), /*running_too=*/true);
    return;
  }
  const double seconds = seconds_since(t0);
  for (Completion& c : done) finish(std::move(c));
  std::lock_guard lock(mutex_);
  ++metrics_.steps;
  metrics_.step_seconds_sum += seconds;
  metrics_.last_step_seconds = seconds;
  metrics_.running_sum += running;
}

void OnlineSession::engine_loop() {
  for (;;) {
    std::vector<std::pair<Request, std::shared_ptr<OnlineListener>>> inbox;
    std::vector<int64_t> cancels;
    bool stopping = false, fail_running = false;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || !sched_->done();
      });
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      stopping = stopping_;
      fail_running = fail_running_;
    }
    admit_inbox(inbox);
    for (int64_t id : cancels)
      if (listeners_.erase(id) > 0) {
        sched_->cancel(id);
        std::lock_guard lock(mutex_);
        ++metrics_.requests_cancelled;
      }
    if (stopping) fail_all("the server is shutting down", fail_running);
    if (!sched_->done()) run_one_step();
    std::lock_guard lock(mutex_);
    metrics_.running = sched_->active();
    metrics_.waiting = int64_t(sched_->waiting());
    metrics_.kv_usage = sched_->kv_usage();
    wake_.notify_all();  // shutdown waits for the work to drain
    if (stopping && fail_running && sched_->done() && inbox_.empty()) return;
  }
}

}  // namespace sluice
