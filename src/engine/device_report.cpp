#include "engine/device_report.h"

#include <fmt/format.h>

#include "core/units.h"

namespace sluice {

namespace {
double ratio(double a, double b) {
  return b > 0 ? a / b : 0;
}
}  // namespace

DeviceReport device_report(const EngineStats& s, double wall_seconds,
                           double reference_h2d_bytes_per_s, const std::string& reference_source) {
  DeviceReport r;
  r.reference_h2d_bytes_per_s = reference_h2d_bytes_per_s;
  r.reference_source = reference_source;
  r.h2d_bytes = s.device_bytes_to_device;
  r.d2h_bytes = s.device_bytes_to_host;
  r.weight_bytes = s.device_weight_bytes;
  r.weight_copy_bytes_per_s = ratio(s.device_weight_bytes, s.device_weights_busy_seconds);
  r.h2d_fraction = ratio(r.weight_copy_bytes_per_s, reference_h2d_bytes_per_s);
  r.h2d_run_bytes_per_s = ratio(s.device_bytes_to_device, wall_seconds);
  r.link_busy_fraction = ratio(s.device_weights_busy_seconds, wall_seconds);
  r.gpu_busy_fraction = ratio(s.device_compute_busy_seconds, wall_seconds);
  r.pinned_weight_bytes = double(s.device_pinned_weight_bytes);
  r.decode_steps = s.decode_only_steps;
  r.decode_weight_bytes_per_step =
      ratio(s.decode_only_device_weight_bytes, double(s.decode_only_steps));
  r.decode_tokens_per_step = ratio(double(s.decode_only_tokens), double(s.decode_only_steps));
  r.decode_tokens_per_s = ratio(double(s.decode_only_tokens), s.decode_only_seconds);
  if (r.decode_weight_bytes_per_step > 0 && reference_h2d_bytes_per_s > 0) {
    const double step_seconds = r.decode_weight_bytes_per_step / reference_h2d_bytes_per_s;
    r.decode_bound_tokens_per_s = r.decode_tokens_per_step / step_seconds;
    r.decode_bound_fraction = r.decode_tokens_per_s / r.decode_bound_tokens_per_s;
  }
  r.prefill_weight_bytes = s.device_weight_bytes - s.decode_only_device_weight_bytes;
  r.prefill_step_seconds = s.prompt_step_seconds();
  r.prefill_bound_fraction =
      ratio(ratio(r.prefill_weight_bytes, reference_h2d_bytes_per_s), r.prefill_step_seconds);
  return r;
}

void print_device_report(const DeviceReport& r, const EngineStats& s, double wall_seconds) {
  fmt::print(
      "traffic    {} expert pages copied, {} host→device ({} of it expert weights), {} "
      "device→host; experts {} on the device, {} on the CPU; peak device memory {}; {} of "
      "streamed weights pinned\n",
      s.device_pages_copied, human_bytes(r.h2d_bytes), human_bytes(r.weight_bytes),
      human_bytes(r.d2h_bytes), s.device_gpu_experts, s.device_cpu_experts,
      human_bytes(double(s.device_peak_bytes)), human_bytes(r.pinned_weight_bytes));
  const int64_t wanted = s.device_pages_copied + s.device_pages_reused;
  fmt::print(
      "           device expert cache: {} of {} expert pages kept in the device's slots from an "
      "earlier step (hit rate {:.1f}%), {} not copied\n",
      s.device_pages_reused, wanted,
      wanted > 0 ? 100.0 * double(s.device_pages_reused) / double(wanted) : 0.0,
      human_bytes(s.device_bytes_reused));
  fmt::print(
      "PCIe       host→device {:.1f} GB/s while copying weights = {:.0f}% of the {} pinned H2D "
      "bandwidth {:.1f} GB/s; weights queue busy {:.0f}% of the run ({:.1f} GB/s averaged over "
      "{:.1f} s)\n",
      r.weight_copy_bytes_per_s / 1e9, 100 * r.h2d_fraction, r.reference_source,
      r.reference_h2d_bytes_per_s / 1e9, 100 * r.link_busy_fraction, r.h2d_run_bytes_per_s / 1e9,
      wall_seconds);
  fmt::print(
      "GPU        busy {:.0f}% of the run (compute queue {:.2f} s, transfer queue {:.2f} s, "
      "weights queue {:.2f} s)\n",
      100 * r.gpu_busy_fraction, s.device_compute_busy_seconds, s.device_transfer_busy_seconds,
      s.device_weights_busy_seconds);
  if (r.decode_bound_tokens_per_s > 0)
    fmt::print(
        "decode     bound {:.1f} tokens/s = B {:.0f} / ({} of experts per step / {:.1f} GB/s); "
        "reached {:.1f} tokens/s = {:.0f}% of it over {} decode-only steps\n",
        r.decode_bound_tokens_per_s, r.decode_tokens_per_step,
        human_bytes(r.decode_weight_bytes_per_step), r.reference_h2d_bytes_per_s / 1e9,
        r.decode_tokens_per_s, 100 * r.decode_bound_fraction, r.decode_steps);
  else
    fmt::print("decode     no decode-only step copied expert weights: no PCIe bound\n");
  if (r.prefill_weight_bytes > 0)
    fmt::print(
        "prefill    bound {:.2f} s = {} of experts copied by the steps with prompt tokens / {:.1f} "
        "GB/s; they took {:.2f} s = {:.0f}% of the link's speed\n",
        r.prefill_weight_bytes / r.reference_h2d_bytes_per_s, human_bytes(r.prefill_weight_bytes),
        r.reference_h2d_bytes_per_s / 1e9, r.prefill_step_seconds, 100 * r.prefill_bound_fraction);
}

void add_device_report(nlohmann::json& j, const DeviceReport& r, const EngineStats& s) {
  j["device_pages_copied"] = s.device_pages_copied;
  j["device_pages_reused"] = s.device_pages_reused;
  j["device_bytes_reused"] = s.device_bytes_reused;
  j["device_bytes_to_device"] = r.h2d_bytes;
  j["device_bytes_to_host"] = r.d2h_bytes;
  j["device_weight_bytes"] = r.weight_bytes;
  j["device_pinned_weight_bytes"] = r.pinned_weight_bytes;
  j["device_peak_bytes"] = s.device_peak_bytes;
  j["device_gpu_experts"] = s.device_gpu_experts;
  j["device_cpu_experts"] = s.device_cpu_experts;
  j["device_gpu_attention_rows"] = s.device_gpu_attention_rows;
  j["device_gpu_share_full"] = s.device_gpu_share_full;
  j["device_weights_busy_seconds"] = s.device_weights_busy_seconds;
  j["device_transfer_busy_seconds"] = s.device_transfer_busy_seconds;
  j["device_compute_busy_seconds"] = s.device_compute_busy_seconds;
  j["pcie_h2d_reference_bytes_per_s"] = r.reference_h2d_bytes_per_s;
  j["pcie_h2d_reference_source"] = r.reference_source;
  j["pcie_h2d_bytes_per_s"] = r.weight_copy_bytes_per_s;
  j["pcie_h2d_fraction"] = r.h2d_fraction;
  j["pcie_h2d_run_bytes_per_s"] = r.h2d_run_bytes_per_s;
  j["link_busy_fraction"] = r.link_busy_fraction;
  j["gpu_busy_fraction"] = r.gpu_busy_fraction;
  j["decode_only_steps"] = r.decode_steps;
  j["decode_weight_bytes_per_step"] = r.decode_weight_bytes_per_step;
  j["decode_tokens_per_step"] = r.decode_tokens_per_step;
  j["decode_only_tokens_per_s"] = r.decode_tokens_per_s;
  j["decode_bound_tokens_per_s"] = r.decode_bound_tokens_per_s;
  j["decode_bound_fraction"] = r.decode_bound_fraction;
  j["prefill_weight_bytes"] = r.prefill_weight_bytes;
  j["prefill_step_seconds"] = r.prefill_step_seconds;
  j["prefill_bound_fraction"] = r.prefill_bound_fraction;
}

}  // namespace sluice
