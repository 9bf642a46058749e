// The offload executor's link and device figures of a run, as `sluice bench` prints them:
// what crossed PCIe and how fast against the machine's pinned host→device bandwidth, how busy
// the GPU was, and the decode bound that bandwidth sets.
//
// Decode bound: a pure-decode step must copy every expert page its tokens route to, so it cannot
// take less than (expert bytes copied per step) / (H2D bandwidth), and decode cannot exceed
//   bound = B_decode / (bytes per decode step / H2D bandwidth)
//         = decode tokens of those steps · H2D bandwidth / expert bytes they copied,
// measured over the steps with no prompt tokens. decode_bound_fraction is the decode rate of
// those steps (their tokens over their wall time, host work included) divided by the bound.
//
// Prefill bound: the steps with prompt tokens likewise cannot take less than the expert bytes
// they copied over the H2D bandwidth; prefill_bound_fraction is that time over the time they
// took (1.0: prefill ran at the link's speed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/batch_engine.h"

namespace sluice {

struct DeviceReport {
  double reference_h2d_bytes_per_s = 0;  // the pinned H2D bandwidth the fractions are against
  std::string reference_source;          // "profile" or "measured now"
  double h2d_bytes = 0, d2h_bytes = 0, weight_bytes = 0;
  double weight_copy_bytes_per_s = 0;  // expert bytes / seconds the weights queue was copying
  double h2d_fraction = 0;             // weight_copy_bytes_per_s / reference
  double h2d_run_bytes_per_s = 0;      // all host→device bytes / wall time
  double link_busy_fraction = 0;       // weights queue busy / wall
  double gpu_busy_fraction = 0;        // compute queue busy / wall
  double pinned_weight_bytes = 0;
  int64_t decode_steps = 0;                 // steps with no prompt tokens
  double decode_weight_bytes_per_step = 0;  // expert bytes copied per such step
  double decode_tokens_per_step = 0;        // B_decode
  double decode_tokens_per_s = 0;           // of those steps
  double decode_bound_tokens_per_s = 0;     // 0 when no decode step copied weights
  double decode_bound_fraction = 0;
  double prefill_weight_bytes = 0;  // expert bytes copied in the steps with prompt tokens
  double prefill_step_seconds = 0;  // the time those steps took
  double prefill_bound_fraction = 0;
};

DeviceReport device_report(const EngineStats& s, double wall_seconds,
                           double reference_h2d_bytes_per_s, const std::string& reference_source);
void print_device_report(const DeviceReport& r, const EngineStats& s, double wall_seconds);
void add_device_report(nlohmann::json& j, const DeviceReport& r, const EngineStats& s);

}  // namespace sluice
