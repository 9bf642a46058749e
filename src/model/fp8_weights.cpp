#include "model/fp8_weights.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config_reader.h"

namespace sluice {

void read_fp8_quantization_config(const nlohmann::json& j, const std::string& source,
                                  ModelConfig& c) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  const ConfigReader r = ConfigReader(j, source).object("quantization_config");
  const std::string method = r.string_or("quant_method", "");
  if (method != "fp8")
    r.fail_field("quant_method",
                 "expected \"fp8\" (block-scaled float8 weights), got \"{}\"; other quantized "
                 "checkpoints are not supported",
                 method);
  const std::string format = r.string_or("fmt", "e4m3");
  if (format != "e4m3") r.fail_field("fmt", "expected \"e4m3\", got \"{}\"", format);
  const std::string activations = r.string_or("activation_scheme", "dynamic");
  if (activations != "dynamic")
    r.fail_field("activation_scheme", "expected \"dynamic\", got \"{}\"", activations);
  const nlohmann::json block = r.doc().value("weight_block_size", nlohmann::json());
  if (block != nlohmann::json::array({cpu::kFp8Block, cpu::kFp8Block}))
    r.fail_field("weight_block_size", "expected [{}, {}] (the kernels' block), got {}",
                 cpu::kFp8Block, cpu::kFp8Block, block.dump());
  c.fp8_weights = true;
}

void write_fp8_quantization_config(const ModelConfig& c, nlohmann::json& j) {
  if (!c.fp8_weights) return;
  j["quantization_config"] = {{"activation_scheme", "dynamic"},
                              {"fmt", "e4m3"},
                              {"quant_method", "fp8"},
                              {"weight_block_size", {cpu::kFp8Block, cpu::kFp8Block}}};
}

std::string fp8_scale_name(const std::string& weight_name) {
  return weight_name + "_scale_inv";
}

Shape fp8_scale_shape(int64_t n, int64_t k) {
  return {(n + cpu::kFp8Block - 1) / cpu::kFp8Block, (k + cpu::kFp8Block - 1) / cpu::kFp8Block};
}

size_t fp8_matrix_bytes(int64_t n, int64_t k) {
  return size_t(n) * size_t(k) + size_t(shape_numel(fp8_scale_shape(n, k))) * 4;
}

size_t projection_bytes(const ModelConfig& c, int64_t n, int64_t k) {
  return c.fp8_weights ? fp8_matrix_bytes(n, k) : size_t(n) * size_t(k) * 2;
}

int64_t largest_fp8_matrix(const ModelConfig& c) {
  if (!c.fp8_weights) return 0;
  const int64_t H = c.hidden_size, qd = c.q_dim(), qa = c.mla.q_lora_rank;
  const bool latent = c.attention == AttentionKind::kLatent;
  int64_t most =
      std::max({latent && qa > 0 ? std::max(qa * H, qd * qa) : qd * H,
                (latent ? c.kv_cache_values_per_token() : c.kv_dim()) * H, H * c.attn_out_dim()});
  if (!c.expert_quant.quantized()) {
    if (c.num_experts > 0) most = std::max(most, int64_t(c.expert_intermediate_size) * H);
    for (int l = 0; l < c.num_layers; ++l) most = std::max(most, c.dense_mlp_size(l) * H);
  }
  return most;
}

int64_t fp8_tile_elements(const ModelConfig& c) {
  return std::min(largest_fp8_matrix(c), kFp8TileMaxElements);
}

bool fp8_slot_allowed(const ModelWeights& w, const Tensor* slot) {
  for (const LayerWeights& L : w.layers)
    for (const Tensor* t :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.q_a, &L.q_b, &L.kv_a, &L.kv_b, &L.expert_gate,
          &L.expert_up, &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down})
      if (t == slot) return true;
  return false;
}

cpu::Fp8Matrix fp8_matrix(const Tensor& t) {
  if (t.dtype != DType::F8_E4M3 || t.shape.size() != 2 || !t.block_scales)
    fail("fp8_matrix: expected an F8_E4M3 matrix with its block scales, got {} {}{}",
         dtype_name(t.dtype), shape_str(t.shape), t.block_scales ? "" : " without scales");
  return {t.as<const uint8_t>(), t.block_scales->as<const float>(), t.shape[0], t.shape[1]};
}

std::vector<uint16_t> matrix_bf16(const Tensor& t) {
  const int64_t n = t.shape[0], k = t.shape[1];
  std::vector<uint16_t> out(size_t(n * k));
  if (t.dtype == DType::F8_E4M3) {
    const cpu::Fp8Matrix w = fp8_matrix(t);
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
    for (int64_t j = 0; j < n; j += cpu::kFp8Block) {
      const int64_t rows = std::min(cpu::kFp8Block, n - j);
      cpu::dequantize_fp8(w, j, rows, 0, k, out.data() + j * k, k);
    }
  } else if (t.dtype == DType::BF16) {
    std::copy_n(t.as<const uint16_t>(), out.size(), out.data());
  } else {
    std::vector<float> f(out.size());
    to_f32(t.dtype, t.data, f.data(), f.size());
    for (size_t i = 0; i < f.size(); ++i) out[i] = f32_to_bf16(f[i]);
  }
  return out;
}

void quantize_fp8_blocks(const uint16_t* w, int64_t n, int64_t k, uint8_t* codes,
                         float* scale_inv) {
  constexpr float kFp8Max = 448.0f;
  const Shape blocks = fp8_scale_shape(n, k);
  for (int64_t bj = 0; bj < blocks[0]; ++bj) {
    for (int64_t bp = 0; bp < blocks[1]; ++bp) {
      const int64_t j0 = bj * cpu::kFp8Block, j1 = std::min(n, j0 + cpu::kFp8Block);
      const int64_t p0 = bp * cpu::kFp8Block, p1 = std::min(k, p0 + cpu::kFp8Block);
      float max_abs = 0;
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t p = p0; p < p1; ++p)
          max_abs = std::max(max_abs, std::fabs(bf16_to_f32(w[j * k + p])));
      const float scale = max_abs > 0 ? kFp8Max / max_abs : 1.0f;
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t p = p0; p < p1; ++p)
          codes[j * k + p] =
              f32_to_fp8_e4m3(std::clamp(bf16_to_f32(w[j * k + p]) * scale, -kFp8Max, kFp8Max));
      scale_inv[bj * blocks[1] + bp] = 1.0f / scale;
    }
  }
}

}  // namespace sluice
