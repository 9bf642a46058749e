// `sluice profile`: measures this machine for the planner (well under a minute) and caches the
// result as JSON under the user's cache directory, keyed by machine.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/planner/hardware_profile.h"

namespace sluice {

struct MachineIdentity {
  std::string cpu_model;
  int cores = 0;
  size_t memory_bytes = 0;
  std::string hostname;
  std::string key() const;  // 16 hex digits of a hash of all four
};
MachineIdentity this_machine();

// $XDG_CACHE_HOME/sluice, or ~/.cache/sluice; created if missing.
std::filesystem::path cache_directory();
// One profile per ISA level and thread count: "profile-<key>-<level>.json" for all cores,
// "profile-<key>-<level>-t<N>.json" for N threads (the engine's speed, and so every curve,
// depends on both; SLUICE_ISA=avx2 on an AVX-512 machine never reads the avx512 profile).
std::filesystem::path profile_cache_path(const MachineIdentity& machine, int threads);
// Replaces `path` with `text` at once (a temporary file of this process, then a rename), so
// readers, and other processes writing it too, never see half a file.
void write_cache_file(const std::filesystem::path& path, const std::string& text);

// Measures everything with the current OpenMP thread count; `progress` receives a line before
// each measurement.
HardwareProfile measure_profile(const std::function<void(const std::string&)>& progress = {});

// GEMM time versus m (increasing) for one weight shape, W bf16 streamed from DRAM: the best of
// at least 0.15 s at each m. bf16 activations through cpu::gemm, or fp32 through gemm_f32.
GemmCurve measure_gemm_curve(const std::string& name, int64_t n, int64_t k, bool f32_activations,
                             const std::vector<int64_t>& ms);

// The int8 and int4 GEMMs' speed against the bf16 GEMM's: at m = 16, 17 and 32 on a 14336 × 4096
// weight streamed from DRAM, and at m = 128 on one 1024 × 4096 weight (compute bound at every
// level); a second or two in all.
QuantGemmSpeedups measure_quant_gemm_speedups();

// Read bandwidth with O_DIRECT (so the page cache does not answer), 4 MiB reads in order with 16
// in flight through io_uring, as the disk tier reads, of a temporary file of `bytes` in `dir`,
// deleted afterwards; nullopt (with `why`) when O_DIRECT is refused.
std::optional<double> measure_disk_read_bandwidth(const std::filesystem::path& dir, size_t bytes,
                                                  std::string* why);
// The same read of the first `bytes` (whole 4 MiB reads) of an existing file: the disk the
// weights are on.
std::optional<double> measure_file_read_bandwidth(const std::filesystem::path& file, size_t bytes,
                                                  std::string* why);

// The GPU half of the profile comes from the CUDA backend, which registers its measuring
// function here; without one, profiles have no GPU section.
using GpuProfiler = std::function<std::optional<GpuProfile>()>;
void set_gpu_profiler(GpuProfiler profiler);
// The registered profiler's measurement; nullopt when none is registered or there is no GPU.
std::optional<GpuProfile> measure_gpu();

// The cached profile of this machine for `threads` OpenMP threads (0: all cores), if any.
std::optional<HardwareProfile> load_cached_profile(int threads = 0);
void save_profile(const HardwareProfile& profile);

}  // namespace sluice
