#include "model/presets.h"

#include <fmt/format.h>

#include "core/error.h"

namespace sluice {

namespace {

ModelConfig mixtral(int vocab, int hidden, int intermediate, int layers, int heads, int kv_heads,
                    int experts, int top_k, int max_positions) {
  ModelConfig c;
  c.family = Family::Mixtral;
  c.architecture = "MixtralForCausalLM";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.expert_intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.num_experts = experts;
  c.experts_per_token = top_k;
  c.rope_theta = 1e6f;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = max_positions;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.dtype = DType::BF16;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig config;
};

const std::vector<Preset>& presets() {
  // Shapes from the published config.json of each model.
  static const std::vector<Preset> all = {
      {"mixtral-8x7b", mixtral(32000, 4096, 14336, 32, 32, 8, 8, 2, 32768)},
      {"mixtral-8x22b", mixtral(32000, 6144, 16384, 56, 48, 8, 8, 2, 65536)},
      // Small enough for unit tests, with every dimension distinct so layout bugs show.
      {"tiny-mixtral", mixtral(384, 64, 96, 2, 4, 2, 8, 2, 4096)},
  };
  return all;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

ModelConfig preset_config(const std::string& name, int layers) {
  for (const auto& p : presets()) {
    if (name != p.name) continue;
    ModelConfig c = p.config;
    if (layers < 0 || layers > c.num_layers)
      fail("--layers {}: preset '{}' has {} layers", layers, name, c.num_layers);
    if (layers > 0) c.num_layers = layers;
    return c;
  }
  fail("unknown preset '{}'; available: {}", name, fmt::join(preset_names(), ", "));
}

}  // namespace sluice
