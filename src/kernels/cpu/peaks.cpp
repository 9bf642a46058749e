#include "kernels/cpu/peaks.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <iterator>

#include "core/clock.h"
#include "core/error.h"

namespace sluice::cpu {
namespace {

// Each loop runs `iterations` rounds of independent accumulator chains and returns a value
// that depends on every accumulator (summed by the caller), so nothing can be optimised away.
// The chains are more than latency × issue ports, so the loop runs at the instruction's
// throughput; the comment of each loop gives its operations per iteration.

// The sum of a vector's lanes (stored, then added: the reduce intrinsics of GCC 12 warn).
SLUICE_AVX2 double lane_sum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  double sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}
SLUICE_AVX2 double lane_sum(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  double sum = 0;
  for (int32_t x : lanes) sum += x;
  return sum;
}
SLUICE_AVX512 double lane_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  double sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}
SLUICE_AVX512 double lane_sum(__m512i v) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, v);
  double sum = 0;
  for (int32_t x : lanes) sum += x;
  return sum;
}

// 48 fp32 chains acc = acc·a + b: 2 FLOP each, 96 per iteration. Plain C++ as the scalar
// level's kernels are: the compiler turns it into 12 xmm registers of mulps + addps.
double scalar_fma_loop(int64_t iterations) {
  constexpr int kChains = 48;
  float acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = float(j) * 1e-3f;
  const float a = 0.999f, b = 1e-3f;  // converges to 1: no overflow, no denormals
  for (int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = acc[j] * a + b;
  double sum = 0;
  for (float v : acc) sum += v;
  return sum;
}

// 12 ymm chains of vfmadd: 8 lanes × 2 FLOP = 16 FLOP an instruction, 192 per iteration.
// FMA latency 4-5 cycles on 2 ports needs 8-10 in flight.
SLUICE_AVX2 double avx2_fma_loop(int64_t iterations) {
  constexpr int kChains = 12;
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(float(j) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  __m256 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, acc[j]);
  return lane_sum(s);
}

// 16 zmm chains of vfmadd: 16 lanes × 2 FLOP = 32 FLOP an instruction, 512 per iteration.
SLUICE_AVX512 double avx512_fma_loop(int64_t iterations) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(float(j) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, acc[j]);
  return lane_sum(s);
}

// 16 zmm chains of vdpbf16ps: each of the 16 fp32 lanes adds 2 bf16 products, 4 FLOP a lane,
// 64 FLOP an instruction, 1024 per iteration.
SLUICE_AVX512_BF16 double avx512_bf16_loop(int64_t iterations) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(0.01f);
  const __m512bh a = _mm512_cvtne2ps_pbh(x, x), b = _mm512_cvtne2ps_pbh(x, x);
  for (int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, acc[j]);
  return lane_sum(s);
}

// A plain C++ int8 dot product of 64 elements read from L1 each round (the asm says a and b may
// have changed), as the scalar level's kernels compute one: 2 OP a product, 128 per iteration.
// The compiler vectorises it into sign extensions, pmullw and paddd on xmm partial sums.
double scalar_int8_loop(int64_t iterations) {
  constexpr int kLength = 64;
  int8_t a[kLength], b[kLength];
  for (int j = 0; j < kLength; ++j) a[j] = int8_t(j - 32), b[j] = int8_t(3 * j - 90);
  int32_t total = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    __asm__ volatile("" : "+m"(a), "+m"(b));
    int32_t dot = 0;
    for (int j = 0; j < kLength; ++j) dot += int32_t(a[j]) * int32_t(b[j]);
    total += dot;
  }
  return total;
}

// The int8 loops issue their instructions through one-line asm on accumulators that are named
// variables: with the intrinsics, or with an array of accumulators, GCC 12 copies them between
// registers and to the stack on every iteration, and the loop would measure those moves. The
// asm outputs depend on the accumulator, so nothing is hoisted out of the loop.

// acc += the AVX2 int8 dot product of a (u8) and b (s8): vpmaddubsw multiplies 32 pairs and
// adds neighbours into int16, vpmaddwd by ones widens pairs of those to int32, vpaddd
// accumulates. 32 products, 64 OP.
SLUICE_AVX2 inline void maddubs_step(__m256i& acc, __m256i a, __m256i b, __m256i ones) {
  __m256i t;
  __asm__(
      "vpmaddubsw %[b], %[a], %[t]\n\t"
      "vpmaddwd %[ones], %[t], %[t]\n\t"
      "vpaddd %[t], %[acc], %[acc]"
      : [acc] "+x"(acc), [t] "=&x"(t)
      : [a] "x"(a), [b] "x"(b), [ones] "x"(ones));
}

// acc += VEX vpdpbusd(a, b): 8 int32 lanes each add 4 u8 × s8 products, 32 products, 64 OP.
SLUICE_AVX2_VNNI inline void vpdpbusd_step(__m256i& acc, __m256i a, __m256i b) {
  __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
}

// acc += EVEX vpdpbusd(a, b) on zmm: 16 lanes × 4 products, 128 OP.
SLUICE_AVX512_VNNI inline void vpdpbusd_step(__m512i& acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

template <typename... Acc>
SLUICE_AVX2 double sum_epi32(__m256i first, Acc... rest) {
  ((first = _mm256_add_epi32(first, rest)), ...);
  return lane_sum(first);
}
template <typename... Acc>
SLUICE_AVX512 double sum_epi32(__m512i first, Acc... rest) {
  ((first = _mm512_add_epi32(first, rest)), ...);
  return lane_sum(first);
}

// 6 ymm chains of the AVX2 sequence: 384 OP per iteration. 6 chains keep the accumulators, b,
// a, the ones and the temporary in the 16 ymm registers; the sequence's latency (~11 cycles)
// does not limit it, as only the vpaddd depends on the previous iteration.
SLUICE_AVX2 double avx2_maddubs_loop(int64_t iterations) {
  __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2),
          c3 = _mm256_set1_epi32(3), c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5);
  const __m256i b0 = _mm256_set1_epi8(1), b1 = _mm256_set1_epi8(2), b2 = _mm256_set1_epi8(3),
                b3 = _mm256_set1_epi8(4), b4 = _mm256_set1_epi8(5), b5 = _mm256_set1_epi8(6);
  const __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iterations; ++i) {
    maddubs_step(c0, a, b0, ones);
    maddubs_step(c1, a, b1, ones);
    maddubs_step(c2, a, b2, ones);
    maddubs_step(c3, a, b3, ones);
    maddubs_step(c4, a, b4, ones);
    maddubs_step(c5, a, b5, ones);
  }
  return sum_epi32(c0, c1, c2, c3, c4, c5);
}

// 12 ymm chains of VEX vpdpbusd (latency 5 on 2 ports: 10 in flight): 768 OP per iteration.
// (The int32 sums wrap; the rate does not care.)
SLUICE_AVX2_VNNI double avx_vnni_loop(int64_t iterations) {
  __m256i c[12];
  for (int j = 0; j < 12; ++j) c[j] = _mm256_set1_epi32(j);
  auto [c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11] = c;
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
  for (int64_t i = 0; i < iterations; ++i) {
    vpdpbusd_step(c0, a, b), vpdpbusd_step(c1, a, b), vpdpbusd_step(c2, a, b);
    vpdpbusd_step(c3, a, b), vpdpbusd_step(c4, a, b), vpdpbusd_step(c5, a, b);
    vpdpbusd_step(c6, a, b), vpdpbusd_step(c7, a, b), vpdpbusd_step(c8, a, b);
    vpdpbusd_step(c9, a, b), vpdpbusd_step(c10, a, b), vpdpbusd_step(c11, a, b);
  }
  return sum_epi32(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11);
}

// 16 zmm chains of vpdpbusd: 2048 OP per iteration.
SLUICE_AVX512_VNNI double avx512_vnni_loop(int64_t iterations) {
  __m512i c[16];
  for (int j = 0; j < 16; ++j) c[j] = _mm512_set1_epi32(j);
  auto [c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15] = c;
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int64_t i = 0; i < iterations; ++i) {
    vpdpbusd_step(c0, a, b), vpdpbusd_step(c1, a, b), vpdpbusd_step(c2, a, b);
    vpdpbusd_step(c3, a, b), vpdpbusd_step(c4, a, b), vpdpbusd_step(c5, a, b);
    vpdpbusd_step(c6, a, b), vpdpbusd_step(c7, a, b), vpdpbusd_step(c8, a, b);
    vpdpbusd_step(c9, a, b), vpdpbusd_step(c10, a, b), vpdpbusd_step(c11, a, b);
    vpdpbusd_step(c12, a, b), vpdpbusd_step(c13, a, b), vpdpbusd_step(c14, a, b);
    vpdpbusd_step(c15, a, b);
  }
  return sum_epi32(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15);
}

// AMX: eight tiles of 16 rows × 64 bytes. Tiles 0-3 accumulate C (16 × 16 fp32 or int32), 4-5
// hold A and 6-7 hold B; a 2×2 block of products keeps the tile multiplier busy.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

SLUICE_AMX void amx_configure(const void* a_and_b, int64_t stride) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a_and_b, stride);
  _tile_loadd(5, a_and_b, stride);
  _tile_loadd(6, a_and_b, stride);
  _tile_loadd(7, a_and_b, stride);
}

SLUICE_AMX double amx_sum_accumulators(bool int32) {
  alignas(64) float out[4][256];
  _tile_stored(0, out[0], 64);
  _tile_stored(1, out[1], 64);
  _tile_stored(2, out[2], 64);
  _tile_stored(3, out[3], 64);
  _tile_release();
  double sum = 0;
  for (const auto& tile : out)
    for (const float& v : tile) sum += int32 ? double(reinterpret_cast<const int32_t&>(v)) : v;
  return sum;
}

// tdpbf16ps: C[16×16 fp32] += A[16×32 bf16]·B[32×16 bf16], 16·16·32 products, 16384 FLOP an
// instruction, 65536 per iteration.
SLUICE_AMX double amx_bf16_loop(int64_t iterations) {
  alignas(64) uint16_t operand[16 * 32];
  std::fill(std::begin(operand), std::end(operand), uint16_t(0x3c24));  // bf16 0.01
  amx_configure(operand, 64);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  return amx_sum_accumulators(false);
}

// tdpbusd: C[16×16 int32] += A[16×64 u8]·B[64×16 s8], 16·16·64 products, 32768 OP an
// instruction, 131072 per iteration.
SLUICE_AMX double amx_int8_loop(int64_t iterations) {
  alignas(64) uint8_t operand[16 * 64];
  std::fill(std::begin(operand), std::end(operand), uint8_t(3));
  amx_configure(operand, 64);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  return amx_sum_accumulators(true);
}

struct LoopSpec {
  PeakLoop loop;
  const char* name;
  IsaLevel level;  // the lowest level whose kernels may issue it
  bool (*has)();   // the extension it needs beyond the level; null: none
  double ops_per_iteration;
  double (*run)(int64_t iterations);
};

bool has_avx_vnni() {
  return cpu_features().avx_vnni;
}
bool has_avx512_vnni() {
  return cpu_features().avx512_vnni;
}

constexpr std::array<LoopSpec, 10> kLoops = {{
    {PeakLoop::kScalarFma, "scalar fp32 mul+add", IsaLevel::kScalar, nullptr, 96, scalar_fma_loop},
    {PeakLoop::kAvx2Fma, "avx2 vfmadd231ps ymm", IsaLevel::kAvx2, nullptr, 192, avx2_fma_loop},
    {PeakLoop::kAvx512Fma, "avx512 vfmadd231ps zmm", IsaLevel::kAvx512, nullptr, 512,
     avx512_fma_loop},
    {PeakLoop::kAvx512Bf16Dot, "avx512bf16 vdpbf16ps zmm", IsaLevel::kAvx512Bf16, nullptr, 1024,
     avx512_bf16_loop},
    {PeakLoop::kAmxBf16, "amx-bf16 tdpbf16ps", IsaLevel::kAmx, nullptr, 65536, amx_bf16_loop},
    {PeakLoop::kScalarInt8, "scalar int8 mul+add", IsaLevel::kScalar, nullptr, 128,
     scalar_int8_loop},
    {PeakLoop::kAvx2Maddubs, "avx2 vpmaddubsw+vpmaddwd+vpaddd ymm", IsaLevel::kAvx2, nullptr, 384,
     avx2_maddubs_loop},
    {PeakLoop::kAvxVnni, "avx-vnni vpdpbusd ymm", IsaLevel::kAvx2, has_avx_vnni, 768,
     avx_vnni_loop},
    {PeakLoop::kAvx512Vnni, "avx512-vnni vpdpbusd zmm", IsaLevel::kAvx512, has_avx512_vnni, 2048,
     avx512_vnni_loop},
    {PeakLoop::kAmxInt8, "amx-int8 tdpbusd", IsaLevel::kAmx, nullptr, 131072, amx_int8_loop},
}};

constexpr bool loops_in_enum_order() {
  for (size_t i = 0; i < kLoops.size(); ++i)
    if (size_t(kLoops[i].loop) != i) return false;
  return true;
}
static_assert(loops_in_enum_order(), "kLoops is indexed by PeakLoop");

const LoopSpec& spec_of(PeakLoop loop) {
  return kLoops[size_t(loop)];
}

// Iterations per call of a loop so that one call takes about 20 us: short beside a window, long
// beside a clock read and the loop's own setup (an AMX tile configuration). Timed on this thread
// alone; a preemption makes the chunk shorter, which costs nothing.
int64_t chunk_iterations(const LoopSpec& spec) {
  constexpr int64_t kProbe = 256;
  const auto start = Clock::now();
  volatile double sink = spec.run(kProbe);
  (void)sink;
  const double per_iteration = seconds_since(start) / kProbe;
  return std::clamp<int64_t>(int64_t(20e-6 / per_iteration), 16, int64_t(1) << 20);
}

// Operations per second of every OpenMP thread running the loop, in calls of `chunk`
// iterations, from a common start until `window` seconds have passed. A thread the OS takes
// the core from does fewer iterations in the window; it never stretches the window, so a
// loaded machine lowers the rate by the share it took, and no more.
double window_rate(const LoopSpec& spec, int64_t chunk, double window) {
  double iterations = 0, sink = 0;
  Clock::time_point start;
#pragma omp parallel reduction(+ : iterations, sink)
  {
#pragma omp single
    start = Clock::now();  // the implicit barrier after it starts every thread together
    // At least one chunk per thread: a thread descheduled past the whole window (other load on
    // the cores) would otherwise count nothing, and a window of nothing measures a rate of 0.
    do {
      sink += spec.run(chunk);
      iterations += double(chunk);
    } while (seconds_since(start) < window);
  }
  const double seconds = seconds_since(start);  // to the last thread's last call
  // Used, so the loops' results (and so the loops) cannot be optimised away.
  if (sink == -1.0) return 0;
  return spec.ops_per_iteration * iterations / seconds;
}

}  // namespace

const char* peak_loop_name(PeakLoop loop) {
  return spec_of(loop).name;
}

bool peak_loop_available(PeakLoop loop) {
  const LoopSpec& s = spec_of(loop);
  return isa_at_least(s.level) && (s.has == nullptr || s.has());
}

// The best of five windows of a fifth of `seconds` each: the one least disturbed by other load
// on the machine.
double measure_peak(PeakLoop loop, double seconds) {
  const LoopSpec& spec = spec_of(loop);
  if (!peak_loop_available(loop))
    fail("instruction peak '{}': not available at ISA level {} on this CPU ({})", spec.name,
         isa_name(isa_level()), cpu_model_name());
  const int64_t chunk = chunk_iterations(spec);
  double best = 0;
  for (int window = 0; window < 5; ++window)
    best = std::max(best, window_rate(spec, chunk, seconds / 5));
  return best;
}

namespace {

PeakLoop fp32_loop(IsaLevel level) {
  if (level >= IsaLevel::kAvx512) return PeakLoop::kAvx512Fma;
  return level >= IsaLevel::kAvx2 ? PeakLoop::kAvx2Fma : PeakLoop::kScalarFma;
}

// Below avx512bf16 a bf16 GEMM widens its weights and issues the fp32 FMA.
PeakLoop bf16_loop(IsaLevel level) {
  if (level >= IsaLevel::kAmx) return PeakLoop::kAmxBf16;
  return level >= IsaLevel::kAvx512Bf16 ? PeakLoop::kAvx512Bf16Dot : fp32_loop(level);
}

PeakLoop int8_loop(Int8Dot dot) {
  switch (dot) {
    case Int8Dot::kScalar:
      return PeakLoop::kScalarInt8;
    case Int8Dot::kAvx2Maddubs:
      return PeakLoop::kAvx2Maddubs;
    case Int8Dot::kAvxVnni:
      return PeakLoop::kAvxVnni;
    case Int8Dot::kAvx512Vnni:
      return PeakLoop::kAvx512Vnni;
    case Int8Dot::kAmx:
      return PeakLoop::kAmxInt8;
  }
  return PeakLoop::kScalarInt8;
}

}  // namespace

PeakLoops peak_loops() {
  return {fp32_loop(isa_level()), bf16_loop(isa_level()), int8_loop(int8_dot())};
}

InstructionPeaks measure_instruction_peaks(double seconds_each) {
  InstructionPeaks p;
  p.level = isa_level();
  p.loops = peak_loops();
  p.fp32_fma_flops = measure_peak(p.loops.fp32, seconds_each);
  p.bf16_flops =
      p.loops.bf16 == p.loops.fp32 ? p.fp32_fma_flops : measure_peak(p.loops.bf16, seconds_each);
  p.int8_ops = measure_peak(p.loops.int8, seconds_each);
  return p;
}

}  // namespace sluice::cpu
