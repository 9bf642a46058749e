// sluice bench: throughput of the batch engine on synthetic prompts, with the time split by
// stage and every rate shown as a fraction of this machine's measured ceilings (the roofline
// arithmetic is in engine/throughput_report.h and bench/RESULTS.md).
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/machine_report.h"
#include "cli/policy_options.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/batch_engine.h"
#include "engine/device_report.h"
#include "engine/disk_report.h"
#include "engine/engine_plan.h"
#include "engine/throughput_report.h"
#include "engine/weights_in_memory.h"
#include "kernels/cpu/isa.h"
#include "model/expert_quant.h"
#include "model/model_stats.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/memory_info.h"
#include "runtime/offload/device.h"
#include "runtime/planner/planner.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model_dir, preset;
  int layers = 0;
  int prompt_len = 128, gen_len = 32, requests = 64;
  bool ignore_eos = false, json = false;
  uint64_t seed = 0;
  std::string host_mem;
  Policy policy;
  DeviceOptions device;
};

// How the weights came into memory: the rate as a fraction of the profiled disk read rate where
// `sluice profile` measured one, else of DRAM bandwidth (weights already in the page cache).
std::string describe(const WeightsRead& r, double dram_bytes_per_s, double disk_bytes_per_s) {
  if (r.skipped) return " (larger than the memory available: read as the run needs them)";
  if (r.bytes == 0 || r.seconds <= 0) return "";
  const double rate = double(r.bytes) / r.seconds;
  const bool disk = disk_bytes_per_s > 0;
  std::string pages;
  if (r.mapped_bytes > 0) {
    pages = fmt::format("; {:.0f}% mapped in 2 MiB pages",
                        100.0 * double(r.mapped_in_huge_pages) / double(r.mapped_bytes));
  }
  if (r.reread_bytes > 0)
    pages += fmt::format(", {} read again into them", human_bytes(double(r.reread_bytes)));
  return fmt::format(" (weights read into memory in {:.1f} s, {:.2f} GB/s = {:.0f}% of {}{})",
                     r.seconds, rate / 1e9,
                     100 * rate / (disk ? disk_bytes_per_s : dram_bytes_per_s),
                     disk ? "the profiled disk read rate" : "DRAM", pages);
}

// The model under test: a folder (its first --layers layers) or a preset made in memory, with the
// weights read into memory where they fit; load_seconds counts both.
struct LoadedModel {
  Model model;
  WeightsRead read_in;
  double load_seconds = 0;
  std::optional<size_t> storage_bytes;  // read from storage by the load (page cache not counted)
};

// The whole load's reads from storage (quantizing or repacking experts included) as a rate
// against the profiled disk read rate: with a cold page cache, how near loading is to the disk.
std::string describe_storage_reads(const LoadedModel& l, double disk_bytes_per_s) {
  if (!l.storage_bytes || l.model.dir.empty() || l.load_seconds <= 0) return "";
  if (*l.storage_bytes == 0)
    return "; nothing read from storage (the files were in the page cache)";
  const double rate = double(*l.storage_bytes) / l.load_seconds;
  return fmt::format("; {} read from storage in the load, {:.2f} GB/s{}",
                     human_bytes(double(*l.storage_bytes)), rate / 1e9,
                     disk_bytes_per_s > 0
                         ? fmt::format(" = {:.0f}% of the profiled disk read rate {:.2f} GB/s",
                                       100 * rate / disk_bytes_per_s, disk_bytes_per_s / 1e9)
                         : "");
}

LoadedModel load_for_bench(const Options& o, const HostBudget& budget) {
  const auto t_load = Clock::now();
  const std::optional<size_t> read_before = storage_read_bytes();
  LoadedModel l;
  const ExpertQuant quant{o.policy.expert_dtype, o.policy.expert_group};
  if (o.preset.empty()) {
    l.model = load_model_for_run(o.model_dir, quant, budget, o.layers);
  } else {
    l.model = make_random_model(preset_config(o.preset, o.layers), o.seed);
    quantize_model_experts(l.model, quant);
  }
  l.read_in = read_weights_if_they_fit(l.model);
  l.load_seconds = seconds_since(t_load);
  const std::optional<size_t> read_after = storage_read_bytes();
  if (read_before && read_after) l.storage_bytes = *read_after - *read_before;
  return l;
}

std::vector<Request> synthetic_requests(const Options& o, const ModelConfig& c) {
  std::mt19937 rng(uint32_t(o.seed));
  std::uniform_int_distribution<int> token(3, c.vocab_size - 1);
  std::vector<Request> requests;
  for (int i = 0; i < o.requests; ++i) {
    Request r;
    r.id = i;
    for (int t = 0; t < o.prompt_len; ++t) r.prompt.push_back(token(rng));
    r.max_new_tokens = o.gen_len;
    r.stop_token_ids = c.eos_token_ids;
    r.ignore_eos = o.ignore_eos;
    requests.push_back(std::move(r));
  }
  return requests;
}

// The offload device, opened here rather than by the engine to measure its link first when the
// profile has no GPU section: the device fractions are against pinned H2D bandwidth.
struct BenchDevice {
  std::unique_ptr<OffloadBackend> backend;
  double h2d_reference = 0;
  std::string h2d_source;
};

BenchDevice open_bench_device(const DeviceOptions& device, const HardwareProfile& hw) {
  BenchDevice d;
  d.backend = open_offload_backend(device);
  if (!d.backend) return d;
  if (device.kind == DeviceKind::kCuda && hw.gpu && hw.gpu->h2d_pinned_bytes_per_s > 0) {
    d.h2d_reference = hw.gpu->h2d_pinned_bytes_per_s;
    d.h2d_source = "profiled";
  } else {
    d.h2d_reference = d.backend->device->measure_host_to_device(size_t(256) << 20, 3);
    d.h2d_source = "measured (3 x 256 MiB)";
  }
  return d;
}

// CPU time this process got, split between prefill and decode by each step's token mix as the
// engine splits wall time: on a machine shared with other work, cpu / (wall · threads) is the
// share of its cores the run really had.
class CpuShareMeter {
 public:
  void observe(const EngineStats& st) {
    const double now = cpu_seconds(), used = now - last_cpu_;
    const double dp = double(st.prefill_tokens - last_prefill_),
                 dd = double(st.decode_tokens - last_decode_);
    if (dp + dd > 0) prefill_cpu_ += used * dp / (dp + dd), decode_cpu_ += used * dd / (dp + dd);
    last_cpu_ = now, last_prefill_ = st.prefill_tokens, last_decode_ = st.decode_tokens;
  }
  double prefill_share(double seconds, int threads) const {
    return seconds > 0 ? prefill_cpu_ / (seconds * threads) : 0;
  }
  double decode_share(double seconds, int threads) const {
    return seconds > 0 ? decode_cpu_ / (seconds * threads) : 0;
  }

 private:
  static double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  }
  double prefill_cpu_ = 0, decode_cpu_ = 0, last_cpu_ = cpu_seconds();
  int64_t last_prefill_ = 0, last_decode_ = 0;
};

// Everything the reports print, gathered once the run is over.
struct BenchResult {
  const Options* o;
  const LoadedModel* loaded;
  const ModelStats* ms;
  const Ceilings* ceilings;
  const HardwareProfile* hw;
  const EnginePlan* plan;
  const Prediction* predicted;
  const BenchDevice* device;
  const EngineStats* stats;
  ThroughputReport report;
  double wall = 0, prefill_share = 0, decode_share = 0;
  size_t peak_rss = 0;
  // The resident set before the model was loaded (code, libraries, the runtime's pools); the
  // ceilings' probe buffers, freed by then, are not in peak_rss where the peak could be reset.
  size_t rss_before_load = 0;
  bool peak_reset = false;
  double profiled_disk = 0;  // the profile's disk read rate (the load is compared with it)
  // The experts' disk, probed before and after the run (0: not probed).
  std::pair<double, double> disk_probes = {0, 0};
};

void print_json(const BenchResult& b) {
  const Options& o = *b.o;
  const EngineStats& s = *b.stats;
  const Policy& policy = b.plan->policy;
  const std::string activations = policy.precision == Precision::kF32 ? "f32" : "bf16";
  nlohmann::json j = report_json(b.report, s, *b.ceilings);
  j["model"] = o.preset.empty() ? o.model_dir : o.preset;
  j["layers"] = b.loaded->model.config.num_layers;
  j["cpu_model"] = cpu::cpu_model_name();
  j["isa_level"] = cpu::isa_name(cpu::isa_level());
  j["load_seconds"] = b.loaded->load_seconds;
  j["weights_read_bytes"] = b.loaded->read_in.bytes;
  j["weights_read_seconds"] = b.loaded->read_in.seconds;
  j["weights_mapped_bytes"] = b.loaded->read_in.mapped_bytes;
  j["weights_mapped_in_huge_pages"] = b.loaded->read_in.mapped_in_huge_pages;
  j["weights_reread_bytes"] = b.loaded->read_in.reread_bytes;
  if (b.loaded->storage_bytes) j["load_storage_read_bytes"] = *b.loaded->storage_bytes;
  j["requests"] = o.requests;
  j["prompt_len"] = o.prompt_len;
  j["gen_len"] = o.gen_len;
  j["policy"] = policy.to_json();
  if (b.plan->offload.gpu) j["offload_plan"] = describe(b.plan->offload);
  j["predicted_prefill_tokens_per_s"] = b.predicted->prefill_tokens_per_s();
  j["predicted_decode_tokens_per_s"] = b.predicted->decode_tokens_per_s();
  j["predicted_total_tokens_per_s"] = b.predicted->total_tokens_per_s();
  j["prediction_profile"] = b.hw->source;
  j["cpu_share_prefill"] = b.prefill_share;
  j["cpu_share_decode"] = b.decode_share;
  j["profile_gemm_peak_flops"] = b.hw->gemm_peak_flops;
  j["profile_compute_ceiling_flops"] = b.hw->compute_ceiling_flops(activations);
  j["profile_dram_bytes_per_s"] = b.hw->dram_bytes_per_s;
  j["peak_resident_bytes"] = b.peak_rss;
  j["resident_before_load_bytes"] = b.rss_before_load;
  j["weights_bytes"] = b.ms->total_bytes;
  if (!s.disk_reads.empty()) {
    add_disk_report(j, disk_report(s, b.wall, b.hw->disk_bytes_per_s), s);
    j["disk"]["probe_bytes_per_s_before"] = b.disk_probes.first;
    j["disk"]["probe_bytes_per_s_after"] = b.disk_probes.second;
  }
  if (const auto& backend = b.device->backend) {
    j["device"] = backend->device->name();
    add_device_report(j, device_report(s, b.wall, b.device->h2d_reference, b.device->h2d_source),
                      s);
  }
  fmt::print("{}\n", j.dump());
}

void print_setup(const BenchResult& b) {
  const Options& o = *b.o;
  const Policy& policy = b.plan->policy;
  fmt::print("model      {} ({} layers), {} of weights, made/loaded in {:.1f} s{}{}\n",
             o.preset.empty() ? o.model_dir : o.preset, b.loaded->model.config.num_layers,
             human_bytes(double(b.ms->total_bytes)), b.loaded->load_seconds,
             describe(b.loaded->read_in, b.ceilings->dram_bytes_per_s, b.profiled_disk),
             describe_storage_reads(*b.loaded, b.profiled_disk));
  fmt::print("machine    {}\n", machine_description());
  const ThroughputReport& r = b.report;
  fmt::print(
      "ceilings   {} threads, measured now: DRAM {:.1f} GB/s, compute {:.1f} GFLOP/s ({}){}, "
      "sluice's bf16 GEMM {:.1f} GFLOP/s\n",
      policy.threads, b.ceilings->dram_bytes_per_s / 1e9, r.compute_ceiling_flops / 1e9,
      r.compute_ceiling_instruction.empty() ? "GEMM peak" : r.compute_ceiling_instruction,
      r.expert_ceiling_instruction == r.compute_ceiling_instruction
          ? ""
          : fmt::format(", experts' int8 {:.1f} GOP/s ({})", r.expert_ceiling_flops / 1e9,
                        r.expert_ceiling_instruction),
      b.ceilings->gemm_flops / 1e9);
  fmt::print("workload   {} requests, prompt {}, generate {}{}\n", o.requests, o.prompt_len,
             o.gen_len, o.ignore_eos ? " (EOS ignored)" : "");
  fmt::print("policy     {}{}\n\n", policy.describe(),
             b.plan->offload.gpu ? "\n           offload " + describe(b.plan->offload) : "");
}

void print_prediction_and_share(const BenchResult& b) {
  const ThroughputReport& r = b.report;
  const Prediction& p = *b.predicted;
  const HardwareProfile& hw = *b.hw;
  const Policy& policy = b.plan->policy;
  const std::string activations = policy.precision == Precision::kF32 ? "f32" : "bf16";
  fmt::print(
      "predicted  prefill {:.1f}, decode {:.1f}, end to end {:.1f} tokens/s ({} profile; "
      "measured/predicted {:.2f}, {:.2f}, {:.2f})\n",
      p.prefill_tokens_per_s(), p.decode_tokens_per_s(), p.total_tokens_per_s(), hw.source,
      r.prefill_tokens_per_s / p.prefill_tokens_per_s(),
      r.decode_tokens_per_s / p.decode_tokens_per_s(),
      r.total_tokens_per_s / p.total_tokens_per_s());
  fmt::print("cpu share  the run had {:.0f}% of {} core(s) in prefill, {:.0f}% in decode\n",
             100 * b.prefill_share, policy.threads, 100 * b.decode_share);
  const double compute_ratio = r.compute_ceiling_flops / hw.compute_ceiling_flops(activations);
  const double gemm_ratio = b.ceilings->gemm_flops / hw.gemm_peak_flops;
  const double dram_ratio = b.ceilings->dram_bytes_per_s / hw.dram_bytes_per_s;
  // Above the profile by a quarter or more: the profile, not this run, was measured under load.
  const bool profile_depressed = std::max({compute_ratio, gemm_ratio, dram_ratio}) > 1.25;
  fmt::print(
      "           ceilings now are {:.0f}% (compute), {:.0f}% (sluice's GEMM) and {:.0f}% (DRAM) "
      "of the profile's: {}\n",
      100 * compute_ratio, 100 * gemm_ratio, 100 * dram_ratio,
      profile_depressed ? "the profile was measured under load; `sluice profile` measures it again"
                        : "other load on the machine slows the measurement, not the prediction");
}

void print_memory(const BenchResult& b) {
  const EngineStats& s = *b.stats;
  // With the experts on disk: the resident weights and the page pool.
  const size_t weights_bytes = b.ms->total_bytes + size_t(b.plan->policy.pool_experts) *
                                                       expert_slot_bytes(b.loaded->model.config);
  // The CPU stand-in's "device" memory is the host's: it counts in the resident set too.
  const offload::Device* device = b.device->backend ? b.device->backend->device.get() : nullptr;
  const size_t device_bytes =
      device && device->memory_is_host() ? size_t(s.device_peak_bytes) : size_t(0);
  const size_t activations =
      host_memory_use(b.loaded->model.config, b.plan->policy, b.plan->offload).activations;
  const double memory_bound =
      double(weights_bytes + s.kv_cache_bytes + activations + device_bytes) * 1.10;
  // What the run added to the process it started in (code, libraries: not the model's).
  const double added = double(b.peak_rss) - double(std::min(b.rss_before_load, b.peak_rss));
  fmt::print(
      "memory     peak resident {}, {} above the {} before loading{}, vs weights {} + KV cache "
      "{} + activations {}{} (+10%: {}){}\n",
      human_bytes(double(b.peak_rss)), human_bytes(added), human_bytes(double(b.rss_before_load)),
      b.peak_reset ? "" : " (the peak includes the ceilings' probe buffers)",
      human_bytes(double(weights_bytes)), human_bytes(double(s.kv_cache_bytes)),
      human_bytes(double(activations)),
      device_bytes > 0
          ? fmt::format(" + the stand-in device's {}", human_bytes(double(device_bytes)))
          : "",
      human_bytes(memory_bound), added <= memory_bound ? "" : "  OVER BUDGET");
  // The use counts the device KV pool's blocks too (ω < 1); the bytes are the host cache's.
  fmt::print("KV cache   peak use {:.0f}% of the blocks (host cache {}{})\n", 100 * s.peak_kv_usage,
             human_bytes(double(s.kv_cache_bytes)),
             b.device->backend ? " and the device KV pool" : "");
}

void print_text(const BenchResult& b) {
  print_setup(b);
  print_report(b.report, *b.stats, *b.ceilings);
  print_prediction_and_share(b);
  print_memory(b);
  if (!b.stats->disk_reads.empty()) {
    print_disk_report(disk_report(*b.stats, b.wall, b.hw->disk_bytes_per_s), *b.stats,
                      b.plan->policy.pool_experts);
    const auto [before, after] = b.disk_probes;
    if (before > 0 || after > 0)
      fmt::print(
          "           the disk's read rate, probed reading whole experts: {}/s before the run, "
          "{}/s after; the bounds and the prediction use the faster\n",
          human_bytes(before), human_bytes(after));
  }
  if (const auto& backend = b.device->backend) {
    fmt::print("device     {}\n", backend->device->name());
    print_device_report(
        device_report(*b.stats, b.wall, b.device->h2d_reference, b.device->h2d_source), *b.stats,
        b.wall);
  }
}

// The policy the planner chooses for the workload (it fills the fields left at 0, see
// engine/engine_plan.h) and its prediction, printed beside the measurement. With the experts on
// disk, the planner and the disk's figures use the disk as the tier reads it, probed now.
struct BenchPlan {
  HardwareProfile hw;
  double profiled_disk = 0;  // the profile's disk read rate, before the probe replaced it
  double disk_before = 0;    // the experts' disk, probed before the run (0: not probed)
  std::vector<WorkloadRequest> work;
  DeviceOptions device;
  EnginePlan plan;
  Prediction predicted;
};

BenchPlan plan_bench(const Options& o, const LoadedModel& loaded, const HostBudget& budget) {
  BenchPlan b;
  const ModelConfig& c = loaded.model.config;
  b.hw = planner_profile(o.policy.threads);
  b.profiled_disk = b.hw.disk_bytes_per_s;
  if (loaded.model.expert_files) b.disk_before = probe_expert_disk(*loaded.model.expert_files);
  if (b.disk_before > 0) b.hw.disk_bytes_per_s = b.disk_before;
  b.work = uniform_workload(o.requests, o.prompt_len, o.gen_len);
  b.device = o.device;
  b.plan = plan_for_workload(b.hw, c, o.policy, b.device, b.work, budget.bytes);
  b.predicted = predict(b.hw, c, b.plan.policy, b.plan.offload, b.work);
  return b;
}

// A disk's rate moves (a VM's far more than its DRAM's): probed again after the run, the ceiling
// is the faster of the two readings, and the chosen policy's prediction is made again with it, as
// the disk bounds are. Returns the reading after the run (0: not probed).
double reprobe_disk(const LoadedModel& loaded, BenchPlan& b) {
  if (!loaded.model.expert_files) return 0;
  const double after = probe_expert_disk(*loaded.model.expert_files);
  if (after > b.hw.disk_bytes_per_s) {
    b.hw.disk_bytes_per_s = after;
    b.predicted = predict(b.hw, loaded.model.config, b.plan.policy, b.plan.offload, b.work);
  }
  return after;
}

struct EngineRun {
  EngineStats stats;
  double wall = 0;
  int64_t generated = 0;
  double prefill_share = 0, decode_share = 0;  // of the cores the run had, per phase
};

EngineRun run_workload(const Options& o, const LoadedModel& loaded, const BenchPlan& b,
                       const BenchDevice& device) {
  EngineDevice engine_device;
  if (device.backend)
    engine_device = {device.backend->device.get(), device.backend->math.get(), b.device.settings};
  const Policy& policy = b.plan.policy;
  BatchEngine engine(loaded.model, policy, engine_device);
  CpuShareMeter share;
  engine.set_step_observer(
      [&](const EngineStats& st, const BatchEngine::Progress&) { share.observe(st); });
  EngineRun r;
  const auto t0 = Clock::now();
  engine.run(synthetic_requests(o, loaded.model.config), [&](Completion&& done) {
    // Every request has the same shape: one that can never run means none can, and the
    // measurement would be of nothing.
    if (done.reason == FinishReason::kError)
      fail(
          "bench: request {} can never run: {}; lower --prompt-len or --gen-len, or raise "
          "--kv-blocks",
          done.id, done.error);
    r.generated += int64_t(done.tokens.size());
  });
  r.wall = seconds_since(t0);
  r.stats = engine.stats();
  r.prefill_share = share.prefill_share(r.stats.prefill_seconds, policy.threads);
  r.decode_share = share.decode_share(r.stats.decode_seconds, policy.threads);
  return r;
}

int run(Options o) {
  if (o.model_dir.empty() == o.preset.empty())
    fail("bench: give exactly one of --model or --preset");
  if (o.policy.threads > 0) omp_set_num_threads(o.policy.threads);
  const HostBudget budget = host_memory_budget(o.host_mem, true);  // before loading takes some
  if (!o.preset.empty())  // made whole in memory, in bf16 before its experts are quantized
    require_servable(preset_config(o.preset, o.layers), budget, "--preset " + o.preset,
                     "a model made in memory by --preset");
  // Measured first: the probe's buffers are freed before the model is made, so they do not
  // count towards the peak resident memory reported below.
  const Ceilings ceilings = measure_ceilings();
  const bool peak_reset = reset_peak_resident();
  const size_t rss_before_load = current_resident_bytes();
  const LoadedModel loaded = load_for_bench(o, budget);
  const ModelStats ms = model_stats(loaded.model);
  BenchPlan b = plan_bench(o, loaded, budget);
  omp_set_num_threads(b.plan.policy.threads);
  // The device's link probe (3 × 256 MiB, freed after) is left out of the peak as the ceilings'.
  const size_t load_peak = peak_resident_bytes();
  const BenchDevice device = open_bench_device(b.device, b.hw);
  if (peak_reset) reset_peak_resident();
  const EngineRun r = run_workload(o, loaded, b, device);
  const double disk_after = reprobe_disk(loaded, b);

  BenchResult result{
      &o,
      &loaded,
      &ms,
      &ceilings,
      &b.hw,
      &b.plan,
      &b.predicted,
      &device,
      &r.stats,
      summarize(r.stats, r.wall, int64_t(o.requests) * o.prompt_len, r.generated, ceilings,
                b.plan.policy.precision, loaded.model.config.expert_quant.dtype)};
  result.wall = r.wall;
  result.report.offloaded = device.backend != nullptr;
  result.prefill_share = r.prefill_share;
  result.decode_share = r.decode_share;
  result.peak_rss = std::max(load_peak, peak_resident_bytes());
  result.rss_before_load = rss_before_load;
  result.peak_reset = peak_reset;
  result.profiled_disk = b.profiled_disk;
  result.disk_probes = {b.disk_before, disk_after};
  o.json ? print_json(result) : print_text(result);
  return 0;
}

RegisterCommand reg(
    {"bench", "Measure batch throughput on synthetic prompts", [](CLI::App& sub) {
       auto o = std::make_shared<Options>();
       add_model_shape_options(sub, o->model_dir, o->preset, o->layers);
       add_workload_length_options(sub, o->prompt_len, o->gen_len);
       sub.add_option("--requests", o->requests, "Number of requests")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_flag("--ignore-eos", o->ignore_eos, "Generate exactly --gen-len tokens");
       sub.add_flag("--json", o->json, "Print one JSON object");
       sub.add_option("--seed", o->seed, "Seed of weights and prompts")->capture_default_str();
       add_policy_options(sub, o->policy);
       add_host_memory_option(sub, o->host_mem);
       add_device_options(sub, o->device);
       return std::function<int()>([o] { return run(*o); });
     }});

}  // namespace
}  // namespace sluice::cli
