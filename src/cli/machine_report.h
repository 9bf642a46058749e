// The lines every measuring command prints about the machine: the CPU, the ISA level the
// kernels run at, and the instruction peaks (compute ceilings) of that level.
#pragma once

#include <string>

#include "runtime/hardware_probe.h"

namespace sluice::cli {

// "AMD EPYC 7B13, ISA level avx2 (this CPU offers scalar, avx2)": the level in force now.
std::string machine_description();

// The three ceilings, one line each after `indent`, with the instruction each stands for, and
// why the bf16 one is the fp32 FMA where the level has no bf16 instruction.
void print_instruction_ceilings(const InstructionCeilings& c, const std::string& isa_level,
                                const std::string& indent);

}  // namespace sluice::cli
