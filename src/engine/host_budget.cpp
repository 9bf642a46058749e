#include "engine/host_budget.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/units.h"
#include "io/gguf.h"
#include "model/expert_quant.h"
#include "model/gguf_model.h"
#include "runtime/disk/expert_page_pool.h"
#include "runtime/memory_info.h"
#include "runtime/planner/planner.h"

namespace sluice {

namespace {

constexpr size_t kMinMargin = size_t(256) << 20;

size_t margin_of(size_t allocatable) { return std::max(kMinMargin, allocatable / 20); }

size_t weight_bytes_with_experts(ModelConfig c, ExpertDtype dtype) {
  c.expert_quant = {dtype, kDefaultExpertGroup};
  return model_weight_bytes(c);
}

// The ways out of a model that does not fit, for messages.
std::string ways_out(const ModelConfig& c, std::string_view no_disk_tier) {
  std::string s = "a larger --host-mem where the machine has it";
  if (no_disk_tier.empty())
    s += " (the routed experts then stay on disk in a page pool as large as the budget allows)";
  if (!c.expert_quant.quantized() && !c.fp8_weights && c.num_experts > 0)
    s += fmt::format(
        "; or quantized experts: `sluice quantize --model DIR --out DIR2 --expert-dtype int8` "
        "(or int4) writes a checkpoint whose weights need {} (int4: {}), one matrix in memory "
        "at a time",
        human_bytes(double(weight_bytes_with_experts(c, ExpertDtype::kInt8))),
        human_bytes(double(weight_bytes_with_experts(c, ExpertDtype::kInt4))));
  return s;
}

}  // namespace

HostBudget default_host_budget() {
  const AllocatableMemory m = allocatable_memory();
  const size_t margin = margin_of(m.bytes);
  return {m.bytes > margin ? m.bytes - margin : 0,
          fmt::format("what this process may allocate now, {} (limited by {}), less a margin of {}",
                      human_bytes(double(m.bytes)), m.limited_by, human_bytes(double(margin)))};
}

HostBudget host_budget(size_t requested, bool allocating) {
  if (requested == 0) return default_host_budget();
  if (allocating) {
    const AllocatableMemory m = allocatable_memory();
    if (requested > m.bytes)
      fail(
          "--host-mem {} is more than this process may allocate now: {} (limited by {}); a "
          "larger budget would be overrun part way through. Give at most that, or leave "
          "--host-mem out for that less a margin",
          human_bytes(double(requested)), human_bytes(double(m.bytes)), m.limited_by);
  }
  return {requested, "--host-mem"};
}

std::string disk_tier_refusal(const std::filesystem::path& dir) {
  return is_gguf_file(dir) ? gguf_disk_tier_refusal(dir) : "";
}

void require_servable(const ModelConfig& c, const HostBudget& budget, std::string_view what,
                      std::string_view no_disk_tier) {
  const size_t all = model_weight_bytes(c);
  if (all <= budget.bytes) return;
  const std::string budget_text =
      fmt::format("the budget of {} ({})", human_bytes(double(budget.bytes)), budget.source);
  if (!no_disk_tier.empty() || routed_expert_bytes(c) == 0)
    fail("{}: the weights need {} of host memory, more than {}, and the disk tier cannot keep "
         "the routed experts on disk ({}). Ways out: {}",
         what, human_bytes(double(all)), budget_text,
         no_disk_tier.empty() ? std::string_view("the model has none") : no_disk_tier,
         ways_out(c, no_disk_tier));
  const size_t least =
      all - routed_expert_bytes(c) + size_t(kMinPoolExperts) * expert_slot_bytes(c);
  if (least <= budget.bytes) return;
  fail("{}: the weights need {} of host memory, more than {}; even with the routed experts on "
       "disk (the disk tier), the other weights and a page pool of {} experts need {}. Ways "
       "out: {}",
       what, human_bytes(double(all)), budget_text, kMinPoolExperts, human_bytes(double(least)),
       ways_out(c, no_disk_tier));
}

}  // namespace sluice
