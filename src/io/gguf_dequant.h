// Dequantisation of llama.cpp's block formats to fp32, plain and scalar: it runs once, at load.
// Each block of `block_elements` values (ggml_type_info) is a scale (and for some a minimum) in
// f16 and small integers; the layouts are ggml-common.h's block_q8_0, block_q4_0, block_q4_K,
// block_q5_K and block_q6_K.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice {

// Q8_0, 32 values in 34 bytes: f16 d, int8 q[32]; x = d·q.
void dequantize_q8_0(const void* src, float* dst, int64_t n);
// Q4_0, 32 values in 18 bytes: f16 d, 16 bytes of nibbles; value j in the low nibble of byte j,
// value j+16 in the high one; x = d·(q - 8).
void dequantize_q4_0(const void* src, float* dst, int64_t n);
// Q4_K, 256 values in 144 bytes: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128
// bytes of nibbles; sub-block s of 32: x = d·scale_s·q - dmin·min_s.
void dequantize_q4_k(const void* src, float* dst, int64_t n);
// Q5_K, 256 values in 176 bytes: as Q4_K, with a fifth bit per value in 32 bytes of high bits.
void dequantize_q5_k(const void* src, float* dst, int64_t n);
// Q6_K, 256 values in 210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8
// scales (one per 16 values), f16 d last; x = d·scale·(q - 32).
void dequantize_q6_k(const void* src, float* dst, int64_t n);

// Dequantises n values of ggml type `type` (one of the above); false for any other type.
bool dequantize(uint32_t type, const void* src, float* dst, int64_t n);
// The same for `rows` rows of `row` values (whole blocks each), rounded to bf16 (nearest even) row
// by row, as sluice holds them: what loading a GGUF file does, and the disk tier as each expert
// lands. False for a type not above.
bool dequantize_to_bf16(uint32_t type, const void* src, uint16_t* dst, int64_t rows, int64_t row);

}  // namespace sluice
