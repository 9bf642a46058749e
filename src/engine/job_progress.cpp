#include "engine/job_progress.h"

#include <fmt/format.h>

namespace sluice {
namespace {

std::string duration_text(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

}  // namespace

JobProgress::JobProgress(std::FILE* out, bool live, double log_seconds)
    : out_(out), live_(live), log_seconds_(log_seconds) {}

void JobProgress::start(int64_t total_requests) {
  total_ = total_requests;
  started_ = last_print_ = Clock::now();
}

void JobProgress::step(const EngineStats& stats, const BatchEngine::Progress& p) {
  const auto now = Clock::now();
  const double since_print = std::chrono::duration<double>(now - last_print_).count();
  if (since_print < (live_ ? 0.25 : log_seconds_)) return;
  last_print_ = now;
  const double elapsed = std::chrono::duration<double>(now - started_).count();
  // ETA from the request completion rate so far: requests finish in waves, so it is rough
  // until a few waves have passed.
  const std::string eta =
      p.finished > 0 ? duration_text(elapsed / double(p.finished) * double(total_ - p.finished))
                     : "?";
  const std::string line = fmt::format(
      "run: {}/{} requests done, {} running, {:.1f} tokens/s generated, ETA {}, KV cache {:.0f}%",
      p.finished, total_, p.active, double(stats.decode_tokens) / elapsed, eta, 100 * p.kv_usage);
  if (live_) {
    fmt::print(out_, "\r\x1b[K{}", line);
    line_shown_ = true;
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void JobProgress::clear() {
  if (!line_shown_) return;
  fmt::print(out_, "\r\x1b[K");
  std::fflush(out_);
  line_shown_ = false;
}

}  // namespace sluice
