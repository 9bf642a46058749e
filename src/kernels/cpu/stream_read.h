// A plain read of memory at full speed: the DRAM probe of `sluice profile` and the read that
// bench-kernels pairs with each weight-streaming kernel, so the kernel's weight bandwidth is
// compared with what plain loads get from the same bytes in the same seconds.
#pragma once

#include <cstddef>

namespace sluice::cpu {

// Reads the `bytes` bytes at `data` (best 64-byte aligned; any alignment works) once, split evenly over the OpenMP
// threads, with the widest loads of the ISA level in force (a plain loop does not keep a core's
// share of DRAM busy on every CPU), and returns their sum as floats, so the reads cannot be
// optimised away. Trailing bytes short of one 64-byte line per thread are not read.
double read_stream(const void* data, size_t bytes);

}  // namespace sluice::cpu
