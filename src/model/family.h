// The families sluice loads, each a description in one file (family_<name>.cpp): how its
// config.json reads into ModelConfig, how its tensors map onto the canonical weights, and the
// tokenizer make-model writes for it. Adding a family is adding one such file and its line in
// family.cpp; nothing outside src/model/ changes unless the family brings a feature the
// canonical description (config.h, weights.h) lacks.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/config_reader.h"
#include "model/gguf_naming.h"
#include "model/tensor_table.h"

namespace sluice {

// The synthetic tokenizer of a family's make-model presets: byte-level BPE (merges learned from
// a built-in text) with the family's special tokens, pre-tokenizer and chat template, so chat
// prompts go through the family's real template. Special tokens take ids [0, specials.size()).
struct TokenizerStyle {
  std::vector<std::string> specials;
  int bos = -1;  // index into specials; -1: none
  int eos = 0;
  int unk = -1;
  bool add_bos = false;
  // io/tokenizer's split pattern of that name ("qwen2", "cl100k") before a ByteLevel step without
  // its regex, as the family's tokenizer.json has it; null: GPT-2's ByteLevel regex.
  const char* split_pattern = nullptr;
  bool nfc = false;  // an NFC normalizer first
  const char* chat_template = nullptr;
};

struct FamilySpec {
  Family family;
  const char* model_type;    // config.json's model_type, also family_name()
  const char* architecture;  // config.json's architectures[0]
  // Reads the whole config.json (with the helpers of config_reader.h); c.family and
  // c.architecture are set already.
  void (*read_config)(const ConfigReader& r, ModelConfig& c);
  // Writes config.json as the family's checkpoints spell it; read_config(write_config(c)) == c.
  void (*write_config)(const ModelConfig& c, nlohmann::json& j);
  // The strict table of the family's checkpoint tensors for config `c`.
  TensorTable (*tensor_table)(const ModelConfig& c, ModelWeights& w);
  TokenizerStyle tokenizer;
  // How llama.cpp's GGUF files spell the family; null: GGUF files of it are not read.
  const GgufNaming* gguf = nullptr;
};

std::span<const FamilySpec* const> all_families();
const FamilySpec& family_spec(Family f);
// The family whose GGUF naming has general.architecture `arch` and reads file `g` (deepseek2 is
// DeepSeek-V2 or V3 by its metadata); null when none does.
const FamilySpec* family_of_gguf(const GgufFile& g, std::string_view arch);

// Each family's description (family_<name>.cpp).
const FamilySpec& mixtral_family();
const FamilySpec& qwen3_moe_family();
const FamilySpec& olmoe_family();
const FamilySpec& qwen2_moe_family();
const FamilySpec& dbrx_family();
const FamilySpec& deepseek_v2_family();
const FamilySpec& deepseek_v3_family();

// Qwen's tokenizer (Qwen2-MoE and Qwen3-MoE alike): Qwen's split pattern, NFC, ChatML.
const TokenizerStyle& qwen_tokenizer_style();
// The GGUF names of Qwen's MoE block (routed and shared experts, dense MLP), shared by Qwen2-MoE,
// Qwen3-MoE and OLMoE.
const std::vector<GgufTensorName>& qwen_moe_gguf_tensor_names();

}  // namespace sluice
