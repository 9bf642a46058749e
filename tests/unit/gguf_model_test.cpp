// GGUF models (model/gguf_model.h): a tiny model of each family is written as a Hugging Face
// folder and converted to GGUF as llama.cpp's converter would (gguf_test_writer.h); both load
// to the same config and the reference forward pass gives the same logits. Quantised files
// (Q8_0, Q4_0) equal the folder's model with its weights quantised and dequantised the same way.
// Bad files are clear errors naming the file and the tensor or key.
#include "model/gguf_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "gguf_test_writer.h"
#include "io/chat_prompt.h"
#include "io/gguf.h"
#include "io/tokenizer.h"
#include "model/family.h"
#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

using testing::TempDir;

std::vector<float> logits_of(const Model& m) {
  std::vector<int> tokens;
  for (int i = 0; i < 9; ++i) tokens.push_back((i * 37 + 5) % m.config.vocab_size);
  ReferenceForward f(m);
  return f.forward(tokens);
}

// The HF folder of `c` with weights of seed 5, and its tokenizer.
void write_folder(const ModelConfig& c, const std::filesystem::path& dir) {
  write_random_checkpoint(c, dir, 5);
  write_synthetic_tokenizer(c, dir);
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(config_to_json(a).dump(), config_to_json(b).dump());
}

// Every family's tiny model, and the features its description switches on; those with FP8
// weights, which GGUF has not, are FP8CheckpointsAreWrittenDequantized's.
std::vector<testing::TinyModelCase> gguf_cases() {
  std::vector<testing::TinyModelCase> out;
  for (auto& c : testing::family_cases()) {
    ModelConfig config = preset_config("tiny-mixtral");
    c.edit(config);
    if (!config.fp8_weights) out.push_back(c);
  }
  return out;
}

// The float llama.cpp's files keep YaRN's mscale_all_dim in: 0.1 · it as f32 (the converter's
// yarn_log_multiplier), divided back at load.
float through_yarn_log_multiplier(float mscale_all_dim) {
  return float(double(float(0.1 * double(mscale_all_dim))) / 0.1);
}

// The folder's model as a GGUF of it holds it: without DeepSeek-V3's MTP layers (the converter
// leaves them out) and with YaRN's mscale as the file keeps it (DeepSeek's mscale equal to its
// mscale_all_dim, as llama.cpp's graph takes it).
Model as_gguf_holds_it(Model m) {
  m.config.mtp_layers = 0;
  RopeScaling& y = m.config.rope_scaling;
  if (m.config.attention == AttentionKind::kLatent && y.kind == RopeScalingKind::kYarn)
    y.mscale = y.mscale_all_dim = through_yarn_log_multiplier(y.mscale_all_dim);
  return m;
}

TEST(GgufModel, EveryFamilyGivesTheFolderLogitsInF32AndBF16) {
  const auto cases = gguf_cases();
  std::set<Family> families;
  for (const auto& tc : cases) {
    ModelConfig c = preset_config("tiny-mixtral");
    tc.edit(c);
    families.insert(c.family);
    TempDir dir;
    write_folder(c, dir / "hf");
    const Model hf = as_gguf_holds_it(load_model(dir / "hf"));
    const std::vector<float> want = logits_of(hf);
    for (GgufWeights w : {GgufWeights::kF32, GgufWeights::kBF16}) {
      SCOPED_TRACE(std::string(tc.name) + " " + gguf_weights_name(w));
      const auto path = export_gguf(dir / "hf", dir / "m.gguf", w);
      const Model g = load_model(path);
      expect_same_config(g.config, hf.config);
      EXPECT_EQ(g.weights.layers[0].wo.dtype, w == GgufWeights::kF32 ? DType::F32 : DType::BF16);
      // The same values in fp32 arithmetic: the same logits, bit for bit.
      EXPECT_EQ(logits_of(g), want);
    }
  }
  // Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE, DBRX, DeepSeek-V2 and DeepSeek-V3: every family.
  EXPECT_EQ(families.size(), all_families().size());
}

// Most mscales survive the file's f32 of 0.1 · mscale_all_dim (V2's 0.707 and V3's 1.0 do; the
// EveryFamily cases run them); 0.705 comes back one ulp off, and the logits are the folder's
// with that value, within 1e-5 of the folder's own.
TEST(GgufModel, YarnMscaleIsKeptToF32RoundingOfTheLogMultiplier) {
  EXPECT_EQ(through_yarn_log_multiplier(0.707f), 0.707f);
  EXPECT_EQ(through_yarn_log_multiplier(1.f), 1.f);
  ModelConfig c = preset_config("tiny-deepseek-v2-lite");
  c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = 0.705f;
  ASSERT_NE(through_yarn_log_multiplier(0.705f), 0.705f);
  TempDir dir;
  write_folder(c, dir / "hf");
  const Model g = load_model(export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kF32));
  EXPECT_EQ(g.config.rope_scaling.mscale_all_dim, through_yarn_log_multiplier(0.705f));
  EXPECT_NEAR(g.config.rope_scaling.mscale_all_dim, 0.705f, 1e-7f);
  EXPECT_EQ(logits_of(g), logits_of(as_gguf_holds_it(load_model(dir / "hf"))));
  const std::vector<float> got = logits_of(g), want = logits_of(load_model(dir / "hf"));
  ASSERT_EQ(got.size(), want.size());
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LT(worst, 1e-5f);
}

// llama.cpp's converter dequantises FP8 (code × block scale in fp32); in a BF16 file that is the
// bf16 the engine's FP8 GEMMs dequantise to, so the logits are the FP8 folder's.
TEST(GgufModel, FP8CheckpointsAreWrittenDequantized) {
  const ModelConfig c = preset_config("tiny-deepseek-v3");
  ASSERT_TRUE(c.fp8_weights);
  TempDir dir;
  write_folder(c, dir / "hf");
  const Model hf = as_gguf_holds_it(load_model(dir / "hf"));
  ASSERT_EQ(hf.weights.layers[0].q_a.dtype, DType::F8_E4M3);
  const Model g = load_model(export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kBF16));
  EXPECT_FALSE(g.config.fp8_weights);
  EXPECT_EQ(g.weights.layers[0].q_a.dtype, DType::BF16);
  EXPECT_EQ(logits_of(g), logits_of(hf));
}

// Files made before llama.cpp split kv_b_proj (one attn_kv_b per layer) load alike.
TEST(GgufModel, DeepSeekFilesWithAWholeKvBLoadAlike) {
  const ModelConfig c = preset_config("tiny-deepseek-v2");
  TempDir dir;
  write_folder(c, dir / "hf");
  const auto path =
      export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kBF16, 1, {}, GgufLatentKv::kWhole);
  const GgufFile file = GgufFile::open(path);
  EXPECT_NE(file.find_tensor("blk.0.attn_kv_b.weight"), nullptr);
  EXPECT_EQ(file.find_tensor("blk.0.attn_k_b.weight"), nullptr);
  EXPECT_EQ(logits_of(load_model(path)), logits_of(as_gguf_holds_it(load_model(dir / "hf"))));
}

TEST(GgufModel, QuantizedFilesEqualTheRoundTrippedWeights) {
  // Rows of 64 and 96 values: every matrix is stored quantised (the Qwen2-MoE case's shared expert
  // of 72 stays BF16, as llama.cpp falls back for rows that are not whole blocks; so do DBRX's
  // w2 rows of 40, and DeepSeek's q_b, k_b, v_b and o_proj rows of 40, 12, 24 and 40).
  for (const char* preset : {"tiny-mixtral", "tiny-qwen2-moe", "tiny-dbrx", "tiny-deepseek-v2"}) {
    const ModelConfig c = preset_config(preset);
    TempDir dir;
    write_folder(c, dir / "hf");
    for (GgufWeights w : {GgufWeights::kQ8_0, GgufWeights::kQ4_0}) {
      SCOPED_TRACE(std::string(preset) + " " + gguf_weights_name(w));
      Model want = as_gguf_holds_it(load_model(dir / "hf"));
      testing::round_trip_quantized(want, w);
      const Model g = load_model(export_gguf(dir / "hf", dir / "q.gguf", w));
      const Tensor& a = g.weights.layers[1].expert_gate;
      const Tensor& b = want.weights.layers[1].expert_gate;
      EXPECT_EQ(a.dtype, DType::BF16);
      ASSERT_EQ(a.shape, b.shape);
      EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0);
      EXPECT_EQ(logits_of(g), logits_of(want));
      // And quantisation changed the model: the check is not vacuous.
      EXPECT_NE(logits_of(g), logits_of(load_model(dir / "hf")));
    }
  }
}

TEST(GgufModel, SplitFilesLoadAsOneModel) {
  const ModelConfig c = preset_config("tiny-qwen3-moe");
  TempDir dir;
  write_folder(c, dir / "hf");
  const auto first = export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kBF16, 3);
  EXPECT_EQ(first.filename(), "m-00001-of-00003.gguf");
  EXPECT_TRUE(std::filesystem::exists(dir / "m-00003-of-00003.gguf"));
  EXPECT_EQ(logits_of(load_model(first)), logits_of(load_model(dir / "hf")));
}

TEST(GgufModel, LlamaCppNamesDimsAndRowPermutation) {
  const ModelConfig c = preset_config("tiny-mixtral");
  TempDir dir;
  write_folder(c, dir / "hf");
  const GgufFile g = GgufFile::open(export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kF32));
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size, E = c.num_experts;
  // Names and dims (fastest first) as llama.cpp's Mixtral files have them.
  EXPECT_EQ(g.find_tensor("blk.1.ffn_gate_exps.weight")->dims, (Shape{H, I, E}));
  EXPECT_EQ(g.find_tensor("blk.1.ffn_down_exps.weight")->dims, (Shape{I, H, E}));
  EXPECT_EQ(g.find_tensor("blk.0.ffn_gate_inp.weight")->dims, (Shape{H, E}));
  EXPECT_EQ(g.find_tensor("blk.0.attn_k.weight")->dims, (Shape{H, c.kv_dim()}));
  EXPECT_EQ(g.find_tensor("token_embd.weight")->dims, (Shape{H, c.vocab_size}));
  for (const char* name : {"output_norm.weight", "output.weight", "blk.0.attn_norm.weight",
                           "blk.0.ffn_norm.weight", "blk.0.attn_output.weight"})
    EXPECT_NE(g.find_tensor(name), nullptr) << name;
  EXPECT_EQ(g.integer("llama.expert_count"), E);
  EXPECT_EQ(g.integer("llama.feed_forward_length"), I);
  // As many tokens as token_embd has rows, or llama.cpp refuses the file: the ids the tokenizer
  // lacks (the tiny tokenizer has far fewer than the vocabulary) are "[PAD<id>]" of type
  // UNUSED (5), as llama.cpp's converter writes them.
  const GgufValue* tokens = g.find("tokenizer.ggml.tokens");
  const GgufValue* types = g.find("tokenizer.ggml.token_type");
  ASSERT_TRUE(tokens && types);
  ASSERT_EQ(int64_t(tokens->value.size()), c.vocab_size);
  ASSERT_EQ(int64_t(types->value.size()), c.vocab_size);
  const int64_t held = int64_t(Tokenizer::load(dir / "hf")->vocab_size());
  ASSERT_LT(held, c.vocab_size);
  EXPECT_EQ(tokens->value.back(), "[PAD" + std::to_string(c.vocab_size - 1) + "]");
  EXPECT_EQ(types->value.back(), 5);
  EXPECT_NE(types->value[size_t(held) - 1], 5);  // the last id the tokenizer holds

  // LlamaModel.permute on one head of 4 rows: reshape(1, 2, 2).swapaxes(1, 2) stores rows
  // 0, 2, 1, 3; sluice's loader puts them back.
  const float rows[4] = {10, 11, 12, 13};
  const auto stored = permute_qk_rows(rows, 1, 4, 4);
  float got[4];
  std::memcpy(got, stored.data(), 16);
  EXPECT_EQ(std::vector<float>(got, got + 4), (std::vector<float>{10, 12, 11, 13}));
  float back[4];
  unpermute_qk_rows(got, back, 1, 4, 4);
  EXPECT_EQ(std::vector<float>(back, back + 4), (std::vector<float>{10, 11, 12, 13}));
  // In the file, q's rows are permuted: blk.0.attn_q row 1 is checkpoint row head_dim / 2.
  const Model hf = load_model(dir / "hf");
  const float* q = reinterpret_cast<const float*>(g.find_tensor("blk.0.attn_q.weight")->data());
  std::vector<float> want_row(static_cast<size_t>(H));
  to_f32(hf.weights.layers[0].wq.dtype,
         static_cast<const char*>(hf.weights.layers[0].wq.data) +
             size_t(c.head_dim / 2) * size_t(H) * dtype_size(hf.weights.layers[0].wq.dtype),
         want_row.data(), size_t(H));
  EXPECT_EQ(std::vector<float>(q + H, q + 2 * H), want_row);
}

TEST(GgufModel, TokenizerAndChatTemplateComeFromTheFile) {
  for (const char* preset :
       {"tiny-mixtral", "tiny-qwen3-moe", "tiny-olmoe", "tiny-dbrx", "tiny-deepseek-v3"}) {
    SCOPED_TRACE(preset);
    const ModelConfig c = preset_config(preset);
    TempDir dir;
    write_folder(c, dir / "hf");
    const auto path = export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kBF16);
    const auto from_gguf = Tokenizer::load(path);
    const auto from_folder = Tokenizer::load(dir / "hf");
    const std::string text = "The quick brown fox, 42 experts! Hello  world.";
    EXPECT_EQ(from_gguf->encode(text, true), from_folder->encode(text, true));
    EXPECT_EQ(from_gguf->eos_id(), from_folder->eos_id());
    const auto messages = single_user_message("What is the answer?");
    // A tokenizer_config.json beside the file is not the GGUF's template: the file's is used.
    testing::write_file(dir / "tokenizer_config.json", R"({"chat_template": "WRONG"})");
    const ChatPrompter gguf_chat = ChatPrompter::load(path, *from_gguf);
    const ChatPrompter folder_chat = ChatPrompter::load(dir / "hf", *from_folder);
    EXPECT_EQ(gguf_chat.render(messages), folder_chat.render(messages));
    EXPECT_EQ(gguf_chat.encode(messages), folder_chat.encode(messages));
  }
}

TEST(GgufModel, MetadataDisagreeingWithATensorShapeNamesBoth) {
  const ModelConfig c = preset_config("tiny-qwen3-moe");
  TempDir dir;
  write_folder(c, dir / "hf");
  const auto path = export_gguf(
      dir / "hf", dir / "m.gguf", GgufWeights::kF32, 1,
      [](GgufWriter& w) { w.replace("qwen3moe.expert_feed_forward_length", GgufType::kU32, 48); });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "tensor 'blk.0.ffn_gate_exps.weight'",
                        "expected shape [8, 48, 64]", "got [8, 40, 64]");
}

// A tokenizer with ids past config.json's vocab_size cannot be padded to the embedding's rows:
// the export names the tokenizer, the id and the vocab_size.
TEST(GgufModel, TokenizerLargerThanTheVocabularyIsNamed) {
  const ModelConfig c = preset_config("tiny-mixtral");
  ModelConfig small = c;
  small.vocab_size = 300;
  TempDir dir;
  write_random_checkpoint(small, dir / "hf", 5);
  write_synthetic_tokenizer(c, dir / "hf");
  const int64_t last = int64_t(Tokenizer::load(dir / "hf")->vocab_size()) - 1;
  ASSERT_GE(last, 300);
  const std::string file = (dir / "hf" / "tokenizer.json").string();
  const std::string id = "token id " + std::to_string(last);
  EXPECT_ERROR_MENTIONS(export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kF32), file.c_str(),
                        id.c_str(), "config.json's vocab_size 300");
}

TEST(GgufModel, MissingTensorAndMissingKeyAreNamed) {
  const ModelConfig c = preset_config("tiny-olmoe");
  TempDir dir;
  write_folder(c, dir / "hf");
  auto path = export_gguf(dir / "hf", dir / "a.gguf", GgufWeights::kF32, 1,
                          [](GgufWriter& w) { w.remove("olmoe.expert_count"); });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "key 'olmoe.expert_count' is missing");
  path = export_gguf(dir / "hf", dir / "b.gguf", GgufWeights::kF32, 1,
                     [](GgufWriter& w) { w.remove_tensor("blk.1.attn_k_norm.weight"); });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(),
                        "tensor 'blk.1.attn_k_norm.weight' is missing");
  // A tensor no family table has is refused, not ignored.
  path = export_gguf(dir / "hf", dir / "c.gguf", GgufWeights::kF32, 1, [](GgufWriter& w) {
    w.add_tensor("blk.0.mystery.weight", uint32_t(GgmlType::F32), {4}, std::vector<uint8_t>(16));
  });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "unexpected tensor 'blk.0.mystery.weight'");
}

TEST(GgufModel, TypesThatAreNotLoadedAreNamed) {
  // Q4_1 is a type the reader can size but sluice does not dequantise: the tensor is named.
  const ModelConfig c = preset_config("tiny-mixtral");
  TempDir dir;
  write_folder(c, dir / "hf");
  const auto path =
      export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kQ8_0, 1, [](GgufWriter& w) {
        // Q8_0's 34-byte blocks hold more bytes than Q4_1's 20: the data stays in range.
        w.retype_tensor("blk.1.ffn_up_exps.weight", uint32_t(GgmlType::Q4_1));
      });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "tensor 'blk.1.ffn_up_exps.weight'",
                        "Q4_1 is not supported");
}

TEST(GgufModel, DequantizationIsAnnouncedOnce) {
  const ModelConfig c = preset_config("tiny-mixtral");
  TempDir dir;
  write_folder(c, dir / "hf");
  const auto path = export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kQ4_0);
  ::testing::internal::CaptureStderr();
  load_model(path);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("dequantizing"), std::string::npos) << err;
  EXPECT_NE(err.find("Q4_0 tensors"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(GgufModel, ArchitecturesWithoutAGgufNamingAreRefusedByName) {
  TempDir dir;
  for (const char* arch : {"gemma", "grok", "deepseek4"}) {
    GgufWriter w;
    w.add("general.architecture", GgufType::kString, arch);
    const auto path = dir / (std::string(arch) + ".gguf");
    w.write(path);
    const std::string refused = std::string("'") + arch + "' is not supported";
    EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "general.architecture", refused.c_str(),
                          "llama (mixtral)", "dbrx (dbrx)", "deepseek2 (deepseek_v3)");
  }
  // A dense llama (no experts) needs the expert count it does not have.
  GgufWriter w;
  w.add("general.architecture", GgufType::kString, "llama");
  w.add("llama.embedding_length", GgufType::kU32, 64);
  w.add("llama.block_count", GgufType::kU32, 1);
  w.add("llama.attention.head_count", GgufType::kU32, 4);
  w.add("llama.feed_forward_length", GgufType::kU32, 128);
  w.write(dir / "dense.gguf");
  EXPECT_ERROR_MENTIONS(load_model(dir / "dense.gguf"), "key 'llama.expert_count' is missing");
}

// deepseek2 is DeepSeek-V2 (softmax gating) or V3 (sigmoid, with exp_probs_b); other gating
// functions and DeepSeek's other rope scalings are refused by key; DBRX's LayerNorm eps is fixed.
TEST(GgufModel, DeepSeekAndDbrxMetadataTheyCannotRunIsRefusedByKey) {
  TempDir dir;
  write_folder(preset_config("tiny-deepseek-v2-lite"), dir / "ds");
  auto path = export_gguf(dir / "ds", dir / "a.gguf", GgufWeights::kF32, 1, [](GgufWriter& w) {
    w.replace("deepseek2.expert_gating_func", GgufType::kU32, 3);
  });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "key 'deepseek2.expert_gating_func'",
                        "got 3");
  path = export_gguf(dir / "ds", dir / "b.gguf", GgufWeights::kF32, 1, [](GgufWriter& w) {
    w.replace("deepseek2.rope.scaling.type", GgufType::kString, "linear");
  });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "key 'deepseek2.rope.scaling.type'",
                        "'linear' is not supported");
  path = export_gguf(dir / "ds", dir / "c.gguf", GgufWeights::kF32, 1,
                     [](GgufWriter& w) { w.remove("deepseek2.attention.kv_lora_rank"); });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(),
                        "key 'deepseek2.attention.kv_lora_rank' is missing");
  // A sigmoid-gated file is V3's, which needs the selection bias.
  path = export_gguf(dir / "ds", dir / "d.gguf", GgufWeights::kF32, 1, [](GgufWriter& w) {
    w.replace("deepseek2.expert_gating_func", GgufType::kU32, 2);
  });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(),
                        "tensor 'blk.1.exp_probs_b.bias' is missing");
  write_folder(preset_config("tiny-dbrx"), dir / "dbrx");
  path = export_gguf(dir / "dbrx", dir / "e.gguf", GgufWeights::kF32, 1, [](GgufWriter& w) {
    w.replace("dbrx.attention.layer_norm_epsilon", GgufType::kF32, 1e-6);
  });
  EXPECT_ERROR_MENTIONS(load_model(path), path.c_str(), "key 'dbrx.attention.layer_norm_epsilon'");
}

// The names and dims llama.cpp's DBRX and DeepSeek files have (llama-model.cpp's create_tensor
// shapes, fastest first).
TEST(GgufModel, DeepSeekAndDbrxNamesAndDimsAreLlamaCpps) {
  {
    const ModelConfig c = preset_config("tiny-dbrx");
    TempDir dir;
    write_folder(c, dir / "hf");
    const GgufFile g = GgufFile::open(export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kF32));
    const int64_t H = c.hidden_size, I = c.expert_intermediate_size, E = c.num_experts;
    EXPECT_EQ(g.find_tensor("blk.1.attn_qkv.weight")->dims, (Shape{H, H + 2 * c.kv_dim()}));
    EXPECT_EQ(g.find_tensor("blk.1.ffn_gate_exps.weight")->dims, (Shape{H, I, E}));
    EXPECT_EQ(g.find_tensor("blk.1.ffn_up_exps.weight")->dims, (Shape{H, I, E}));
    EXPECT_EQ(g.find_tensor("blk.1.ffn_down_exps.weight")->dims, (Shape{I, H, E}));
    for (const char* name :
         {"blk.0.attn_norm.weight", "blk.0.attn_output_norm.weight", "blk.0.attn_output.weight",
          "blk.0.ffn_gate_inp.weight", "output_norm.weight", "output.weight", "token_embd.weight"})
      EXPECT_NE(g.find_tensor(name), nullptr) << name;
    // w2 holds each expert's down projection transposed; the file the canonical one.
    const Model hf = load_model(dir / "hf"), m = load_model(dir / "m.gguf");
    const Tensor& a = hf.weights.layers[1].expert_down;
    ASSERT_EQ(a.shape, (Shape{E, H, I}));
    std::vector<float> want(size_t(a.numel()));
    to_f32(a.dtype, a.data, want.data(), want.size());
    const auto* got =
        reinterpret_cast<const float*>(g.find_tensor("blk.1.ffn_down_exps.weight")->data());
    EXPECT_EQ(std::vector<float>(got, got + want.size()), want);
    EXPECT_EQ(m.config.clip_qkv, c.clip_qkv);
  }
  const ModelConfig c = preset_config("tiny-deepseek-v3");
  TempDir dir;
  write_folder(c, dir / "hf");
  const GgufFile g = GgufFile::open(export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kF32));
  const LatentAttentionShape& m = c.mla;
  const int64_t H = c.hidden_size, heads = c.num_heads;
  EXPECT_EQ(g.find_tensor("blk.0.attn_q_a.weight")->dims, (Shape{H, m.q_lora_rank}));
  EXPECT_EQ(g.find_tensor("blk.0.attn_q_b.weight")->dims,
            (Shape{m.q_lora_rank, heads * c.head_dim}));
  EXPECT_EQ(g.find_tensor("blk.0.attn_kv_a_mqa.weight")->dims,
            (Shape{H, m.kv_lora_rank + m.qk_rope_head_dim}));
  EXPECT_EQ(g.find_tensor("blk.0.attn_k_b.weight")->dims,
            (Shape{m.qk_nope_head_dim, m.kv_lora_rank, heads}));
  EXPECT_EQ(g.find_tensor("blk.0.attn_v_b.weight")->dims,
            (Shape{m.kv_lora_rank, m.v_head_dim, heads}));
  EXPECT_EQ(g.find_tensor("blk.3.exp_probs_b.bias")->dims, (Shape{c.num_experts}));
  for (const char* name :
       {"blk.0.attn_q_a_norm.weight", "blk.0.attn_kv_a_norm.weight", "blk.0.ffn_gate.weight",
        "blk.3.ffn_gate_shexp.weight", "blk.3.ffn_down_exps.weight"})
    EXPECT_NE(g.find_tensor(name), nullptr) << name;
  // No MTP layer (the model's 4 layers are blk.0-3), no FP8 scales.
  for (const auto& [name, t] : g.tensors()) {
    EXPECT_FALSE(name.starts_with("blk.4.")) << name;
    EXPECT_EQ(name.find("scale"), std::string::npos) << name;
  }
  EXPECT_EQ(g.integer("deepseek2.attention.head_count_kv"), 1);
  EXPECT_EQ(g.integer("deepseek2.expert_gating_func"), 2);
  EXPECT_EQ(g.integer("deepseek2.leading_dense_block_count"), 2);
}

TEST(GgufModel, InspectShowsTheGgufMetadata) {
  const ModelConfig c = preset_config("tiny-mixtral");
  TempDir dir;
  write_folder(c, dir / "hf");
  const auto path = export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kQ8_0);
  const auto r =
      testing::run_command(testing::sluice_binary() + " inspect --model " + path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("architecture llama"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gguf Q8_0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gguf F32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("family       mixtral"), std::string::npos) << r.output;
}

// Through the engine, end to end: the GGUF file (weights, tokenizer, chat template) generates the
// folder's text, greedy (DBRX's fused attn_qkv; DeepSeek's split kv_b through MLA's absorbed form).
TEST(GgufModel, GenerateWithTheGgufFileEqualsTheFolder) {
  for (const char* preset : {"tiny-qwen3-moe", "tiny-dbrx", "tiny-deepseek-v2"}) {
    SCOPED_TRACE(preset);
    const ModelConfig c = preset_config(preset);
    TempDir dir;
    write_folder(c, dir / "hf");
    const auto path = export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kBF16);
    auto generate = [&](const std::filesystem::path& model) {
      const auto r = testing::run_command(
          testing::sluice_command("generate --chat --model " + model.string() +
                                  " --prompt 'Hello world' --max-new-tokens 8"),
          /*with_stderr=*/false);
      EXPECT_EQ(r.status, 0) << r.output;
      return r.output;
    };
    const std::string from_gguf = generate(path);
    EXPECT_FALSE(from_gguf.empty());
    EXPECT_EQ(from_gguf, generate(dir / "hf"));
  }
}

}  // namespace
}  // namespace sluice
