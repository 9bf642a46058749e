#include "cli/machine_report.h"

#include <fmt/format.h>

#include "kernels/cpu/isa.h"

namespace sluice::cli {

std::string machine_description() {
  std::string offered;
  for (cpu::IsaLevel l : cpu::supported_isa_levels())
    offered += (offered.empty() ? "" : ", ") + std::string(cpu::isa_name(l));
  return fmt::format("{}, ISA level {} (this CPU offers {})", cpu::cpu_model_name(),
                     cpu::isa_name(cpu::isa_level()), offered);
}

void print_instruction_ceilings(const InstructionCeilings& c, const std::string& isa_level,
                                const std::string& indent) {
  if (!c.measured()) {
    fmt::print(
        "{}instruction peaks not measured (a profile written before they existed: run "
        "`sluice profile --refresh`)\n",
        indent);
    return;
  }
  fmt::print("{}fp32 FMA {:>9.1f} GFLOP/s  {}\n", indent, c.fp32_fma_flops / 1e9,
             c.fp32_instruction);
  fmt::print(
      "{}bf16     {:>9.1f} GFLOP/s  {}{}\n", indent, c.bf16_flops / 1e9, c.bf16_instruction,
      c.bf16_instruction == c.fp32_instruction
          ? fmt::format(" (no bf16 instruction at {}: weights are widened to fp32)", isa_level)
          : "");
  fmt::print("{}int8     {:>9.1f} GOP/s    {}\n", indent, c.int8_ops / 1e9, c.int8_instruction);
}

}  // namespace sluice::cli
