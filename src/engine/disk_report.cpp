#include "engine/disk_report.h"

#include <fmt/format.h>

#include "core/units.h"

namespace sluice {

namespace {

DiskReport::PhaseBound phase_bound(int64_t steps, double tokens, double seconds, double bytes,
                                   double disk_bytes_per_s) {
  DiskReport::PhaseBound b;
  if (steps <= 0) return b;
  b.bytes_per_step = bytes / double(steps);
  if (seconds > 0) b.tokens_per_s = tokens / seconds;
  if (disk_bytes_per_s > 0 && bytes > 0) b.bound_tokens_per_s = tokens * disk_bytes_per_s / bytes;
  if (b.bound_tokens_per_s > 0) b.bound_fraction = b.tokens_per_s / b.bound_tokens_per_s;
  return b;
}

void print_phase_bound(const char* phase, const DiskReport::PhaseBound& b) {
  if (b.bound_tokens_per_s <= 0) return;
  fmt::print(
      "           {} bound by the disk: {} read per step -> {:.1f} tokens/s; measured {:.1f} = "
      "{:.0f}% of it\n",
      phase, human_bytes(b.bytes_per_step), b.bound_tokens_per_s, b.tokens_per_s,
      100 * b.bound_fraction);
}

}  // namespace

DiskReport disk_report(const EngineStats& s, double wall, double profiled) {
  DiskReport r;
  const ExpertPoolStats& d = s.disk;
  r.profiled_bytes_per_s = profiled;
  r.read_bytes_per_s = d.read_bytes_per_s();
  if (profiled > 0) r.read_fraction = r.read_bytes_per_s / profiled;
  if (wall > 0) r.wait_fraction = d.wait_seconds / wall;
  if (wall > 0) r.busy_fraction = d.read_seconds / wall;
  r.decode = phase_bound(s.decode_only_steps, double(s.decode_only_tokens), s.decode_only_seconds,
                         s.decode_only_disk_bytes, profiled);
  r.prompt =
      phase_bound(s.steps - s.decode_only_steps,
                  double(s.prefill_tokens + s.decode_tokens - s.decode_only_tokens),
                  s.prompt_step_seconds(), d.bytes_read - s.decode_only_disk_bytes, profiled);
  return r;
}

void print_disk_report(const DiskReport& r, const EngineStats& s, int pool_experts) {
  const ExpertPoolStats& d = s.disk;
  fmt::print("disk       experts stay on disk, host page pool of {} experts ({}); {}\n",
             pool_experts, human_bytes(double(pool_experts) * d.expert_bytes), s.disk_reads);
  const std::string of_ceiling =
      r.profiled_bytes_per_s > 0
          ? fmt::format("{:.0f}% of the measured O_DIRECT read rate ({}/s)", 100 * r.read_fraction,
                        human_bytes(r.profiled_bytes_per_s))
          : std::string("no O_DIRECT read rate was measured to compare with");
  fmt::print(
      "           read {} ({} experts) at {}/s with reads in flight = {}; compute waited "
      "{:.2f} s on the disk ({:.0f}% of wall)\n",
      human_bytes(d.bytes_read), d.experts_read, human_bytes(r.read_bytes_per_s), of_ceiling,
      d.wait_seconds, 100 * r.wait_fraction);
  fmt::print(
      "           the disk was reading {:.0f}% of the wall time: the run's rate against the bound "
      "its reads at this run's own rate set\n",
      100 * r.busy_fraction);
  fmt::print(
      "           expert cache: hit rate {:.1f}% ({} of {} experts the router chose), {} "
      "not read; prefetch guesses {}, accuracy {:.1f}%\n",
      100 * d.hit_rate(), d.hits, d.demands, human_bytes(d.bytes_saved()), d.guesses,
      100 * d.prefetch_accuracy());
  print_phase_bound("steps with prompt tokens", r.prompt);
  print_phase_bound("decode-only steps", r.decode);
}

void add_disk_report(nlohmann::json& j, const DiskReport& r, const EngineStats& s) {
  const ExpertPoolStats& d = s.disk;
  j["disk"] = {{"reads", s.disk_reads},
               {"bytes_read", d.bytes_read},
               {"experts_read", d.experts_read},
               {"read_seconds", d.read_seconds},
               {"read_bytes_per_s", r.read_bytes_per_s},
               {"profiled_bytes_per_s", r.profiled_bytes_per_s},
               {"read_fraction_of_profiled", r.read_fraction},
               {"wait_seconds", d.wait_seconds},
               {"wait_fraction_of_wall", r.wait_fraction},
               {"busy_fraction_of_wall", r.busy_fraction},
               {"demands", d.demands},
               {"hits", d.hits},
               {"hit_rate", d.hit_rate()},
               {"bytes_saved", d.bytes_saved()},
               {"prefetch_guesses", d.guesses},
               {"prefetch_accuracy", d.prefetch_accuracy()},
               {"decode_bytes_per_step", r.decode.bytes_per_step},
               {"decode_bound_tokens_per_s", r.decode.bound_tokens_per_s},
               {"decode_bound_fraction", r.decode.bound_fraction},
               {"prompt_steps_bytes_per_step", r.prompt.bytes_per_step},
               {"prompt_steps_bound_tokens_per_s", r.prompt.bound_tokens_per_s},
               {"prompt_steps_bound_fraction", r.prompt.bound_fraction}};
}

}  // namespace sluice
