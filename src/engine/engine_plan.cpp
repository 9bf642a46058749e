#include "engine/engine_plan.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/throughput_report.h"
#include "io/direct_reader.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels_revision.h"
#include "runtime/hardware_probe.h"
#include "runtime/planner/planner.h"
#include "runtime/planner/profiler.h"
#include "runtime/scheduler.h"

namespace sluice {
namespace {

// Holds an exclusive flock on `path` for its lifetime: concurrent first runs measure once.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail("profile cache: {}: cannot open the lock file", path.string());
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) fail("profile cache: {}: cannot lock", path.string());
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

// Runs `measure` with `threads` OpenMP threads (0: every core), as the engine will run.
template <typename F>
auto with_threads(int threads, F measure) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
  auto result = measure();
  omp_set_num_threads(saved);
  return result;
}

// What the planner measures once per machine, level and thread count when there is no
// `sluice profile`: the ceilings, and the expert GEMM at a few small m, where GEMMs fall
// furthest below the roofline.
struct QuickMeasurements {
  Ceilings ceilings;
  GemmCurve small_m;
  QuantGemmSpeedups quant_gemm;
};
// Decode spreads its tokens over the experts binomially around its mean (16 at B = 64 on
// Mixtral, most experts between 8 and 24), and the avx512bf16 GEMM's cost is not a straight line
// there: blocks of 4 rows up to 12 rows (the 4 × 3 tiles from 5 to 12 when these were chosen),
// the lanes' blocks of 16 from 13, with leftover tiles for up to 12 rows past the last block
// (gemm_lanes.h). 17 and 32: with {1, 4, 16} alone, when
// 17 rows cost what 32 did, the plan read that step as a straight line and, on 2 Zen 4 cores
// (2026-12-07), predicted bf16 decode at 87–101 tokens/s against 73.6–78.5 measured. 8, 12 and 24:
// with the leftover tiles and {1, 4, 16, 17, 32}, it predicted 96.7 against 85.2.
const std::vector<int64_t> kQuickSmallM = {1, 4, 8, 12, 16, 17, 24, 32};

std::optional<QuickMeasurements> read_quick_measurements(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("kernels_revision", 0) != cpu::kKernelsRevision) return std::nullopt;
    const QuickMeasurements q{
        {j.at("dram_bytes_per_s").get<double>(), j.at("gemm_flops").get<double>(),
         j.at("call_seconds").get<double>(),
         instruction_ceilings_from_json(j.at("instruction_ceilings"), path.string())},
        gemm_curve_from_json(j.at("small_m_gemm"), path.string()),
        quant_gemm_speedups_from_json(j.at("quant_gemm_speedups"), path.string())};
    const Ceilings& c = q.ceilings;
    // Sampled at other m (by an older sluice of the same kernels): measured again.
    std::vector<int64_t> sampled;
    for (const GemmCurve::Point& point : q.small_m.points) sampled.push_back(point.m);
    if (c.dram_bytes_per_s > 0 && c.gemm_flops > 0 && c.call_seconds > 0 &&
        c.instructions.measured() && !q.quant_gemm.points.empty() && sampled == kQuickSmallM)
      return q;
  } catch (const std::exception&) {  // a JSON error, or the Error of a bad field
  }
  return std::nullopt;  // unreadable, incomplete or measured by older kernels: measured again
}

// Where a quick measurement named `prefix` is cached: beside this machine's profile.
std::filesystem::path quick_cache_path(const std::string& prefix, int threads) {
  std::filesystem::path path = profile_cache_path(this_machine(), threads);
  path.replace_filename(prefix + path.filename().string());
  return path;
}

QuickMeasurements cached_quick_measurements(int threads) {
  const std::filesystem::path path = quick_cache_path("quick-", threads);
  FileLock lock(path.string() + ".lock");
  if (std::optional<QuickMeasurements> cached = read_quick_measurements(path)) return *cached;
  fmt::print(stderr,
             "planner: measuring this machine's DRAM bandwidth, GEMM peak, instruction peaks, "
             "small-m expert GEMMs and the int8/int4 GEMMs once, for {} (`sluice profile` "
             "measures it fully)\n",
             path.string());
  const QuickMeasurements measured = with_threads(threads, [] {
    return QuickMeasurements{measure_ceilings(),
                             measure_gemm_curve("expert", 14336, 4096, false, kQuickSmallM),
                             measure_quant_gemm_speedups()};
  });
  const Ceilings& c = measured.ceilings;
  write_cache_file(path, nlohmann::json{{"kernels_revision", cpu::kKernelsRevision},
                                        {"dram_bytes_per_s", c.dram_bytes_per_s},
                                        {"gemm_flops", c.gemm_flops},
                                        {"call_seconds", c.call_seconds},
                                        {"instruction_ceilings", to_json(c.instructions)},
                                        {"small_m_gemm", to_json(measured.small_m)},
                                        {"quant_gemm_speedups", to_json(measured.quant_gemm)}}
                                 .dump() +
                             "\n");
  return measured;
}

// The GPU half for a profile without one, on a machine with a usable GPU: measured once (a few
// seconds, by the registered GPU profiler, measure_gpu) and cached beside the quick ceilings, so
// that the default `--device auto` plans the GPU pipeline from the first run. nullopt without a
// usable GPU, or when the measurement fails (a warning says so, and the plan is the CPU
// engine's).
std::optional<GpuProfile> cached_quick_gpu_profile() {
  if (resolve_device_kind(DeviceKind::kAuto) != DeviceKind::kCuda) return std::nullopt;
  const std::filesystem::path path = quick_cache_path("quick-gpu-", 0);
  FileLock lock(path.string() + ".lock");
  if (std::ifstream in(path); in) {
    try {
      if (HardwareProfile cached = profile_from_json(nlohmann::json::parse(in), path.string());
          cached.gpu)
        return cached.gpu;
    } catch (const std::exception&) {  // unreadable: measured again and rewritten
    }
  }
  fmt::print(stderr,
             "planner: measuring this machine's GPU once, for {} (`sluice profile` "
             "measures the whole machine)\n",
             path.string());
  std::optional<GpuProfile> measured;
  try {
    measured = measure_gpu();
  } catch (const std::exception& e) {
    fmt::print(stderr, "warning: measuring the GPU failed ({}); planning for the CPU engine\n",
               e.what());
    return std::nullopt;
  }
  if (measured) {
    HardwareProfile holder;
    holder.source = "quick GPU";
    holder.gpu = measured;
    write_cache_file(path, to_json(holder).dump() + "\n");
  }
  return measured;
}

}  // namespace

HardwareProfile planner_profile(int threads) {
  HardwareProfile p;
  if (std::optional<HardwareProfile> cached = load_cached_profile(threads)) {
    p = *cached;
    // Profiles cached before the call overhead was measured: measure it now (a few ms).
    if (p.call_overhead_seconds <= 0)
      p.call_overhead_seconds = with_threads(threads, measure_call_overhead);
  } else {
    const QuickMeasurements q = cached_quick_measurements(threads);
    const Ceilings& c = q.ceilings;
    p = quick_profile(c.dram_bytes_per_s, c.gemm_flops, c.call_seconds, q.small_m);
    const MachineIdentity machine = this_machine();
    p.machine_key = machine.key();
    p.cpu_model = machine.cpu_model;
    p.isa_level = cpu::isa_name(cpu::isa_level());
    p.cores = machine.cores;
    p.threads = threads > 0 ? threads : machine.cores;
    p.memory_bytes = machine.memory_bytes;
    p.instructions = c.instructions;
    p.quant_gemm = q.quant_gemm;
    p.kernels_revision = cpu::kKernelsRevision;
  }
  if (!p.gpu) p.gpu = cached_quick_gpu_profile();
  return p;
}

namespace {

// The pieces the expert disk probe reads: whole experts (their matrices and scales), every
// 7919th of all experts in (layer, expert) order (a prime stride, so they spread over the layers
// and files as the router's choices do), until `bytes`, cut into reads of `piece` bytes.
std::vector<FileRange> expert_probe_pieces(const ExpertFiles& files, size_t bytes, size_t piece) {
  std::vector<const ExpertSource*> experts;
  for (const auto& layer : files.layers)
    for (const ExpertSource& e : layer) experts.push_back(&e);
  std::vector<FileRange> pieces;
  size_t taken = 0;
  for (size_t i = 0; i < experts.size() && taken < bytes; ++i) {
    const ExpertSource& e = *experts[i * 7919 % experts.size()];
    for (const auto* ranges : {&e.weights, &e.scales})
      for (const FileRange& r : *ranges)
        for (size_t at = 0; at < r.bytes; at += piece) {
          pieces.push_back({r.file, r.offset + at, std::min(piece, r.bytes - at)});
          taken += pieces.back().bytes;
        }
  }
  return pieces;
}

}  // namespace

std::optional<double> measure_expert_disk(const ExpertFiles& files, std::string* why) {
  constexpr size_t kPiece = size_t(4) << 20, kBytes = size_t(512) << 20;
  constexpr int kDepth = 32;  // the pool's reads in flight
  const std::vector<FileRange> pieces = expert_probe_pieces(files, kBytes, kPiece);
  if (pieces.empty()) {
    if (why) *why = "the model has no routed experts on disk";
    return std::nullopt;
  }
  std::vector<FileRead> reads;
  for (const FileRange& p : pieces) reads.push_back({p.file, p.offset, p.bytes});
  // Until two passes agree, up to four: the tier reads each expert many times, and its sustained
  // rate is wanted. On the development VM a first pass often ran at 70-80% of the run's own reads
  // (its host caches what was read); under a read throttle (a cgroup's 600 MiB/s) it ran at
  // 720-750 MiB/s, a burst let through after idling, where the run's reads went at 600.
  return measure_read_rate(files.files, std::move(reads), kDepth, 4, why);
}

double probe_expert_disk(const ExpertFiles& files) {
  std::string why;
  const std::optional<double> rate = measure_expert_disk(files, &why);
  if (!rate) fmt::print(stderr, "note: the disk's read rate was not measured: {}\n", why);
  return rate.value_or(0);
}

HardwareProfile planner_profile(int threads, const ExpertFiles* on_disk) {
  HardwareProfile p = planner_profile(threads);
  if (!on_disk || on_disk->files.empty()) return p;
  static std::mutex mutex;
  static std::map<std::vector<std::filesystem::path>, double> probed;
  std::lock_guard lock(mutex);
  auto it = probed.find(on_disk->files);
  if (it == probed.end()) it = probed.emplace(on_disk->files, probe_expert_disk(*on_disk)).first;
  if (it->second > 0) p.disk_bytes_per_s = it->second;
  return p;
}

std::string EnginePlan::describe() const {
  return fmt::format(
      "{}{} (planned with the {} profile: predicted prefill {:.1f}, decode {:.1f}, end to end "
      "{:.1f} tokens/s)",
      policy.describe(), offload.gpu ? " offload " + sluice::describe(offload) : "", profile_source,
      prediction.prefill_tokens_per_s(), prediction.decode_tokens_per_s(),
      prediction.total_tokens_per_s());
}

OffloadConstraints executor_constraints(const OffloadSettings& s) {
  OffloadConstraints fixed;
  if (s.cpu_attention_share >= 0) fixed.cpu_attention_share = s.cpu_attention_share;
  fixed.expert_matrix_pages = true;
  if (s.resident_expert_layers >= 0) fixed.resident_expert_layers = s.resident_expert_layers;
  if (s.page_slots > 0) fixed.prefetch_depth = std::max(1, s.page_slots / 3);
  if (s.cpu_expert_max_tokens > 0) fixed.cpu_expert_max_tokens = s.cpu_expert_max_tokens;
  if (s.cache_pages >= 0) fixed.cache_pages = s.cache_pages;
  return fixed;
}

EnginePlan plan_for_requests(const HardwareProfile& hw, const ModelConfig& c,
                             const Policy& requested, DeviceOptions& device,
                             const std::vector<Request>& requests, size_t host_memory_bytes) {
  // Requests that can never run with the KV blocks the user fixed (or with the context) do not
  // run at all: the engine fails them alone, so they are left out of the workload. With an
  // offload device the host cache and the device KV pool split kv_blocks, so no pool has more
  // (a request that fits kv_blocks but neither pool is still planned for, then failed alone).
  const bool fixed_kv = requested.kv_blocks > 0 && requested.kv_block_size > 0;
  const int64_t largest_pool = fixed_kv ? requested.kv_blocks : INT64_MAX;
  std::vector<WorkloadRequest> work;
  work.reserve(requests.size());
  for (const Request& r : requests)
    if (!never_runs(r, c.max_position_embeddings, std::max(1, requested.kv_block_size),
                    largest_pool))
      work.push_back({int(r.prompt.size()), r.max_new_tokens});
  // None can run: the engine only reports their failures, with the smallest policy of a
  // one-token request (planning the others would fail).
  if (work.empty()) work.push_back({1, 1});
  return plan_for_workload(hw, c, requested, device, work, host_memory_bytes);
}

EnginePlan plan_for_workload(const HardwareProfile& hw, const ModelConfig& c,
                             const Policy& requested, DeviceOptions& device,
                             const std::vector<WorkloadRequest>& work, size_t host_memory_bytes) {
  MemoryLimits limits{host_memory_bytes, 0, experts_stay_on_disk(c, host_memory_bytes)};
  device.kind = resolve_device_kind(device.kind);
  if (device.settings.resident_expert_layers > c.num_layers)
    fail(
        "--resident-expert-layers: expected at most the model's {} layers, "
        "got {}",
        c.num_layers, device.settings.resident_expert_layers);
  if (device.kind != DeviceKind::kCpu) {
    if (!hw.gpu) {
      if (device.kind == DeviceKind::kCuda)
        fmt::print(
            stderr,
            "warning: the hardware profile ({}) has no GPU section, so the policy is planned "
            "for the CPU engine; run `sluice profile --refresh` on this machine to plan the "
            "GPU pipeline\n",
            hw.source);
    } else {
      limits.gpu_bytes = device.gpu_mem.empty() ? size_t(0.9 * double(hw.gpu->memory_free_bytes))
                                                : parse_bytes(device.gpu_mem, "--gpu-mem");
    }
  }
  OffloadConstraints fixed = executor_constraints(device.settings);
  // The stand-in's "device" memory is the host's: it keeps no cache unless asked (as it runs).
  if (device.kind == DeviceKind::kStandin && !fixed.cache_pages) fixed.cache_pages = 0;
  const Plan plan = plan_policy(hw, c, requested, work, limits, fixed);
  const OffloadPlan& o = plan.chosen.offload;
  if (o.gpu) {
    // One expert is gate, up and down: 3 pages of one matrix each.
    if (device.settings.page_slots <= 0) device.settings.page_slots = 3 * o.prefetch_depth;
    if (device.settings.cpu_expert_max_tokens <= 0)
      device.settings.cpu_expert_max_tokens = o.cpu_expert_max_tokens;
    if (device.settings.cpu_attention_share < 0)
      device.settings.cpu_attention_share = o.cpu_attention_share;
    if (device.settings.resident_expert_layers < 0)
      device.settings.resident_expert_layers =
          o.resident_expert_layers < 0 ? c.num_layers : o.resident_expert_layers;
  }
  return {plan.chosen.policy, o, plan.chosen.prediction, hw.source};
}

EnginePlan plan_for_requests(const Model& m, const Policy& requested, DeviceOptions& device,
                             const std::vector<Request>& requests, size_t host_memory_bytes) {
  return plan_for_requests(planner_profile(requested.threads, m.expert_files.get()), m.config,
                           requested, device, requests, host_memory_bytes);
}

}  // namespace sluice
