#include "runtime/planner/profiler.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/direct_reader.h"
#include "io/staged_output.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/bench.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels_revision.h"
#include "runtime/hardware_probe.h"

namespace sluice {
namespace {

std::string first_match(const char* file, const std::string& prefix) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, prefix.size(), prefix) == 0) {
      auto colon = line.find(':');
      std::string v = colon == std::string::npos ? "" : line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

GpuProfiler& gpu_profiler() {
  static GpuProfiler profiler;
  return profiler;
}

// Best time per call of `run` (warmed up; at least 3 calls and `min_seconds` in all).
template <typename F>
double best_seconds(F&& run, double min_seconds) {
  run();
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; ++rep) {
    auto t = Clock::now();
    run();
    const double s = seconds_since(t);
    best = std::min(best, s);
    total += s;
  }
  return best;
}

}  // namespace

// Several copies of W, together larger than the L3, are used in turn so every call streams its
// weights from DRAM, as the engine's GEMMs do (a step reads every layer's weights once, far
// more than any cache).
GemmCurve measure_gemm_curve(const std::string& name, int64_t n, int64_t k, bool f32_activations,
                             const std::vector<int64_t>& ms) {
  const size_t w_elems = size_t(n * k);
  const size_t copies = std::max<size_t>(2, (size_t(600) << 20) / (2 * w_elems) + 1);
  std::vector<uint16_t> w(w_elems * copies);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  const int64_t max_m = ms.back();
  std::vector<float> xf(size_t(max_m * k)), y(size_t(max_m * n));
  std::vector<uint16_t> xb(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = float(int(i % 251) - 125) / 128.0f;
    xb[i] = f32_to_bf16(xf[i]);
  }
  GemmCurve curve{name, f32_activations ? "f32" : "bf16", n, k, {}};
  size_t call = 0;
  for (int64_t m : ms) {
    auto run = [&] {
      const uint16_t* wc = w.data() + (call++ % copies) * w_elems;
      if (f32_activations) {
        cpu::gemm_f32({m, n, k, xf.data(), wc, y.data(), 0.0f});
      } else {
        cpu::GemmArgs a;
        a.m = m, a.n = n, a.k = k, a.x = xb.data(), a.x_dtype = DType::BF16, a.w = wc;
        a.y = y.data();
        cpu::gemm(a);
      }
    };
    curve.points.push_back({m, best_seconds(run, 0.15)});
  }
  // More rows never take less time (a smaller GEMM could run as the larger one), so a point
  // slower than a later one is noise from other load: keep the later, faster time.
  for (size_t i = curve.points.size() - 1; i-- > 0;)
    curve.points[i].seconds = std::min(curve.points[i].seconds, curve.points[i + 1].seconds);
  return curve;
}

namespace {

// The int8 and int4 GEMMs' speedups over the bf16 one at each of `ms` rows of one n × k weight.
void add_quant_gemm_speedups(const std::vector<int64_t>& ms, int64_t n, int64_t k,
                             QuantGemmSpeedups& out) {
  constexpr int64_t group = 128;
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<uint16_t> w(size_t(n * k)), x(size_t(max_m * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(float(int(i % 251) - 125) / 128.0f);
  std::vector<float> y(size_t(max_m * n));
  const cpu::QuantWeights q8 =
      cpu::quantize_weights(cpu::QuantFormat::kInt8, w.data(), n, k, group);
  const cpu::QuantWeights q4 =
      cpu::quantize_weights(cpu::QuantFormat::kInt4, w.data(), n, k, group);
  for (const int64_t m : ms) {
    cpu::GemmArgs a;
    a.m = m, a.n = n, a.k = k, a.x = x.data(), a.x_dtype = DType::BF16, a.w = w.data();
    a.y = y.data();
    auto quant = [&](const cpu::QuantWeights& q) {
      cpu::gemm_int8({.m = m, .x = x.data(), .x_dtype = DType::BF16, .w = &q, .y = y.data()});
    };
    // The three GEMMs in turn, the best time of each over the rounds: the speedups are ratios,
    // and timed one after the other, whatever else ran during one of them skews its ratio. On a
    // 2-core Milan VM (2026-12-06), timed apart at the start of a run right after an 11 GB model
    // had been written, they read int8 2.52× and int4 4.07×, where quiet runs give 1.11× and
    // 1.84×; the planner, cached with them, predicted int8 decode at 78.8 tokens/s against 53.6.
    double bf16 = 1e30, int8 = 1e30, int4 = 1e30;
    for (int round = 0; round < 5; ++round) {
      bf16 = std::min(bf16, best_seconds([&] { cpu::gemm(a); }, 0.02));
      int8 = std::min(int8, best_seconds([&] { quant(q8); }, 0.02));
      int4 = std::min(int4, best_seconds([&] { quant(q4); }, 0.02));
    }
    out.points.push_back({m, bf16 / int8, bf16 / int4});
  }
}

// SiLU·mul over three 8 MiB buffers, warm in cache as the engine's reused step buffers are:
// the rate of the engine's small elementwise passes (norms, RoPE, gather, scatter-add).
double measure_elementwise_bandwidth() {
  const int64_t n = int64_t(2) << 20;
  std::vector<float> a(static_cast<size_t>(n), 0.5f), b(a.size(), 0.25f), out(a.size());
  const double s = best_seconds([&] { cpu::silu_mul(a.data(), b.data(), out.data(), n); }, 0.05);
  return 3.0 * 4.0 * double(n) / s;
}

}  // namespace

QuantGemmSpeedups measure_quant_gemm_speedups() {
  QuantGemmSpeedups s;
  add_quant_gemm_speedups({16, 17, 32}, 14336, 4096, s);
  add_quant_gemm_speedups({128}, 1024, 4096, s);
  return s;
}

std::string MachineIdentity::key() const {
  // FNV-1a: stable across runs and builds (std::hash is not guaranteed to be).
  const std::string text = fmt::format("{}|{}|{}|{}", cpu_model, cores, memory_bytes, hostname);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

MachineIdentity this_machine() {
  MachineIdentity m;
  m.cpu_model = cpu::cpu_model_name();
  m.cores = omp_get_num_procs();
  const std::string total = first_match("/proc/meminfo", "MemTotal");
  m.memory_bytes = total.empty() ? 0 : std::stoull(total) * 1024;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  m.hostname = host;
  return m;
}

std::filesystem::path cache_directory() {
  std::filesystem::path dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    dir = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    dir = std::filesystem::path(home) / ".cache";
  else
    fail("profile cache: environment: expected XDG_CACHE_HOME or HOME to be set, got neither");
  dir /= "sluice";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("profile cache: {}: could not create the directory: {}", dir.string(), ec.message());
  return dir;
}

std::filesystem::path profile_cache_path(const MachineIdentity& machine, int threads) {
  const std::string suffix =
      threads <= 0 || threads == machine.cores ? "" : fmt::format("-t{}", threads);
  return cache_directory() / fmt::format("profile-{}-{}{}.json", machine.key(),
                                         cpu::isa_name(cpu::isa_level()), suffix);
}

namespace {

// The disk tier reads whole expert matrices (MBs each), up to 32 in flight.
constexpr size_t kDiskProbeChunk = size_t(4) << 20;
constexpr int kDiskProbeDepth = 16;

}  // namespace

std::optional<double> measure_file_read_bandwidth(const std::filesystem::path& file, size_t bytes,
                                                  std::string* why) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(file, ec);
  const size_t chunks = std::min<size_t>(bytes, ec ? 0 : size) / kDiskProbeChunk;
  if (chunks == 0) {
    if (why)
      *why =
          fmt::format("{} is smaller than one {} MiB read", file.string(), kDiskProbeChunk >> 20);
    return std::nullopt;
  }
  std::vector<FileRead> reads(chunks);
  for (size_t i = 0; i < chunks; ++i) reads[i] = {0, i * kDiskProbeChunk, kDiskProbeChunk};
  return measure_read_rate({file}, std::move(reads), kDiskProbeDepth, 1, why);
}

std::optional<double> measure_disk_read_bandwidth(const std::filesystem::path& dir, size_t bytes,
                                                  std::string* why) {
  const std::filesystem::path file = dir / fmt::format("disk-probe-{}.tmp", getpid());
  bytes = (bytes + kDiskProbeChunk - 1) / kDiskProbeChunk * kDiskProbeChunk;
  std::vector<char> chunk(kDiskProbeChunk);
  for (size_t i = 0; i < kDiskProbeChunk; ++i) chunk[i] = char(i * 131);
  struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } remove_after{file};
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    if (why) *why = fmt::format("cannot create {}", file.string());
    return std::nullopt;
  }
  for (size_t done = 0; done < bytes; done += kDiskProbeChunk)
    if (::write(fd, chunk.data(), kDiskProbeChunk) != ssize_t(kDiskProbeChunk)) {
      ::close(fd);
      if (why) *why = fmt::format("cannot write {}", file.string());
      return std::nullopt;
    }
  ::fsync(fd);
  ::close(fd);
  return measure_file_read_bandwidth(file, bytes, why);
}

void set_gpu_profiler(GpuProfiler profiler) {
  gpu_profiler() = std::move(profiler);
}

std::optional<GpuProfile> measure_gpu() {
  return gpu_profiler() ? gpu_profiler()() : std::nullopt;
}

HardwareProfile measure_profile(const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& what) {
    if (progress) progress(what);
  };
  const MachineIdentity machine = this_machine();
  HardwareProfile p;
  p.machine_key = machine.key();
  p.cpu_model = machine.cpu_model;
  p.isa_level = cpu::isa_name(cpu::isa_level());
  p.cores = machine.cores;
  p.threads = omp_get_max_threads();
  p.memory_bytes = machine.memory_bytes;
  p.source = "measured";
  p.kernels_revision = cpu::kKernelsRevision;
  say("DRAM read bandwidth");
  p.dram_bytes_per_s = measure_dram_bandwidth();
  say(fmt::format("instruction peaks at ISA level {} (fp32 FMA, bf16, int8)", p.isa_level));
  p.instructions = measure_instruction_ceilings();
  say("bf16 GEMM peak");
  p.gemm_peak_flops = measure_gemm_peak();
  say("int8 and int4 GEMMs against the bf16 one (m = 16, 17, 32 and 128)");
  p.quant_gemm = measure_quant_gemm_speedups();
  say("kernel call overhead");
  p.call_overhead_seconds = measure_call_overhead();
  say("disk sequential read (O_DIRECT, 512 MiB temporary file)");
  std::string why;
  p.disk_bytes_per_s =
      measure_disk_read_bandwidth(cache_directory(), size_t(512) << 20, &why).value_or(0);
  if (p.disk_bytes_per_s == 0) say("  disk not measured: " + why);
  // m up to 1024: past ~128 rows the GEMM is compute bound and its rate nearly flat, but not
  // quite (5% lower at 1024 than at 256 here), and that difference decides the prefill chunk.
  // 12, 17, 24 and 33: where the avx512bf16 GEMM changes tiles or starts a new block of 16 rows
  // (engine_plan.cpp's kQuickSmallM says why that matters to decode).
  const std::vector<int64_t> ms = {1, 2, 4, 8, 12, 16, 17, 24, 32, 33, 64, 128, 256, 1024};
  const std::vector<int64_t> ms_f32 = {1, 4, 16, 64};  // gemm_f32 is slow: ~5 GFLOP/s
  say("GEMM time versus m, expert shape 14336x4096, bf16 activations");
  p.cpu_gemm.push_back(measure_gemm_curve("expert", 14336, 4096, false, ms));
  // The down projection has the expert's weight size but a long k, which oneDNN blocks
  // differently: measured on its own.
  say("GEMM time versus m, expert down shape 4096x14336, bf16 activations");
  p.cpu_gemm.push_back(measure_gemm_curve("expert_down", 4096, 14336, false, ms));
  say("GEMM time versus m, attention shape 4096x4096, bf16 activations");
  p.cpu_gemm.push_back(measure_gemm_curve("attention", 4096, 4096, false, ms));
  say("GEMM time versus m, expert shape, fp32 activations (gemm_f32)");
  p.cpu_gemm.push_back(measure_gemm_curve("expert", 14336, 4096, true, ms_f32));
  say("GEMM time versus m, attention shape, fp32 activations (gemm_f32)");
  p.cpu_gemm.push_back(measure_gemm_curve("attention", 4096, 4096, true, ms_f32));
  say("paged attention (decode: bandwidth; prefill: FLOP/s)");
  cpu::AttentionBenchShape decode;
  decode.batch = 64;
  decode.context = 1024;
  p.attention_bytes_per_s = cpu::bench_attention(decode, 0.1).byte_rate();
  cpu::AttentionBenchShape prefill;
  prefill.batch = 4;
  prefill.context = 512;
  prefill.n_q = 128;
  p.attention_flops = cpu::bench_attention(prefill, 0.1).flop_rate();
  say("elementwise passes (SiLU·mul)");
  p.elementwise_bytes_per_s = measure_elementwise_bandwidth();
  if (gpu_profiler()) {
    say("GPU (PCIe copies, device memory, cuBLASLt GEMM curves)");
    p.gpu = measure_gpu();
  }
  return p;
}

std::optional<HardwareProfile> load_cached_profile(int threads) {
  const std::filesystem::path path = profile_cache_path(this_machine(), threads);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail(
        "{}: expected the JSON profile written by `sluice profile`, got a parse error ({}); "
        "run `sluice profile --refresh`",
        path.string(), e.what());
  }
  HardwareProfile p = profile_from_json(j, path.string());
  if (p.kernels_revision != cpu::kKernelsRevision) {
    fmt::print(stderr,
               "planner: {} was measured with an older build's kernels; it is not used (`sluice "
               "profile` measures this one's)\n",
               path.string());
    return std::nullopt;
  }
  return p;
}

void write_cache_file(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path, text);  // a reader never sees half a profile
}

void save_profile(const HardwareProfile& profile) {
  write_cache_file(profile_cache_path(this_machine(), profile.threads),
                   to_json(profile).dump(2) + "\n");
}

}  // namespace sluice
