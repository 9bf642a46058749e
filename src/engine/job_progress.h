// Progress of a batch job on a stream (stderr): on a terminal a status line rewritten in place,
// otherwise (logs, pipes) a plain line every few seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "engine/batch_engine.h"

namespace sluice {

class JobProgress {
 public:
  // live: rewrite one status line (a terminal); otherwise print a line every `log_seconds`.
  JobProgress(std::FILE* out, bool live, double log_seconds = 5.0);

  void start(int64_t total_requests);
  // After each engine step.
  void step(const EngineStats& stats, const BatchEngine::Progress& progress);
  // Clears the live line before other text is printed.
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  std::FILE* out_;
  bool live_;
  double log_seconds_;
  int64_t total_ = 0;
  Clock::time_point started_, last_print_;
  bool line_shown_ = false;
};

}  // namespace sluice
