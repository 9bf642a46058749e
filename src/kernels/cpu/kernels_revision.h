// Which generation of the CPU kernels this build runs, as far as the planner's measurements care.
#pragma once

namespace sluice::cpu {

// Bumped whenever a CPU kernel's speed changes enough to move what `sluice profile` and the
// quick measurements record (its ceilings, GEMM curves, int8/int4 speedups). Both cache files
// under ~/.cache/sluice carry the revision they were measured with, and one measured with
// another (or before the field existed) is measured again: on 2 Zen 4 cores, a quick profile
// cached before the int8 tiles' rework had `bench` predict int8 decode 1.3× too low.
//   1: the fused int8/int4 AVX512-VNNI tiles and the avx512bf16 streaming prefetch (2026-12-06).
//   2: the avx512bf16 token lanes' 6-column tiles over 2048-pair ranges, from m = 13 (2026-12-06).
//   3: the token lanes' leftover tiles (rows past the last whole block, and m ≤ 4) (2026-12-07).
//   4: the token lanes write Y once per column block, a 16 × 16 transpose at a time, and take
//      every m, in blocks of 4 rows up to m = 12 (2026-12-07).
constexpr int kKernelsRevision = 4;

}  // namespace sluice::cpu
