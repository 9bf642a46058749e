// The weight side of the int8/int4 GEMM (gemm_int8.h): group-wise quantization, the plain
// (checkpoint) form, the int4 nibble form, and packing into the kernels' blocked layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/large_alloc.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/quant_group.h"

namespace sluice::cpu {
namespace {

// Below this many weights a quantization runs on one thread (the fork costs ~µs).
constexpr int64_t kParallelWeights = int64_t(1) << 18;

size_t round64(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

size_t values_bytes_of(QuantFormat f, int64_t n, int64_t k) {
  const size_t rows = size_t((n + kInt8BlockRows - 1) / kInt8BlockRows * kInt8BlockRows);
  return round64(rows * size_t(k) / (f == QuantFormat::kInt4 ? 2 : 1));
}

QuantWeights allocate(QuantFormat f, int64_t n, int64_t k, int64_t group_size) {
  QuantWeights w;
  w.format = f;
  w.n = n;
  w.k = k;
  w.group_size = group_size;
  const size_t bytes = quant_bytes(f, n, k, group_size);
  void* p = allocate_large(bytes);
  if (p == nullptr) fail("quantized weights: out of memory allocating {} bytes", bytes);
  w.storage.reset(static_cast<uint8_t*>(p));
  w.data = w.storage.get();
  return w;
}

// Where row j, column p lives: the byte, and for int4 the nibble (0 low, 1 high).
struct ValuePlace {
  size_t byte;
  int nibble;
};

ValuePlace value_place(QuantFormat f, int64_t k, int64_t j, int64_t p) {
  const int64_t block = j / kInt8BlockRows, r = j % kInt8BlockRows;
  if (f == QuantFormat::kInt8)
    return {size_t(block * kInt8BlockRows * k + (p / 4) * kInt8BlockRows * 4 + r * 4 + p % 4), 0};
  const int64_t octet = p / 8, within = p % 8;
  return {size_t(block * kInt8BlockRows * k / 2 + octet * kInt8BlockRows * 4 + r * 4 + within % 4),
          int(within / 4)};
}

size_t scale_index(int64_t groups, int64_t j, int64_t g) {
  const int64_t block = j / kInt8BlockRows, r = j % kInt8BlockRows;
  return size_t((block * groups + g) * kInt8BlockRows + r);
}

}  // namespace

const char* quant_format_name(QuantFormat f) {
  return f == QuantFormat::kInt8 ? "int8" : "int4";
}

int quant_max(QuantFormat f) {
  return f == QuantFormat::kInt8 ? 127 : 7;
}

int64_t quant_group_multiple(QuantFormat f) {
  return f == QuantFormat::kInt8 ? 4 : 8;
}

size_t quant_bytes(QuantFormat f, int64_t n, int64_t k, int64_t group_size) {
  const size_t rows = size_t((n + kInt8BlockRows - 1) / kInt8BlockRows * kInt8BlockRows);
  return values_bytes_of(f, n, k) + round64(rows * size_t(k / group_size) * sizeof(float));
}

void check_quant_shape(const char* what, QuantFormat f, int64_t n, int64_t k, int64_t group_size) {
  const int64_t multiple = quant_group_multiple(f);
  if (n <= 0) fail("{}: field 'n': expected > 0 rows, got {}", what, n);
  if (group_size < multiple || group_size > kInt8MaxGroup || group_size % multiple != 0)
    fail("{}: field 'group_size': expected a multiple of {} in [{}, {}] for {} weights, got {}",
         what, multiple, multiple, kInt8MaxGroup, quant_format_name(f), group_size);
  if (k <= 0 || k % group_size != 0)
    fail(
        "{}: field 'k': expected a positive multiple of the group size {} (the row length must "
        "divide into groups), got {}",
        what, group_size, k);
}

size_t QuantView::values_bytes() const {
  return values_bytes_of(format, n, k);
}

int8_t QuantView::q(int64_t j, int64_t p) const {
  const ValuePlace at = value_place(format, k, j, p);
  if (format == QuantFormat::kInt8) return int8_t(data[at.byte]);
  return int8_t(((data[at.byte] >> (4 * at.nibble)) & 15) - 8);
}

float QuantView::scale(int64_t j, int64_t g) const {
  return scales()[scale_index(groups(), j, g)];
}

QuantWeights QuantWeights::clone() const {
  QuantWeights c = allocate(format, n, k, group_size);
  std::memcpy(c.storage.get(), data, bytes());
  return c;
}

void quantize_rows(QuantFormat f, const uint16_t* w, int64_t n, int64_t k, int64_t group_size,
                   int8_t* q, float* scales) {
  check_quant_shape("quantize_rows", f, n, k, group_size);
  const int64_t groups = k / group_size;
#pragma omp parallel if (n * k >= kParallelWeights)
  {
    std::vector<float> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) row[size_t(p)] = bf16_to_f32(w[j * k + p]);
      for (int64_t g = 0; g < groups; ++g)
        scales[j * groups + g] = quant::quantize_group(row.data() + g * group_size, group_size,
                                                       quant_max(f), q + j * k + g * group_size);
    }
  }
}

namespace {

// Fails naming the first value of q outside [-qmax, qmax] (-128 would break the AVX2 kernel's
// negation; -8 has no int4 nibble). A row's minimum and maximum first, which vectorises.
void check_value_range(QuantFormat f, const int8_t* q, int64_t n, int64_t k) {
  const int qmax = quant_max(f);
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* row = q + j * k;
    int lo = 0, hi = 0;
    for (int64_t p = 0; p < k; ++p) {
      lo = std::min(lo, int(row[p]));
      hi = std::max(hi, int(row[p]));
    }
    if (lo >= -qmax && hi <= qmax) continue;
    for (int64_t p = 0; p < k; ++p)
      if (row[p] < -qmax || row[p] > qmax)
        fail(
            "pack_weights: field 'q': row {} column {} is {}; symmetric {} weights lie in [{}, {}]",
            j, p, int(row[p]), quant_format_name(f), -qmax, qmax);
  }
}

// The values of rows [16b, 16b + 16) into block b at `out` (value_place's layout), every byte
// written: rows past n as q = 0 (int8 byte 0, int4 nibbles 8).
void pack_block_values(QuantFormat f, const int8_t* q, int64_t n, int64_t k, int64_t b,
                       uint8_t* out) {
  for (int64_t r = 0; r < kInt8BlockRows; ++r) {
    const int64_t j = b * kInt8BlockRows + r;
    const int8_t* row = j < n ? q + j * k : nullptr;
    if (f == QuantFormat::kInt8) {
      for (int64_t quad = 0; quad < k / 4; ++quad) {
        uint8_t* at = out + (quad * kInt8BlockRows + r) * 4;
        if (row)
          std::memcpy(at, row + quad * 4, 4);
        else
          std::memset(at, 0, 4);
      }
      continue;
    }
    for (int64_t octet = 0; octet < k / 8; ++octet) {
      uint8_t* at = out + (octet * kInt8BlockRows + r) * 4;
      for (int64_t i = 0; i < 4; ++i)
        at[i] = row ? uint8_t((row[octet * 8 + i] + 8) | ((row[octet * 8 + 4 + i] + 8) << 4))
                    : uint8_t(0x88);
    }
  }
}

}  // namespace

// Block by block, in parallel: every byte of `out` is written once (no zero fill first), so a
// fresh buffer is faulted in by the threads that fill it. Packing the 6.2 GB int8 checkpoint of
// the 4-layer Mixtral-8x7B shape took 16 s with a per-value layout call and a memset of each
// matrix, on one thread (2 Zen 4 cores).
void pack_weights_into(QuantFormat f, const int8_t* q, const float* scales, int64_t n, int64_t k,
                       int64_t group_size, uint8_t* out, bool parallel) {
  check_quant_shape("pack_weights", f, n, k, group_size);
  check_value_range(f, q, n, k);
  const int64_t groups = k / group_size;
  QuantView v{.format = f, .n = n, .k = k, .group_size = group_size, .data = out};
  const size_t block_bytes = size_t(kInt8BlockRows * k / (f == QuantFormat::kInt4 ? 2 : 1));
  float* s = const_cast<float*>(v.scales());
  const int64_t blocks = v.blocks();
#pragma omp parallel for schedule(static) if (parallel && n * k >= kParallelWeights)
  for (int64_t b = 0; b < blocks; ++b) {
    pack_block_values(f, q, n, k, b, out + size_t(b) * block_bytes);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < kInt8BlockRows; ++r) {
        const int64_t j = b * kInt8BlockRows + r;
        s[scale_index(groups, j, g)] = j < n ? scales[j * groups + g] : 0.0f;
      }
  }
  // The padding between the values and the scales, and after the scales.
  const size_t values_end = size_t(blocks) * block_bytes, scales_at = v.values_bytes();
  std::memset(out + values_end, 0, scales_at - values_end);
  const size_t scales_end = scales_at + size_t(blocks * groups * kInt8BlockRows) * sizeof(float);
  std::memset(out + scales_end, 0, quant_bytes(f, n, k, group_size) - scales_end);
}

void quantize_weights_into(QuantFormat f, const uint16_t* w, int64_t n, int64_t k,
                           int64_t group_size, uint8_t* out) {
  check_quant_shape("quantize_weights", f, n, k, group_size);
  std::vector<int8_t> q(size_t(n * k));
  std::vector<float> scales(size_t(n * (k / group_size)));
  quantize_rows(f, w, n, k, group_size, q.data(), scales.data());
  pack_weights_into(f, q.data(), scales.data(), n, k, group_size, out, true);
}

QuantWeights quantize_weights(QuantFormat f, const uint16_t* w, int64_t n, int64_t k,
                              int64_t group_size) {
  check_quant_shape("quantize_weights", f, n, k, group_size);
  QuantWeights out = allocate(f, n, k, group_size);
  quantize_weights_into(f, w, n, k, group_size, out.storage.get());
  return out;
}

QuantWeights pack_weights(QuantFormat f, const int8_t* q, const float* scales, int64_t n, int64_t k,
                          int64_t group_size) {
  check_quant_shape("pack_weights", f, n, k, group_size);
  QuantWeights out = allocate(f, n, k, group_size);
  pack_weights_into(f, q, scales, n, k, group_size, out.storage.get(), true);
  return out;
}

QuantWeights quantize_weights_int8(const uint16_t* w, int64_t n, int64_t k, int64_t group_size) {
  return quantize_weights(QuantFormat::kInt8, w, n, k, group_size);
}

QuantWeights pack_weights_int8(const int8_t* q, const float* scales, int64_t n, int64_t k,
                               int64_t group_size) {
  return pack_weights(QuantFormat::kInt8, q, scales, n, k, group_size);
}

void int4_to_nibbles(const int8_t* q, int64_t count, uint8_t* out) {
  for (int64_t i = 0; i + 1 < count; i += 2)
    out[i / 2] = uint8_t((q[i] + 8) | ((q[i + 1] + 8) << 4));
}

void nibbles_to_int4(const uint8_t* nibbles, int64_t count, int8_t* q, const char* what) {
  for (int64_t i = 0; i < count; ++i) {
    const int u = (nibbles[i / 2] >> (4 * (i % 2))) & 15;
    if (u == 0)
      fail(
          "{}: element {} is the nibble 0 (q = -8); symmetric int4 weights are stored as q + 8 "
          "in [1, 15]",
          what, i);
    q[i] = int8_t(u - 8);
  }
}

}  // namespace sluice::cpu
