// llama.cpp's reference quantisers of ggml's Q8_0 and Q4_0 blocks (quantize_row_q8_0_ref and
// quantize_row_q4_0_ref; the layouts are io/gguf_dequant.h's). `n` is a multiple of 32.
#pragma once

#include <cstdint>
#include <vector>

namespace sluice {

// n / 32 blocks of 34 bytes: f16 d = max|x| / 127, int8 q = round(x / d).
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
// n / 32 blocks of 18 bytes: f16 d = (the value of largest magnitude) / -8, nibbles
// q = min(15, int(x / d + 8.5)), value j in the low nibble of byte j and value j + 16 in its high.
void quantize_q4_0(const float* x, int64_t n, uint8_t* out);

std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n);
std::vector<uint8_t> quantize_q4_0(const float* x, int64_t n);

}  // namespace sluice
