// RMSNorm over rows: y = w ⊙ (x · 1/sqrt(mean(x²) + eps)), everything in fp32.
// (torch/transformers: hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + eps), then * weight.
// With bf16 activations transformers rounds the normalised row to bf16 before the weight
// multiply; sluice keeps activations in fp32 and does not.)
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace sluice::cpu {

struct RmsNormArgs {
  const float* x = nullptr;  // [rows, dim], rows x_stride apart (0: dim)
  float* y = nullptr;        // [rows, dim], rows y_stride apart (0: dim); may equal x
  int64_t rows = 0, dim = 0;
  const void* weight = nullptr;      // [dim]
  DType weight_dtype = DType::BF16;  // BF16 or F32
  float eps = 1e-5f;
  int64_t x_stride = 0, y_stride = 0;
};

void rms_norm(const RmsNormArgs& args);
void rms_norm_reference(const RmsNormArgs& args);  // sum of squares in double

// LayerNorm without bias over rows, on the same arguments: y = w ⊙ (x - mean) / sqrt(var + eps),
// var the biased variance (F.layer_norm(x, (dim,), w, None, eps), as DBRX's norms).
// Two passes over each row (mean, then centred squares) in fp32; LayerNorm runs on a few
// hidden-size rows per layer, so the plain loop is not worth vectorising.
void layer_norm(const RmsNormArgs& args);
void layer_norm_reference(const RmsNormArgs& args);  // sums in double

}  // namespace sluice::cpu
