// `sluice plan`: the policy the planner picks for a model, a workload and this machine, its
// predicted throughput, why (the bottleneck of each phase), the runners-up, and a roofline
// picture.
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/engine_plan.h"
#include "io/staged_output.h"
#include "model/config.h"
#include "model/expert_quant.h"
#include "model/presets.h"
#include "model/weights.h"
#include "runtime/planner/planner.h"
#include "runtime/planner/roofline_svg.h"
#include "runtime/planner/workload_file.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model_dir, preset, input, host_mem, gpu_mem, svg, profile;
  int layers = 0, prompt_len = 128, gen_len = 128, requests = 0;
  bool json = false;
  Policy policy;
};

nlohmann::json offload_json(const OffloadPlan& o) {
  return {{"gpu", o.gpu},
          {"cpu_attention_share", o.cpu_attention_share},
          {"resident_expert_layers", o.resident_expert_layers},
          {"page_bytes", o.page_bytes},
          {"prefetch_depth", o.prefetch_depth},
          {"cpu_expert_max_tokens", o.cpu_expert_max_tokens},
          {"cache_pages", o.cache_pages}};
}

nlohmann::json prediction_json(const PlannedPolicy& p) {
  return {{"policy", p.policy.to_json()},
          {"offload", offload_json(p.offload)},
          {"predicted_prefill_tokens_per_s", p.prediction.prefill_tokens_per_s()},
          {"predicted_decode_tokens_per_s", p.prediction.decode_tokens_per_s()},
          {"predicted_total_tokens_per_s", p.prediction.total_tokens_per_s()},
          {"predicted_seconds", p.prediction.total_seconds},
          {"host_memory_bytes",
           {{"weights", p.memory.weights},
            {"kv_cache", p.memory.kv_cache},
            {"activations", p.memory.activations}}}};
}

// PNG beside the SVG when a converter is installed; returns the PNG path or "".
std::string convert_to_png(const std::string& svg) {
  std::string png = svg;
  if (png.size() > 4 && png.substr(png.size() - 4) == ".svg") png.resize(png.size() - 4);
  png += ".png";
  const std::string quoted_svg = "'" + svg + "'", quoted_png = "'" + png + "'";
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") == 0 &&
      std::system(("rsvg-convert -o " + quoted_png + " " + quoted_svg).c_str()) == 0)
    return png;
  if (std::system("command -v convert >/dev/null 2>&1") == 0 &&
      std::system(("convert " + quoted_svg + " " + quoted_png + " 2>/dev/null").c_str()) == 0)
    return png;
  return "";
}

HardwareProfile load_profile_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("plan: --profile {}: cannot open the file", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: expected the JSON of `sluice profile --json`, got a parse error ({})", path,
         e.what());
  }
  return profile_from_json(j, path);
}

void print_offload(const Plan& plan, const HardwareProfile& hw, const ModelConfig& c,
                   const MemoryLimits& limits) {
  const OffloadPlan& o = plan.offload;
  const GpuProfile& gp = *hw.gpu;
  const int resident = o.resident_expert_layers < 0 ? c.num_layers : o.resident_expert_layers;
  fmt::print("\noffload    GPU pipeline on {} (H2D pinned {:.1f} GB/s measured)\n", gp.name,
             gp.h2d_pinned_bytes_per_s / 1e9);
  fmt::print("           omega {:.2f}: the CPU runs attention for {:.0f}% of the sequences\n",
             o.cpu_attention_share, 100 * o.cpu_attention_share);
  fmt::print("           experts of {} of {} layers resident on the GPU, the rest streamed\n",
             resident, c.num_layers);
  fmt::print("           pages of {} ({} per expert), prefetch depth {} experts ({} slots)\n",
             human_bytes(double(o.page_bytes)), pages_per_expert(c, o.page_bytes), o.prefetch_depth,
             o.prefetch_depth * pages_per_expert(c, o.page_bytes));
  if (o.cache_pages > 0)
    fmt::print(
        "           {} more slots keep pages from step to step (the device's expert cache): "
        "{:.0f}% of the streamed experts stay\n",
        o.cache_pages, 100 * OffloadCostModel(hw, c, plan.chosen.policy, o).device_cache_hit());
  if (o.cpu_expert_max_tokens > 0)
    fmt::print("           experts with at most {} tokens in a step run on the CPU\n",
               o.cpu_expert_max_tokens);
  const GpuMemoryUse& g = plan.chosen.gpu_memory;
  fmt::print(
      "gpu memory {} of {}: attention weights {} + router, norms, lm_head {} + dense MLPs {} + "
      "resident experts {} + KV share {} + page slots {} + step buffers {}\n",
      human_bytes(double(g.total())), human_bytes(double(limits.gpu_bytes)),
      human_bytes(double(g.attention_weights)), human_bytes(double(g.router_norms_head)),
      human_bytes(double(g.dense_mlps)), human_bytes(double(g.resident_experts)),
      human_bytes(double(g.kv_cache)), human_bytes(double(g.page_slots)),
      human_bytes(double(g.step_buffers)));
  for (const PhaseBottleneck& b : plan.bottlenecks) {
    const double rate = b.use.step_seconds > 0 ? b.use.h2d_bytes / b.use.step_seconds : 0;
    fmt::print(
        "{:<10} PCIe H2D {:.1f} GB/s ({:.0f}% of measured); busy: GPU {:.0f}%, CPU {:.0f}%, "
        "PCIe H2D {:.0f}%, D2H {:.0f}%\n",
        b.phase, rate / 1e9, 100 * rate / gp.h2d_pinned_bytes_per_s, 100 * b.use.gpu_busy,
        100 * b.use.cpu_busy, 100 * b.use.h2d_busy, 100 * b.use.d2h_busy);
  }
}

// The model as planned: a folder's config or a preset's, with the expert dtype and --layers.
ModelConfig model_config(const Options& o) {
  ModelConfig c =
      o.preset.empty() ? load_model_config(o.model_dir) : preset_config(o.preset, o.layers);
  c.expert_quant = resolve_expert_quant(c, {o.policy.expert_dtype, o.policy.expert_group},
                                        o.preset.empty() ? o.model_dir : o.preset);
  if (o.preset.empty() && o.layers > 0) {
    if (o.layers > c.num_layers)
      fail("--layers {}: the model has {} layers", o.layers, c.num_layers);
    c.num_layers = o.layers;
  }
  return c;
}

// The requests planned for: a file's prompts, or --requests uniform ones.
std::vector<WorkloadRequest> workload(const Options& o) {
  if (o.input.empty())
    return uniform_workload(o.requests > 0 ? o.requests : 256, o.prompt_len, o.gen_len);
  std::vector<WorkloadRequest> work = workload_from_file(o.input, o.gen_len);
  if (o.requests > 0 && int(work.size()) > o.requests) work.resize(size_t(o.requests));
  return work;
}

MemoryLimits memory_limits(const Options& o, const ModelConfig& c) {
  MemoryLimits limits;
  // plan allocates nothing in proportion: it may plan for another machine's --host-mem.
  // A preset names a released model: planned as its safetensors folder would be served.
  const HostBudget budget = host_memory_budget(o.host_mem, false);
  require_servable(c, budget, o.preset.empty() ? o.model_dir : "--preset " + o.preset,
                   o.preset.empty() ? disk_tier_refusal(o.model_dir) : "");
  limits.host_bytes = budget.bytes;
  limits.experts_on_disk = experts_stay_on_disk(c, budget.bytes);
  limits.gpu_bytes = o.gpu_mem.empty() ? 0 : parse_bytes(o.gpu_mem, "--gpu-mem");
  return limits;
}

// The roofline picture of the chosen policy at --svg; returns the PNG made from it, if any.
std::string write_roofline(const Options& o, const HardwareProfile& hw, const ModelConfig& c,
                           const Plan& plan, const std::string& name) {
  const OffloadPlan& off = plan.offload;
  const auto points =
      off.gpu ? roofline_points(
                    [&](const StepShape& s) {
                      return OffloadCostModel(hw, c, plan.chosen.policy, off).step_graph(s);
                    },
                    plan.bottlenecks)
              : roofline_points(CpuCostModel(hw, c, plan.chosen.policy), plan.bottlenecks);
  write_file_atomically(o.svg, roofline_svg(hw, points,
                                            fmt::format("{} ({} layers): {}", name, c.num_layers,
                                                        plan.chosen.policy.describe()),
                                            off.gpu));
  return convert_to_png(o.svg);
}

// The GPU side of the plan for --json: its memory, and each phase's use of the link and units.
void add_gpu_json(nlohmann::json& j, const Plan& plan, const HardwareProfile& hw,
                  const MemoryLimits& limits) {
  const GpuMemoryUse& g = plan.chosen.gpu_memory;
  j["gpu_name"] = hw.gpu->name;
  j["gpu_memory_limit_bytes"] = limits.gpu_bytes;
  j["gpu_memory_bytes"] = {{"attention_weights", g.attention_weights},
                           {"router_norms_head", g.router_norms_head},
                           {"dense_mlps", g.dense_mlps},
                           {"resident_experts", g.resident_experts},
                           {"kv_cache", g.kv_cache},
                           {"page_slots", g.page_slots},
                           {"step_buffers", g.step_buffers},
                           {"total", g.total()}};
  j["phases"] = nlohmann::json::array();
  for (const PhaseBottleneck& b : plan.bottlenecks) {
    const double rate = b.use.step_seconds > 0 ? b.use.h2d_bytes / b.use.step_seconds : 0;
    j["phases"].push_back({{"phase", b.phase},
                           {"step_seconds", b.use.step_seconds},
                           {"h2d_bytes", b.use.h2d_bytes},
                           {"h2d_bytes_per_s", rate},
                           {"h2d_fraction_of_measured", rate / hw.gpu->h2d_pinned_bytes_per_s},
                           {"gpu_busy", b.use.gpu_busy},
                           {"cpu_busy", b.use.cpu_busy},
                           {"h2d_busy", b.use.h2d_busy},
                           {"d2h_busy", b.use.d2h_busy}});
  }
}

nlohmann::json plan_json(const Options& o, const HardwareProfile& hw, const ModelConfig& c,
                         const Plan& plan, const MemoryLimits& limits, size_t requests,
                         const std::string& name, const std::string& png) {
  nlohmann::json j = prediction_json(plan.chosen);
  j["model"] = name;
  j["layers"] = c.num_layers;
  j["requests"] = requests;
  j["profile_source"] = hw.source;
  j["cpu_model"] = hw.cpu_model;
  j["isa_level"] = hw.isa_level;
  j["compute_ceiling_flops"] = hw.compute_ceiling_flops("bf16");
  j["bottlenecks"] = nlohmann::json::array();
  for (const PhaseBottleneck& b : plan.bottlenecks)
    j["bottlenecks"].push_back({{"phase", b.phase},
                                {"group", b.group},
                                {"resource", resource_name(b.resource)},
                                {"bound", bound_name(b.bound)},
                                {"fraction", b.fraction},
                                {"text", b.sentence()}});
  if (plan.offload.gpu) add_gpu_json(j, plan, hw, limits);
  j["runners_up"] = nlohmann::json::array();
  for (const PlannedPolicy& r : plan.runners_up) j["runners_up"].push_back(prediction_json(r));
  if (!o.svg.empty()) j["svg"] = o.svg;
  if (!png.empty()) j["png"] = png;
  return j;
}

// The machine, ceilings, workload and memory the plan was made for.
void print_inputs(const Options& o, const HardwareProfile& hw, const ModelConfig& c,
                  const Plan& plan, const MemoryLimits& limits,
                  const std::vector<WorkloadRequest>& work, const std::string& name) {
  double prompt_sum = 0, gen_sum = 0;
  for (const WorkloadRequest& r : work) prompt_sum += r.prompt_tokens, gen_sum += r.new_tokens;
  fmt::print("model      {} ({} layers), {} of weights\n", name, c.num_layers,
             human_bytes(double(model_weight_bytes(c))));
  fmt::print("machine    {}{}{}\n", hw.cpu_model.empty() ? "CPU not named" : hw.cpu_model,
             hw.isa_level.empty() ? "" : ", ISA level " + hw.isa_level,
             o.profile.empty() ? "" : " (from " + o.profile + ")");
  fmt::print(
      "ceilings   {} profile: DRAM {:.1f} GB/s, bf16 compute {:.1f} GFLOP/s ({}), sluice's bf16 "
      "GEMM {:.1f} GFLOP/s{}\n",
      hw.source, hw.dram_bytes_per_s / 1e9, hw.compute_ceiling_flops("bf16") / 1e9,
      hw.instructions.measured() ? hw.instructions.bf16_instruction
                                 : "the GEMM peak: the profile has no instruction peaks",
      hw.gemm_peak_flops / 1e9,
      hw.source == "quick" ? " (run `sluice profile` for measured GEMM curves)" : "");
  fmt::print("workload   {} requests, prompt {:.0f} tokens, generate {:.0f} tokens (means){}\n",
             work.size(), prompt_sum / double(work.size()), gen_sum / double(work.size()),
             o.input.empty() ? "" : " [estimated from " + o.input + " at 4 characters a token]");
  const HostMemoryUse& m = plan.chosen.memory;
  fmt::print("memory     {} of {} host memory: weights {} + KV cache {} + activations {}\n\n",
             human_bytes(double(m.total())), human_bytes(double(limits.host_bytes)),
             human_bytes(double(m.weights)), human_bytes(double(m.kv_cache)),
             human_bytes(double(m.activations)));
}

// The chosen policy, its prediction and bottlenecks, the runners-up, and the offload plan.
void print_choice(const Plan& plan, const HardwareProfile& hw, const ModelConfig& c,
                  const MemoryLimits& limits) {
  const Prediction& p = plan.chosen.prediction;
  fmt::print("policy     {}\n", plan.chosen.policy.describe());
  fmt::print(
      "predicted  prefill {:.1f} tokens/s, decode {:.1f} tokens/s, end to end {:.1f} tokens/s "
      "({:.1f} s for the workload, {} steps)\n",
      p.prefill_tokens_per_s(), p.decode_tokens_per_s(), p.total_tokens_per_s(), p.total_seconds,
      p.steps);
  for (const PhaseBottleneck& b : plan.bottlenecks) fmt::print("           {}\n", b.sentence());
  fmt::print("\nrunners-up ({} policies evaluated)\n", plan.evaluated);
  for (const PlannedPolicy& r : plan.runners_up)
    fmt::print("  {:7.1f} tokens/s end to end (prefill {:.1f}, decode {:.1f})  {}{}\n",
               r.prediction.total_tokens_per_s(), r.prediction.prefill_tokens_per_s(),
               r.prediction.decode_tokens_per_s(), r.policy.describe(),
               r.offload.gpu ? " " + describe(r.offload) : "");
  if (!plan.offload.gpu) {
    fmt::print(
        "\noffload    CPU only: all weights resident in host memory, attention on the CPU "
        "(omega = 1), no paging or prefetch (give --gpu-mem to plan the GPU pipeline)\n");
  } else {
    print_offload(plan, hw, c, limits);
  }
}

int run(const Options& o) {
  if (o.model_dir.empty() == o.preset.empty())
    fail("plan: give exactly one of --model or --preset");
  if (o.svg.find('\'') != std::string::npos) fail("plan: --svg: expected a path without quotes");
  const ModelConfig c = model_config(o);
  const std::vector<WorkloadRequest> work = workload(o);
  const MemoryLimits limits = memory_limits(o, c);
  const HardwareProfile hw =
      o.profile.empty() ? planner_profile(o.policy.threads) : load_profile_file(o.profile);
  // What the engine runs: the offload executor's constraints (pages of one expert matrix).
  const Plan plan =
      plan_policy(hw, c, o.policy, work, limits, executor_constraints(OffloadSettings{}));
  const std::string name = o.preset.empty() ? o.model_dir : o.preset;
  const std::string png = o.svg.empty() ? "" : write_roofline(o, hw, c, plan, name);
  if (o.json) {
    fmt::print("{}\n", plan_json(o, hw, c, plan, limits, work.size(), name, png).dump());
    return 0;
  }
  print_inputs(o, hw, c, plan, limits, work, name);
  print_choice(plan, hw, c, limits);
  if (!o.svg.empty())
    fmt::print("roofline   {}{}\n", o.svg,
               png.empty() ? " (no PNG: rsvg-convert or ImageMagick convert missing or failed)"
                           : " and " + png);
  return 0;
}

RegisterCommand reg(
    {"plan", "Choose the batching policy for a model and workload on this machine",
     [](CLI::App& sub) {
       auto o = std::make_shared<Options>();
       add_model_shape_options(sub, o->model_dir, o->preset, o->layers);
       add_workload_length_options(sub, o->prompt_len, o->gen_len);
       sub.add_option("--input", o->input, "Prompts file (JSONL or text lines) to plan for");
       sub.add_option("--requests", o->requests, "Number of requests (default 256, or the file's)")
           ->check(CLI::NonNegativeNumber);
       sub.add_option("--gpu-mem", o->gpu_mem,
                      "GPU memory for the offload pipeline (plans the GPU pipeline; needs a "
                      "profile with a GPU)");
       sub.add_option("--profile", o->profile,
                      "Plan with this hardware profile (JSON of `sluice profile --json`) instead "
                      "of this machine's");
       sub.add_flag("--json", o->json,
                    "Print the chosen policy and predictions as one JSON object");
       sub.add_option("--svg", o->svg,
                      "Write the roofline picture here (and a PNG if a converter exists)");
       add_policy_options(sub, o->policy);
       add_host_memory_option(sub, o->host_mem);
       return std::function<int()>([o] { return run(*o); });
     }});

}  // namespace
}  // namespace sluice::cli
