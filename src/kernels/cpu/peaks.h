// The instruction peaks of this CPU: the rate of one arithmetic instruction (fp32 FMA, bf16 dot
// product, int8 dot product, AMX tile product) issued back to back on independent accumulators
// by every OpenMP thread at once. No kernel can beat these rates, so they are the compute
// ceilings every achieved FLOP/s is printed against, and they follow the ISA level in force:
// at avx2 the bf16 ceiling is the fp32 FMA rate (no bf16 instruction exists; weights are widened
// to fp32 in registers), at avx512bf16 it is vdpbf16ps, at amx the AMX-BF16 tile product.
//
// Counting: a multiply and an add are 2 operations, so one fp32 FMA lane is 2 FLOP and one
// int8 product added into an int32 is 2 OP (int8 rates are in OP/s, the rest in FLOP/s).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace sluice::cpu {

// One measuring loop: an instruction (or the short sequence a kernel issues in its place).
enum class PeakLoop : uint8_t {
  kScalarFma,      // plain C++ fp32 a·b + c (the x86-64-v2 baseline has no FMA: mulps + addps)
  kAvx2Fma,        // vfmadd231ps ymm
  kAvx512Fma,      // vfmadd231ps zmm
  kAvx512Bf16Dot,  // vdpbf16ps zmm
  kAmxBf16,        // tdpbf16ps
  kScalarInt8,     // plain C++ int8 × int8 added into int32, operands read from L1
  kAvx2Maddubs,    // vpmaddubsw + vpmaddwd + vpaddd ymm (the int8 dot product of AVX2)
  kAvxVnni,        // vpdpbusd ymm, VEX-encoded (AVX-VNNI)
  kAvx512Vnni,     // vpdpbusd zmm (AVX512-VNNI)
  kAmxInt8,        // tdpbusd
};

// "avx2 vfmadd231ps ymm", ...
const char* peak_loop_name(PeakLoop loop);
// Whether the loop may run now: its level is at most the one in force, and the CPU has the
// extension it needs (AVX-VNNI, AVX512-VNNI).
bool peak_loop_available(PeakLoop loop);
// The rate of `loop` with every OpenMP thread running it for about `seconds` (a short
// calibration first): FLOP/s for fp32 and bf16 loops, OP/s for int8 ones. Fails naming the loop
// when it is not available.
double measure_peak(PeakLoop loop, double seconds = 0.15);

// The loops that stand for the ceilings of the level in force.
struct PeakLoops {
  PeakLoop fp32;  // the level's fp32 FMA
  PeakLoop bf16;  // a bf16 GEMM's fastest instruction: the fp32 FMA below avx512bf16
  PeakLoop int8;  // the int8 dot product the int8 kernels use (int8_dot())
};
PeakLoops peak_loops();

// The compute ceilings of the level in force.
struct InstructionPeaks {
  IsaLevel level = IsaLevel::kScalar;
  PeakLoops loops{};
  double fp32_fma_flops = 0;  // FLOP/s of loops.fp32
  double bf16_flops = 0;      // FLOP/s of loops.bf16: the bf16 GEMM ceiling
  double int8_ops = 0;        // OP/s of loops.int8: the int8 GEMM ceiling
};
// Measures the three (the bf16 loop is measured once when it is the fp32 one); about
// 3 × `seconds_each`.
InstructionPeaks measure_instruction_peaks(double seconds_each = 0.15);

}  // namespace sluice::cpu
