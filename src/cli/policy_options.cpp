#include "cli/policy_options.h"

#include "core/units.h"
#include "engine/engine_plan.h"
#include "model/presets.h"

namespace sluice::cli {

namespace {

// A choice among names for an enum option. CLI11's CheckedTransformer would show (and name in its
// errors) the enum's numbers, raw bytes for a uint8_t enum; this shows the names and says which
// were expected.
template <class E>
CLI::Validator one_of(std::map<std::string, E> names) {
  std::string list;
  for (const auto& [name, value] : names) list += (list.empty() ? "" : "|") + name;
  return CLI::Validator(
      [names, list](std::string& s) -> std::string {
        const auto it = names.find(s);
        if (it == names.end()) return "expected one of " + list + ", got '" + s + "'";
        s = std::to_string(static_cast<long long>(it->second));  // CLI11 reads an enum's number
        return "";
      },
      list);
}

}  // namespace

void add_policy_options(CLI::App& sub, Policy& p) {
  const char* group = "Policy (0: automatic)";
  sub.add_option("--batch", p.batch, "B: sequences decoded together")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--attn-micro-batch", p.attn_micro_batch, "b_a: tokens per attention micro-batch")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-batch", p.expert_batch, "b_e: most tokens in one expert GEMM")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--prefill-chunk", p.prefill_chunk, "Most prompt tokens prefilled per step")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--kv-blocks", p.kv_blocks,
                 "KV-cache blocks (with an offload device, of the host cache and the device KV "
                 "pool together: the device holds the GPU share of attention)")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--kv-block-size", p.kv_block_size, "Tokens per KV-cache block")
      ->group(group)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--threads", p.threads, "Worker threads")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--precision", p.precision,
                 "GEMM activations: bf16 (fast) or f32 (equal to the reference forward)")
      ->group(group)
      ->transform(one_of(
          std::map<std::string, Precision>{{"bf16", Precision::kBf16}, {"f32", Precision::kF32}}))
      ->default_str("bf16");
  add_expert_dtype_options(sub, p.expert_dtype, p.expert_group, group);
}

void add_expert_dtype_options(CLI::App& sub, ExpertDtype& dtype, int& group_size,
                              const char* group) {
  sub.add_option("--expert-dtype", dtype,
                 "Expert weights (routed and shared) in memory: bf16, or int8/int4 quantized at "
                 "load with group-wise symmetric scales (a quantized checkpoint is used as is)")
      ->group(group)
      ->transform(one_of(std::map<std::string, ExpertDtype>{{"bf16", ExpertDtype::kBf16},
                                                            {"int8", ExpertDtype::kInt8},
                                                            {"int4", ExpertDtype::kInt4}}))
      ->default_str("bf16");
  sub.add_option("--expert-group", group_size,
                 "Inputs per quantization scale of the expert weights; must divide their row "
                 "lengths (0: the default, 128)")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
}

void add_host_memory_option(CLI::App& sub, std::string& host_mem) {
  sub.add_option("--host-mem", host_mem,
                 "Host memory for weights, KV cache and activations, e.g. 20GiB (default: what "
                 "this process may allocate now, under MemAvailable, cgroup limits and ulimit "
                 "-v, less a margin of 5%)")
      ->group("Policy (0: automatic)");
}

HostBudget host_memory_budget(const std::string& host_mem, bool allocating) {
  return host_budget(host_mem.empty() ? 0 : parse_bytes(host_mem, "--host-mem"), allocating);
}

void add_device_options(CLI::App& sub, DeviceOptions& d) {
  const char* group = "Device";
  sub.add_option("--device", d.kind,
                 "Where the layers run: auto (cuda when a GPU is usable, else cpu), cpu (this "
                 "machine's CPU), cuda (the offload pipeline on the first GPU: experts streamed "
                 "into --gpu-mem, attention split between the CPU and the GPU), or standin (the "
                 "offload pipeline on a CPU stand-in device, for testing it)")
      ->group(group)
      ->transform(one_of(std::map<std::string, DeviceKind>{{"auto", DeviceKind::kAuto},
                                                           {"cpu", DeviceKind::kCpu},
                                                           {"cuda", DeviceKind::kCuda},
                                                           {"standin", DeviceKind::kStandin}}))
      ->default_str("auto");
  sub.add_option("--gpu-mem", d.gpu_mem,
                 "Device memory the offload executor may use, e.g. 24GiB (default: 90% of the "
                 "GPU's free memory; unlimited on the stand-in)")
      ->group(group);
  sub.add_option("--page-slots", d.settings.page_slots,
                 "Expert page slots on the device, one expert matrix each; at least 3 (0: the "
                 "plan's prefetch depth, else as many as --gpu-mem leaves room for, up to two "
                 "layers' experts)")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--device-cache-pages", d.settings.cache_pages,
                 "Expert page slots beyond --page-slots that keep pages on the device from step "
                 "to step, so an expert used again is not copied again (default: what --gpu-mem "
                 "leaves beyond a margin, up to every streamed page; none on the stand-in)")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--cpu-expert-max-tokens", d.settings.cpu_expert_max_tokens,
                 "Experts with at most this many tokens in a step run on the CPU when their pages "
                 "are not on the device yet (0: never)")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--resident-expert-layers", d.settings.resident_expert_layers,
                 "Layers whose experts stay on the device, evenly spaced; the others stream "
                 "through the page slots (default: the plan's choice; none when there is no plan)")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--cpu-attention-share", d.settings.cpu_attention_share,
                 "omega: the fraction of the sequences whose attention runs on the CPU over the "
                 "host KV cache; the others' runs on the device over a device KV pool of the GPU "
                 "share of the KV blocks (default: the plan's choice; 1 when there is no plan)")
      ->group(group)
      ->check(CLI::Range(0.0, 1.0));
  sub.add_option("--lm-head", d.settings.lm_head,
                 "Where the final norm and lm_head run with an offload device: auto (the device "
                 "when --gpu-mem has room), device, or host")
      ->group(group)
      ->transform(one_of(std::map<std::string, LmHeadPlace>{{"auto", LmHeadPlace::kAuto},
                                                            {"device", LmHeadPlace::kDevice},
                                                            {"host", LmHeadPlace::kHost}}))
      ->default_str("auto");
}

void add_model_shape_options(CLI::App& sub, std::string& model_dir, std::string& preset,
                             int& layers) {
  sub.add_option("--model", model_dir, "Model folder (its config.json is read) or .gguf file");
  sub.add_option("--preset", preset, "A named model shape (bench makes it in memory)")
      ->check(CLI::IsMember(preset_names()));
  sub.add_option("--layers", layers, "Keep only the first N layers")->check(CLI::NonNegativeNumber);
}

void add_workload_length_options(CLI::App& sub, int& prompt_len, int& gen_len) {
  sub.add_option("--prompt-len", prompt_len, "Prompt tokens per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_option("--gen-len", gen_len, "Tokens to generate per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

}  // namespace sluice::cli
