// sluice bench: throughput of the batch engine on synthetic prompts, with the time split by
// stage and every rate shown as a fraction of this machine's measured ceilings (the roofline
// arithmetic is in engine/throughput_report.h and bench/RESULTS.md).
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/machine_report.h"
#include "cli/policy_options.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/batch_engine.h"
#include "engine/device_report.h"
#include "engine/engine_plan.h"
#include "engine/throughput_report.h"
#include "engine/weights_in_memory.h"
#include "kernels/cpu/isa.h"
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
  return fmt::format(" (weights read into memory in {:.1f} s, {:.2f} GB/s = {:.0f}% of {})",
                     r.seconds, rate / 1e9,
                     100 * rate / (disk ? disk_bytes_per_s : dram_bytes_per_s),
                     disk ? "the profiled disk read rate" : "DRAM");
}

int run(Options o) {
  if (o.model_dir.empty() == o.preset.empty())
    fail("bench: give exactly one of --model or --preset");
  if (o.policy.threads > 0) omp_set_num_threads(o.policy.threads);
  // Measured first: the probe's buffers are freed before the model is made, so they do not
  // count towards the peak resident memory reported below.
  const Ceilings ceilings = measure_ceilings();
  auto t_load = std::chrono::steady_clock::now();
  Model model = o.preset.empty() ? load_model(o.model_dir)
                                 : make_random_model(preset_config(o.preset, o.layers), o.seed);
  if (o.preset.empty() && o.layers > 0) {  // the first layers of a model folder
    if (o.layers > model.config.num_layers)
      fail("--layers {}: the model has {} layers", o.layers, model.config.num_layers);
    model.config.num_layers = o.layers;
    model.weights.layers.resize(size_t(o.layers));
  }
  const WeightsRead read_in = read_weights_if_they_fit(model);
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& c = model.config;
  const ModelStats ms = model_stats(model);

  // The planner fills the fields left at 0 (engine/engine_plan.h) and predicts the run, to print
  // beside the measurement.
  const HardwareProfile hw = planner_profile(o.policy.threads);
  const std::vector<WorkloadRequest> work = uniform_workload(o.requests, o.prompt_len, o.gen_len);
  DeviceOptions device = o.device;
  const EnginePlan plan =
      plan_for_workload(hw, c, o.policy, device, work, host_memory_bytes(o.host_mem, c));
  const Policy& policy = plan.policy;
  const Prediction predicted = predict(hw, c, policy, plan.offload, work);
  omp_set_num_threads(policy.threads);

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

  // The device is opened here rather than by the engine, to measure its link first when the
  // profile has no GPU section: the fractions below are against pinned H2D bandwidth.
  std::unique_ptr<OffloadBackend> backend = open_offload_backend(device);
  double h2d_reference = 0;
  std::string h2d_source;
  if (backend) {
    if (device.kind == DeviceKind::kCuda && hw.gpu && hw.gpu->h2d_pinned_bytes_per_s > 0) {
      h2d_reference = hw.gpu->h2d_pinned_bytes_per_s;
      h2d_source = "profiled";
    } else {
      h2d_reference = backend->device->measure_host_to_device(size_t(256) << 20, 3);
      h2d_source = "measured (3 x 256 MiB)";
    }
  }
  EngineDevice engine_device;
  if (backend) engine_device = {backend->device.get(), backend->math.get(), device.settings};
  BatchEngine engine(model, policy, engine_device);
  // CPU time this process got, split between prefill and decode by each step's token mix as the
  // engine splits wall time: on a machine shared with other work, cpu / (wall · threads) is the
  // share of its cores the run really had.
  auto cpu_seconds = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  double prefill_cpu = 0, decode_cpu = 0, last_cpu = cpu_seconds();
  int64_t last_prefill = 0, last_decode = 0;
  engine.set_step_observer([&](const EngineStats& st, const BatchEngine::Progress&) {
    const double now = cpu_seconds(), used = now - last_cpu;
    const double dp = double(st.prefill_tokens - last_prefill),
                 dd = double(st.decode_tokens - last_decode);
    if (dp + dd > 0) prefill_cpu += used * dp / (dp + dd), decode_cpu += used * dd / (dp + dd);
    last_cpu = now, last_prefill = st.prefill_tokens, last_decode = st.decode_tokens;
  });
  int64_t generated = 0;
  auto t0 = std::chrono::steady_clock::now();
  engine.run(std::move(requests), [&](Completion&& done) {
    // Every request has the same shape: one that can never run means none can, and the
    // measurement would be of nothing.
    if (done.reason == FinishReason::kError)
      fail(
          "bench: request {} can never run: {}; lower --prompt-len or --gen-len, or raise "
          "--kv-blocks",
          done.id, done.error);
    generated += int64_t(done.tokens.size());
  });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats& s = engine.stats();

  const int64_t prompt_tokens = int64_t(o.requests) * o.prompt_len;
  const ThroughputReport r =
      summarize(s, wall, prompt_tokens, generated, ceilings, policy.precision);
  const std::string activations = policy.precision == Precision::kF32 ? "f32" : "bf16";
  auto share = [&](double cpu, double seconds) {
    return seconds > 0 ? cpu / (seconds * policy.threads) : 0;
  };
  const double prefill_share = share(prefill_cpu, s.prefill_seconds);
  const double decode_share = share(decode_cpu, s.decode_seconds);
  const size_t weights_bytes = ms.total_bytes;
  const size_t peak_rss = peak_resident_bytes();
  const double memory_bound = double(weights_bytes + s.kv_cache_bytes) * 1.10;

  if (o.json) {
    nlohmann::json j = report_json(r, s, ceilings);
    j["model"] = o.preset.empty() ? o.model_dir : o.preset;
    j["layers"] = c.num_layers;
    j["cpu_model"] = cpu::cpu_model_name();
    j["isa_level"] = cpu::isa_name(cpu::isa_level());
    j["load_seconds"] = load_seconds;
    j["weights_read_bytes"] = read_in.bytes;
    j["weights_read_seconds"] = read_in.seconds;
    j["requests"] = o.requests;
    j["prompt_len"] = o.prompt_len;
    j["gen_len"] = o.gen_len;
    j["policy"] = policy.to_json();
    if (plan.offload.gpu) j["offload_plan"] = describe(plan.offload);
    j["predicted_prefill_tokens_per_s"] = predicted.prefill_tokens_per_s();
    j["predicted_decode_tokens_per_s"] = predicted.decode_tokens_per_s();
    j["predicted_total_tokens_per_s"] = predicted.total_tokens_per_s();
    j["prediction_profile"] = hw.source;
    j["cpu_share_prefill"] = prefill_share;
    j["cpu_share_decode"] = decode_share;
    j["profile_gemm_peak_flops"] = hw.gemm_peak_flops;
    j["profile_compute_ceiling_flops"] = hw.compute_ceiling_flops(activations);
    j["profile_dram_bytes_per_s"] = hw.dram_bytes_per_s;
    j["peak_resident_bytes"] = peak_rss;
    j["weights_bytes"] = weights_bytes;
    if (backend) {
      j["device"] = backend->device->name();
      add_device_report(j, device_report(s, wall, h2d_reference, h2d_source), s);
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("model      {} ({} layers), {} of weights, made/loaded in {:.1f} s{}\n",
             o.preset.empty() ? o.model_dir : o.preset, c.num_layers,
             human_bytes(double(weights_bytes)), load_seconds, describe(read_in, ceilings.dram_bytes_per_s, hw.disk_bytes_per_s));
  fmt::print("machine    {}\n", machine_description());
  fmt::print(
      "ceilings   {} threads, measured now: DRAM {:.1f} GB/s, compute {:.1f} GFLOP/s ({}), "
      "sluice's bf16 GEMM {:.1f} GFLOP/s\n",
      policy.threads, ceilings.dram_bytes_per_s / 1e9, r.compute_ceiling_flops / 1e9,
      r.compute_ceiling_instruction.empty() ? "GEMM peak" : r.compute_ceiling_instruction,
      ceilings.gemm_flops / 1e9);
  fmt::print("workload   {} requests, prompt {}, generate {}{}\n", o.requests, o.prompt_len,
             o.gen_len, o.ignore_eos ? " (EOS ignored)" : "");
  fmt::print("policy     {}{}\n\n", policy.describe(),
             plan.offload.gpu ? "\n           offload " + describe(plan.offload) : "");
  print_report(r, s, ceilings);
  fmt::print(
      "predicted  prefill {:.1f}, decode {:.1f}, end to end {:.1f} tokens/s ({} profile; "
      "measured/predicted {:.2f}, {:.2f}, {:.2f})\n",
      predicted.prefill_tokens_per_s(), predicted.decode_tokens_per_s(),
      predicted.total_tokens_per_s(), hw.source,
      r.prefill_tokens_per_s / predicted.prefill_tokens_per_s(),
      r.decode_tokens_per_s / predicted.decode_tokens_per_s(),
      r.total_tokens_per_s / predicted.total_tokens_per_s());
  fmt::print("cpu share  the run had {:.0f}% of {} core(s) in prefill, {:.0f}% in decode\n",
             100 * prefill_share, policy.threads, 100 * decode_share);
  fmt::print(
      "           ceilings now are {:.0f}% (compute), {:.0f}% (sluice's GEMM) and {:.0f}% (DRAM) "
      "of the profile's: other load on the machine slows the measurement, not the prediction\n",
      100 * r.compute_ceiling_flops / hw.compute_ceiling_flops(activations),
      100 * ceilings.gemm_flops / hw.gemm_peak_flops,
      100 * ceilings.dram_bytes_per_s / hw.dram_bytes_per_s);
  fmt::print("memory     peak resident {} vs weights {} + KV cache {} (+10%: {}){}\n",
             human_bytes(double(peak_rss)), human_bytes(double(weights_bytes)),
             human_bytes(double(s.kv_cache_bytes)), human_bytes(memory_bound),
             double(peak_rss) <= memory_bound ? "" : "  OVER BUDGET");
  // The use counts the device KV pool's blocks too (ω < 1); the bytes are the host cache's.
  fmt::print("KV cache   peak use {:.0f}% of the blocks (host cache {}{})\n", 100 * s.peak_kv_usage,
             human_bytes(double(s.kv_cache_bytes)), backend ? " and the device KV pool" : "");
  if (backend) {
    fmt::print("device     {}\n", backend->device->name());
    print_device_report(device_report(s, wall, h2d_reference, h2d_source), s, wall);
  }
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
