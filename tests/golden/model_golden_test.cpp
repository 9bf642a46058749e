// Golden tests: sluice's ReferenceForward against an independent PyTorch transcription of
// transformers' modeling code of each family (tests/reference/moe_reference.py), intermediate by
// intermediate, on tiny random models with deliberately awkward shapes that exercise every quirk
// of the family.
//
// PyTorch runs each sequence at once without a cache; sluice runs a prefill followed by
// single-token decode steps, so the KV cache and the position bookkeeping are checked too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";
constexpr int kSequence = 12;  // tokens per model
constexpr int kPrefill = 8;    // of which sluice runs this many at once, then one by one

// Largest error accepted, relative to the largest magnitude of the reference row. Both sides
// compute in fp32 and differ only in summation order: the errors seen are at most 1.7e-6
// (intermediates) and 8e-7 (logits), so 1e-5 holds with a margin while any semantic slip
// (a mask off by one, a wrong KV head, unnormalised routing) lands at 1e-2 or above.
constexpr double kRelativeTolerance = 1e-5;

struct GoldenCase {
  std::string name;
  ModelConfig config;
  size_t shard_bytes = size_t(4) << 30;        // small values force a sharded checkpoint
  bool rope_theta_in_rope_parameters = false;  // the transformers 5.x config layout
  bool omit_num_key_value_heads = false;       // the config class's default applies
  int qwen_sparse_step = 0;  // > 0: dense layers written as decoder_sparse_step, not a list
};

// Names the case in failure messages instead of gtest's byte dump.
void PrintTo(const GoldenCase& g, std::ostream* os) {
  *os << g.name;
}

ModelConfig base_config(const char* preset = "tiny-mixtral") {
  ModelConfig c = preset_config(preset);
  c.vocab_size = 301;  // odd, and above the 259 ids the synthetic tokenizer needs
  c.num_layers = 3;
  return c;
}

void add_qwen3_moe_cases(std::vector<GoldenCase>& cases) {
  {
    // Per-head q/k norms, head_dim 20 unrelated to hidden 44 / 4 heads, GQA 4x2, top-3 of 7
    // renormalised (norm_topk_prob).
    GoldenCase g{"Qwen3MoeGqa4x2HeadDim20Top3of7Bf16", base_config("tiny-qwen3-moe")};
    ModelConfig& c = g.config;
    c.hidden_size = 44;
    c.head_dim = 20;
    c.expert_intermediate_size = 26;
    c.num_experts = 7;
    c.experts_per_token = 3;
    cases.push_back(g);
  }
  {
    // No renormalisation, q/k/v/o biases (attention_bias), layers 0 and 2 dense (written as
    // decoder_sparse_step 2), a sliding window (use_sliding_window), fp32, top-2 of 5.
    GoldenCase g{"Qwen3MoeBiasesDenseLayersWindowNoRenormF32", base_config("tiny-qwen3-moe")};
    ModelConfig& c = g.config;
    c.hidden_size = 36;
    c.num_heads = 6;
    c.num_kv_heads = 3;
    c.head_dim = 10;
    c.normalize_topk = false;
    c.qkv_bias = c.o_bias = true;
    c.dense_layers = {0, 2};
    c.dense_intermediate_size = 58;
    c.expert_intermediate_size = 22;
    c.num_experts = 5;
    c.experts_per_token = 2;
    c.sliding_window = 5;
    c.rope_theta = 300.f;
    c.dtype = DType::F32;
    g.qwen_sparse_step = 2;
    cases.push_back(g);
  }
  {
    // One KV head, tied embeddings, layer 1 dense by mlp_only_layers, F16, default KV heads
    // (Qwen3MoeConfig's 4) from a config.json without num_key_value_heads.
    GoldenCase g{"Qwen3MoeDefaultKv4MlpOnlyLayer1TiedF16", base_config("tiny-qwen3-moe")};
    ModelConfig& c = g.config;
    c.num_heads = 8;
    c.num_kv_heads = 4;
    c.head_dim = 6;
    c.tie_word_embeddings = true;
    c.dense_layers = {1};
    c.dense_intermediate_size = 30;
    c.dtype = DType::F16;
    g.omit_num_key_value_heads = true;
    cases.push_back(g);
  }
}

void add_olmoe_cases(std::vector<GoldenCase>& cases) {
  {
    // q/k norms over the whole projection, one KV head per query head as published, top-3 of 7
    // without renormalisation.
    GoldenCase g{"OlmoeMha4Top3of7NoRenormBf16", base_config("tiny-olmoe")};
    ModelConfig& c = g.config;
    c.hidden_size = 48;
    c.num_kv_heads = 4;
    c.head_dim = 12;
    c.num_experts = 7;
    c.experts_per_token = 3;
    c.expert_intermediate_size = 34;
    cases.push_back(g);
  }
  {
    // clip_qkv after the norms (0.8: most of q, k and v clamp), biases, grouped KV heads (k_norm
    // over 2 heads), renormalised (norm_topk_prob), fp32.
    GoldenCase g{"OlmoeGqaClip0p8BiasesRenormF32", base_config("tiny-olmoe")};
    ModelConfig& c = g.config;
    c.clip_qkv = 0.8f;
    c.qkv_bias = c.o_bias = true;
    c.normalize_topk = true;
    c.rope_theta = 500.f;
    c.dtype = DType::F32;
    cases.push_back(g);
  }
  {
    // No num_key_value_heads in config.json (OlmoeConfig: one per query head), tied, F16,
    // sharded.
    GoldenCase g{"OlmoeDefaultKvHeadsTiedF16Sharded", base_config("tiny-olmoe")};
    ModelConfig& c = g.config;
    c.num_heads = 8;
    c.num_kv_heads = 8;
    c.head_dim = 8;
    c.tie_word_embeddings = true;
    c.dtype = DType::F16;
    g.omit_num_key_value_heads = true;
    g.shard_bytes = 40 << 10;
    cases.push_back(g);
  }
}

void add_qwen2_moe_cases(std::vector<GoldenCase>& cases) {
  {
    // q/k/v biases, the sigmoid-gated shared expert, head_dim 14 unrelated to hidden 48, top-3
    // of 7 without renormalisation.
    GoldenCase g{"Qwen2MoeSharedExpertBiasesTop3of7Bf16", base_config("tiny-qwen2-moe")};
    ModelConfig& c = g.config;
    c.hidden_size = 48;
    c.head_dim = 14;
    c.num_experts = 7;
    c.experts_per_token = 3;
    c.expert_intermediate_size = 26;
    c.shared_expert_intermediate_size = 52;
    cases.push_back(g);
  }
  {
    // Layer 1 dense (mlp_only_layers), no q/k/v biases (qkv_bias false), renormalised, fp32.
    GoldenCase g{"Qwen2MoeDenseLayer1NoQkvBiasRenormF32", base_config("tiny-qwen2-moe")};
    ModelConfig& c = g.config;
    c.dense_layers = {1};
    c.qkv_bias = false;
    c.normalize_topk = true;
    c.rope_theta = 400.f;
    c.dtype = DType::F32;
    cases.push_back(g);
  }
  {
    // No num_key_value_heads (Qwen2MoeConfig's 16), decoder_sparse_step 3 (layers 0 and 1 dense,
    // 2 MoE), tied, F16.
    GoldenCase g{"Qwen2MoeDefaultKv16SparseStep3TiedF16", base_config("tiny-qwen2-moe")};
    ModelConfig& c = g.config;
    c.num_heads = 16;
    c.num_kv_heads = 16;
    c.head_dim = 4;
    c.dense_layers = {0, 1};
    c.tie_word_embeddings = true;
    c.dtype = DType::F16;
    g.omit_num_key_value_heads = true;
    g.qwen_sparse_step = 3;
    cases.push_back(g);
  }
}

// DBRX: LayerNorm without bias, the fused Wqkv clamped before its split, flat experts with w2
// stored transposed; head_dim is always hidden / heads.
void add_dbrx_cases(std::vector<GoldenCase>& cases) {
  {
    // The preset: GQA 4x2, clip_qkv 1.5 (a share of q/k/v clamps), top-3 of 7 renormalised.
    GoldenCase g{"DbrxGqa4x2Clip1p5Top3of7Bf16", base_config("tiny-dbrx")};
    cases.push_back(g);
  }
  {
    // Multi-head 3x3 of head_dim 16, a tight clip of 0.6, moe_normalize_expert_weights null (no
    // renormalisation), fp32, a sharded checkpoint (the fused Wqkv written once).
    GoldenCase g{"DbrxMha3Clip0p6NoRenormF32Sharded", base_config("tiny-dbrx")};
    ModelConfig& c = g.config;
    c.hidden_size = 48;
    c.num_heads = 3;
    c.num_kv_heads = 3;
    c.head_dim = 16;
    c.clip_qkv = 0.6f;
    c.normalize_topk = false;
    c.rope_theta = 300.f;
    c.dtype = DType::F32;
    g.shard_bytes = 40 << 10;
    cases.push_back(g);
  }
  {
    // One KV head, no clip_qkv (null), top-1 of 5, F16.
    GoldenCase g{"DbrxMqa4NoClipTop1of5F16", base_config("tiny-dbrx")};
    ModelConfig& c = g.config;
    c.num_kv_heads = 1;
    c.clip_qkv = 0;
    c.num_experts = 5;
    c.experts_per_token = 1;
    c.expert_intermediate_size = 24;
    c.dtype = DType::F16;
    cases.push_back(g);
  }
}

void add_deepseek_cases(std::vector<GoldenCase>& cases) {
  {
    // V2-Lite: MLA without q-LoRA, greedy softmax routing, shared experts, layer 0 dense
    // (first_k_dense_replace), YaRN with mscale = mscale_all_dim (attention factor 1, the
    // softmax scale corrected), top-3 of 8.
    GoldenCase g{"DeepseekV2LiteNoQLoraGreedyYarnBf16", base_config("tiny-deepseek-v2-lite")};
    g.config.rope_theta = 500.f;
    cases.push_back(g);
  }
  {
    // V2: q-LoRA, group_limited_greedy (4 groups of 3, the best 2 by their max), routed
    // scaling 16, YaRN with mscale 1 and mscale_all_dim 0.8 (attention factor above 1), fp32.
    GoldenCase g{"DeepseekV2QLoraGroupLimitedYarnF32", base_config("tiny-deepseek-v2")};
    ModelConfig& c = g.config;
    c.rope_theta = 500.f;
    c.rope_scaling.mscale = 1.f;
    c.rope_scaling.mscale_all_dim = 0.8f;
    c.dtype = DType::F32;
    cases.push_back(g);
  }
  {
    // V3: sigmoid scores, e_score_correction_bias for the choice only, 4 groups of 4 scored by
    // their top-2 sums, 2 kept, top-4 renormalised and scaled by 2.5, two dense layers first
    // (first_k_dense_replace 2) of 4, q-LoRA, YaRN, interleaved RoPE.
    GoldenCase g{"DeepseekV3SigmoidBiasGroupTop2DenseFirst2Bf16", base_config("tiny-deepseek-v3")};
    ModelConfig& c = g.config;
    c.num_layers = 4;
    c.rope_theta = 500.f;
    c.fp8_weights = false;
    cases.push_back(g);
  }
  {
    // V3 as released: every projection F8_E4M3 with 128 x 128 block scales (weight_scale_inv),
    // the embedding, norms, router and lm_head bf16. Hidden 160 and a dense MLP of 136 make
    // two blocks, the second partial, along rows and columns; sharded, so scales and weights
    // are found across files.
    GoldenCase g{"DeepseekV3Fp8BlockScalesPartialBlocksSharded", base_config("tiny-deepseek-v3")};
    ModelConfig& c = g.config;
    c.num_layers = 4;
    c.rope_theta = 500.f;
    c.hidden_size = 160;
    c.dense_intermediate_size = 136;
    g.shard_bytes = 40 << 10;
    cases.push_back(g);
  }
  {
    // V3 without rope_interleave (rotate_half on the RoPE part), without YaRN, without
    // renormalisation, one group of all 16 experts, no q-LoRA, F16, sharded.
    GoldenCase g{"DeepseekV3HalvesRopeNoYarnNoRenormOneGroupF16", base_config("tiny-deepseek-v3")};
    ModelConfig& c = g.config;
    c.rope_interleaved = false;
    c.rope_scaling = RopeScaling{};
    c.normalize_topk = false;
    c.expert_groups = c.groups_per_token = 1;
    c.mla.q_lora_rank = 0;
    c.rope_theta = 300.f;
    c.dtype = DType::F16;
    c.fp8_weights = false;
    g.shard_bytes = 40 << 10;
    cases.push_back(g);
  }
}

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> cases;
  {
    // Grouped-query attention, hidden size unrelated to heads × head_dim, top-3 of 5 experts.
    GoldenCase g{"Gqa6x2Top3of5Bf16", base_config()};
    ModelConfig& c = g.config;
    c.hidden_size = 50;
    c.num_heads = 6;
    c.num_kv_heads = 2;
    c.head_dim = 24;
    c.expert_intermediate_size = 36;
    c.num_experts = 5;
    c.experts_per_token = 3;
    c.dtype = DType::BF16;
    cases.push_back(g);
  }
  {
    // Plain multi-head attention with a sliding window shorter than the prefill, top-1 routing.
    GoldenCase g{"Mha4Window5Top1of7F32", base_config()};
    ModelConfig& c = g.config;
    c.hidden_size = 72;
    c.num_heads = 4;
    c.num_kv_heads = 4;
    c.head_dim = 40;
    c.expert_intermediate_size = 44;
    c.num_experts = 7;
    c.experts_per_token = 1;
    c.sliding_window = 5;
    c.rope_theta = 10000.f;
    c.dtype = DType::F32;
    cases.push_back(g);
  }
  {
    // One KV head shared by all, tied embeddings, F16, a sharded checkpoint, rope_parameters.
    GoldenCase g{"Mqa3TiedWindow5Top3of7F16Sharded", base_config()};
    ModelConfig& c = g.config;
    c.vocab_size = 263;
    c.hidden_size = 40;
    c.num_heads = 3;
    c.num_kv_heads = 1;
    c.head_dim = 24;
    c.expert_intermediate_size = 28;
    c.num_experts = 7;
    c.experts_per_token = 3;
    c.sliding_window = 5;
    c.tie_word_embeddings = true;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 500.f;  // fast rotations, so a RoPE slip shows within 12 positions
    c.dtype = DType::F16;
    g.shard_bytes = 40 << 10;
    g.rope_theta_in_rope_parameters = true;
    cases.push_back(g);
  }
  {
    // The preset itself (head_dim 16, top-2 of 8) with a window equal to the prefill length.
    GoldenCase g{"TinyMixtralPresetWindow8", base_config()};
    g.config.sliding_window = 8;
    cases.push_back(g);
  }
  {
    // config.json without num_key_value_heads: transformers takes MixtralConfig's default of 8
    // KV heads (not one per query head), so 16 query heads share them in pairs.
    GoldenCase g{"Heads16DefaultKv8Top2of5", base_config()};
    ModelConfig& c = g.config;
    c.hidden_size = 48;
    c.num_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = 6;
    c.num_experts = 5;
    c.expert_intermediate_size = 20;
    c.rope_theta = 100.f;
    g.omit_num_key_value_heads = true;
    cases.push_back(g);
  }
  add_qwen3_moe_cases(cases);
  add_olmoe_cases(cases);
  add_qwen2_moe_cases(cases);
  add_dbrx_cases(cases);
  add_deepseek_cases(cases);
  return cases;
}

// Deterministic token ids in [0, vocab), including both ends of the vocabulary.
std::vector<int> test_tokens(int vocab_size, int salt) {
  std::vector<int> ids(kSequence);
  uint64_t state = 0x2545f4914f6cdd1dull + uint64_t(salt);
  for (int i = 0; i < kSequence; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = int((state >> 33) % uint64_t(vocab_size));
  }
  ids[1] = 0;
  ids[kSequence - 2] = vocab_size - 1;
  ids[5] = ids[4];  // a repeated token at different positions
  return ids;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Rewrites config.json into the layout a case asks for.
void edit_config(const GoldenCase& g, const fs::path& config_json) {
  nlohmann::json j;
  std::ifstream(config_json) >> j;
  if (g.rope_theta_in_rope_parameters) {  // as transformers 5.x writes it
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", j["rope_theta"]}};
    j.erase("rope_theta");
  }
  if (g.omit_num_key_value_heads) j.erase("num_key_value_heads");
  if (g.qwen_sparse_step > 0) {
    j["decoder_sparse_step"] = g.qwen_sparse_step;
    j["mlp_only_layers"] = nlohmann::json::array();
  }
  std::ofstream(config_json) << j.dump(2);
}

// The position of a case in golden_cases(): it salts the case's weights and tokens.
int case_salt(const GoldenCase& g) {
  int salt = 0;
  for (const GoldenCase& other : golden_cases()) {
    if (other.name == g.name) break;
    ++salt;
  }
  return salt;
}

// A temporary folder holding one case's checkpoint and reference dump, made when the case first
// asks for it. ctest runs every case in a process of its own, so one Python batch over all cases
// would be recomputed by each of them; one job per case keeps the suite's time linear in the cases.
class GoldenWorkspace {
 public:
  static GoldenWorkspace& get(const GoldenCase& g) {
    static std::map<std::string, std::unique_ptr<GoldenWorkspace>> made;
    std::unique_ptr<GoldenWorkspace>& w = made[g.name];
    if (!w) w.reset(new GoldenWorkspace(g));
    return *w;
  }

  std::string skip_reason;  // non-empty: PyTorch is not available
  std::string error;        // non-empty: the reference failed
  fs::path dir;

  fs::path model_dir(const std::string& name) const { return dir / name; }
  fs::path dump_path(const std::string& name) const { return dir / (name + ".safetensors"); }

  ~GoldenWorkspace() {
    std::error_code ignored;
    if (!dir.empty()) fs::remove_all(dir, ignored);
  }

 private:
  explicit GoldenWorkspace(const GoldenCase& g) {
    const std::string probe = std::string(kPython) + " -c 'import torch' >/dev/null 2>&1";
    if (std::system(probe.c_str()) != 0) {
      skip_reason = std::string(kPython) +
                    " cannot import torch; install Debian's python3-torch to run the golden tests";
      return;
    }
    dir = fs::temp_directory_path() /
          ("sluice-golden-" + std::to_string(::getpid()) + "-" + g.name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    nlohmann::json jobs = nlohmann::json::array();
    const int salt = case_salt(g);
    write_random_checkpoint(g.config, model_dir(g.name), /*seed=*/1000 + salt, g.shard_bytes);
    edit_config(g, model_dir(g.name) / "config.json");
    jobs.push_back({{"model", model_dir(g.name).string()},
                    {"tokens", test_tokens(g.config.vocab_size, salt)},
                    {"out", dump_path(g.name).string()}});
    const fs::path jobs_file = dir / "jobs.json";
    std::ofstream(jobs_file) << jobs.dump(2);
    const fs::path log = dir / "reference.log";
    const std::string command = std::string(kPython) + " " +
                                shell_quote(SLUICE_SOURCE_DIR "/tests/reference/moe_reference.py") +
                                " --batch " + shell_quote(jobs_file.string()) + " >" +
                                shell_quote(log.string()) + " 2>&1";
    if (std::system(command.c_str()) != 0) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      error = "the PyTorch reference failed: " + command + "\n" + text;
    }
  }
};

// Every named intermediate sluice emits, gathered by name as [position][column] across the
// prefill call and the decode calls.
struct Collected {
  std::map<std::string, std::vector<std::vector<float>>> rows;
  void add(const std::string& name, const float* data, int row_count, int cols) {
    auto& dst = rows[name];
    for (int r = 0; r < row_count; ++r)
      dst.emplace_back(data + size_t(r) * cols, data + size_t(r + 1) * cols);
  }
};

struct RowError {
  double relative = 0;  // max |a - b| / max |b| over the row
  double absolute = 0;
};

RowError compare_row(const float* got, const float* want, int n) {
  double max_diff = 0, max_ref = 0;
  for (int i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(want[i])));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  return {max_ref > 0 ? max_diff / max_ref : max_diff, max_diff};
}

int argmax(const float* v, int n) {
  return int(std::max_element(v, v + n) - v);
}

class ModelGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(ModelGolden, ReferenceForwardMatchesPyTorch) {
  const GoldenCase& g = GetParam();
  GoldenWorkspace& ws = GoldenWorkspace::get(g);
  if (!ws.skip_reason.empty()) GTEST_SKIP() << ws.skip_reason;
  ASSERT_TRUE(ws.error.empty()) << ws.error;
  const std::vector<int> tokens = test_tokens(g.config.vocab_size, case_salt(g));

  const bool sharded = fs::exists(ws.model_dir(g.name) / "model.safetensors.index.json");
  ASSERT_EQ(sharded, g.shard_bytes < (size_t(1) << 20))
      << "the checkpoint layout is not the intended one";
  Model model = load_model(ws.model_dir(g.name));
  ASSERT_EQ(model.config.rope_theta, g.config.rope_theta);
  ASSERT_EQ(model.config.num_kv_heads, g.config.num_kv_heads);
  for (int l = 0; l < g.config.num_layers; ++l)
    ASSERT_EQ(model.config.is_moe_layer(l), g.config.is_moe_layer(l)) << "layer " << l;
  ReferenceForward forward(model);
  Collected got;
  auto dump = [&](const std::string& name, const float* data, int rows, int cols) {
    got.add(name, data, rows, cols);
  };
  forward.forward(std::span<const int>(tokens).first(kPrefill), dump);
  for (int t = kPrefill; t < kSequence; ++t)
    forward.forward(std::span<const int>(tokens).subspan(t, 1), dump);

  SafetensorsFile reference = SafetensorsFile::open(ws.dump_path(g.name));
  std::vector<std::string> expected_names = {"embed"};
  for (int l = 0; l < model.config.num_layers; ++l)
    for (const char* part : {"attn_out", "moe_out", "out"})
      expected_names.push_back("layer." + std::to_string(l) + "." + part);
  expected_names.push_back("final_norm");
  expected_names.push_back("logits");
  ASSERT_EQ(got.rows.size(), expected_names.size());
  ASSERT_EQ(reference.tensors().size(), expected_names.size());

  RowError worst_intermediate;
  std::string worst_intermediate_name;
  for (const std::string& name : expected_names) {
    ASSERT_TRUE(got.rows.count(name)) << "sluice emitted no '" << name << "'";
    auto it = reference.tensors().find(name);
    ASSERT_NE(it, reference.tensors().end()) << "the reference wrote no '" << name << "'";
    const Tensor want = it->second.view();
    ASSERT_EQ(want.dtype, DType::F32);
    ASSERT_EQ(want.shape.size(), 2u);
    ASSERT_EQ(want.shape[0], kSequence) << name;
    const int cols = int(want.shape[1]);
    const auto& rows = got.rows[name];
    ASSERT_EQ(int(rows.size()), kSequence) << name;
    RowError worst;
    int worst_position = 0;
    for (int t = 0; t < kSequence; ++t) {
      ASSERT_EQ(int(rows[t].size()), cols) << name;
      const float* ref_row = want.as<float>() + size_t(t) * cols;
      RowError e = compare_row(rows[t].data(), ref_row, cols);
      EXPECT_LE(e.relative, kRelativeTolerance)
          << name << " at position " << t << ": max |sluice - torch| = " << e.absolute;
      if (e.relative > worst.relative) {
        worst = e;
        worst_position = t;
      }
      if (name == "logits") {
        EXPECT_EQ(argmax(rows[t].data(), cols), argmax(ref_row, cols))
            << "greedy token differs at position " << t;
      }
    }
    RecordProperty(name + ".max_relative_error", std::to_string(worst.relative));
    if (name != "logits" && worst.relative >= worst_intermediate.relative) {
      worst_intermediate = worst;
      worst_intermediate_name = name + " at position " + std::to_string(worst_position);
    }
    if (name == "logits")
      std::printf("  logits: max relative error %.2e (position %d, abs %.2e)\n", worst.relative,
                  worst_position, worst.absolute);
  }
  std::printf("  worst intermediate: %s, relative error %.2e\n", worst_intermediate_name.c_str(),
              worst_intermediate.relative);
}

std::string case_name(const ::testing::TestParamInfo<GoldenCase>& param) {
  return param.param.name;
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ModelGolden, ::testing::ValuesIn(golden_cases()), case_name);

}  // namespace
}  // namespace sluice
