// Rotary position embedding, Hugging Face "rotate_half" layout: in each head vector the first
// rotary_dim dims are rotated, pairing dim i with dim i + rotary_dim/2 (i < rotary_dim/2):
//   out[i]        = x[i]·cos(a_i) − x[i + half]·sin(a_i)
//   out[i + half] = x[i + half]·cos(a_i) + x[i]·sin(a_i)
// with a_i = pos · inv_freq[i] and inv_freq[i] = theta^(−2i / rotary_dim).
//
// The angles are computed as transformers computes them in fp32, because at long positions
// (pos·inv_freq up to ~1e5 rad) the rounding of the product decides the result:
//   inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))   → rope_inv_freq()
//   freqs = inv_freq[None, :].float() @ pos[:, None].float()          → float(pos) * inv_freq[i]
//   cos, sin = freqs.cos(), freqs.sin()                                 → cos/sin of that float
// (the fp32 power and reciprocal here are powf and a float division; torch's vectorised pow can
// differ by an ulp). transformers then casts cos/sin to the activation dtype (bf16 for a bf16
// model); sluice keeps activations and cos/sin in fp32. Scaled RoPE variants (YaRN, llama3,
// dynamic NTK) change inv_freq: pass your own table; YaRN also multiplies cos and sin by its
// attention factor (`scale`).
//
// `interleaved` pairs adjacent dims (x[2i], x[2i+1]) by frequency i instead (DeepSeek's complex
// form, transformers' rope_interleave):
//   out[2i] = x[2i]·cos(a_i) − x[2i+1]·sin(a_i),  out[2i+1] = x[2i+1]·cos(a_i) + x[2i]·sin(a_i)
// Its rotation is the scalar loop at every ISA level (MLA rotates 64 values per head, next to
// the 2·kv_lora_rank-wide dot products per position of its attention).
#pragma once

#include <cstdint>
#include <vector>

namespace sluice::cpu {

std::vector<float> rope_inv_freq(int rotary_dim, float theta);

struct RopeArgs {
  float* x = nullptr;  // [rows, n_heads, head_dim] rotated in place; rows row_stride floats apart
  int64_t rows = 0;
  int n_heads = 0, head_dim = 0;
  int rotary_dim = 0;                  // 0: head_dim; must be even and <= head_dim
  int64_t row_stride = 0;              // 0: n_heads·head_dim
  const int32_t* positions = nullptr;  // [rows]
  const float* inv_freq = nullptr;     // [rotary_dim / 2], e.g. from rope_inv_freq
  bool interleaved = false;
  float scale = 1.0f;  // cos and sin multiplied by it
};

void apply_rope(const RopeArgs& args);
void apply_rope_reference(const RopeArgs& args);

}  // namespace sluice::cpu
