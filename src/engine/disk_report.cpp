#include "engine/disk_report.h"

#include <fmt/format.h>

#include "core/units.h"

namespace sluice {

DiskReport disk_report(const EngineStats& s, double wall, double profiled) {
  DiskReport r;
  const ExpertPoolStats& d = s.disk;
  r.profiled_bytes_per_s = profiled;
  r.read_bytes_per_s = d.read_bytes_per_s();
  if (profiled > 0) r.read_fraction = r.read_bytes_per_s / profiled;
  if (wall > 0) r.wait_fraction = d.wait_seconds / wall;
  if (s.decode_only_steps > 0) {
    r.decode_bytes_per_step = s.decode_only_disk_bytes / double(s.decode_only_steps);
    if (s.decode_only_seconds > 0)
      r.decode_tokens_per_s = double(s.decode_only_tokens) / s.decode_only_seconds;
    if (profiled > 0 && s.decode_only_disk_bytes > 0)
      r.decode_bound_tokens_per_s =
          double(s.decode_only_tokens) * profiled / s.decode_only_disk_bytes;
    if (r.decode_bound_tokens_per_s > 0)
      r.decode_bound_fraction = r.decode_tokens_per_s / r.decode_bound_tokens_per_s;
  }
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
      "           expert cache: hit rate {:.1f}% ({} of {} experts the router chose), {} "
      "not read; prefetch guesses {}, accuracy {:.1f}%\n",
      100 * d.hit_rate(), d.hits, d.demands, human_bytes(d.bytes_saved()), d.guesses,
      100 * d.prefetch_accuracy());
  if (r.decode_bound_tokens_per_s > 0)
    fmt::print(
        "           decode bound by the disk: {} read per decode step -> {:.1f} tokens/s; "
        "measured {:.1f} = {:.0f}% of it\n",
        human_bytes(r.decode_bytes_per_step), r.decode_bound_tokens_per_s, r.decode_tokens_per_s,
        100 * r.decode_bound_fraction);
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
               {"demands", d.demands},
               {"hits", d.hits},
               {"hit_rate", d.hit_rate()},
               {"bytes_saved", d.bytes_saved()},
               {"prefetch_guesses", d.guesses},
               {"prefetch_accuracy", d.prefetch_accuracy()},
               {"decode_bytes_per_step", r.decode_bytes_per_step},
               {"decode_bound_tokens_per_s", r.decode_bound_tokens_per_s},
               {"decode_bound_fraction", r.decode_bound_fraction}};
}

}  // namespace sluice
