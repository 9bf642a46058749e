// The disk tier's figures of a run, as `sluice bench` prints them: what was read from disk and
// how fast against the profiled O_DIRECT bandwidth, how long compute waited for it, what the
// expert cache saved, and the decode bound the disk sets.
//
// The disk's bound on a phase (the steps with no prompt tokens, and the steps with some): its
// steps must read every expert their tokens route to that the pool does not hold, so they cannot
// take less than (expert bytes they read) / (disk bandwidth), and
//   bound = tokens of those steps · disk bandwidth / expert bytes they read;
// bound_fraction is the phase's token rate divided by the bound.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"

namespace sluice {

struct DiskReport {
  double profiled_bytes_per_s = 0;  // the profile's O_DIRECT read bandwidth (0: not measured)
  double read_bytes_per_s = 0;      // bytes read / time with reads in flight
  double read_fraction = 0;         // read_bytes_per_s / profiled
  double wait_fraction = 0;         // compute waiting on the disk / wall time
  // Time with reads in flight / wall time: the run's rate against the bound the disk sets at the
  // rate it read in this run (all bytes read / that rate = the time reads were in flight), a
  // figure a probe taken apart from the run cannot skew (on a VM whose host caches the disk, the
  // probes and the run's reads often differ by 2x).
  double busy_fraction = 0;
  struct PhaseBound {
    double bytes_per_step = 0;
    double tokens_per_s = 0;
    double bound_tokens_per_s = 0;  // 0 without steps of the phase that read
    double bound_fraction = 0;
  };
  PhaseBound decode;  // the steps with no prompt tokens
  PhaseBound prompt;  // the steps with prompt tokens (and the decode tokens batched with them)
};

DiskReport disk_report(const EngineStats& s, double wall_seconds, double profiled_bytes_per_s);
void print_disk_report(const DiskReport& r, const EngineStats& s, int pool_experts);
void add_disk_report(nlohmann::json& j, const DiskReport& r, const EngineStats& s);

}  // namespace sluice
