#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/presets.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "test_util.h"

namespace sluice {
namespace {

using testing::TempDir;

TEST(ModelLoader, WrittenCheckpointEqualsTheInMemoryModel) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-mixtral");
  write_random_checkpoint(c, dir.path(), 7);
  Model loaded = load_model(dir.path());
  Model made = make_random_model(c, 7);
  EXPECT_TRUE(testing::same_bytes(loaded.weights.embed, made.weights.embed));
  EXPECT_TRUE(testing::same_bytes(loaded.weights.lm_head, made.weights.lm_head));
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_TRUE(testing::same_bytes(loaded.weights.layers[l].wk, made.weights.layers[l].wk));
    EXPECT_TRUE(
        testing::same_bytes(loaded.weights.layers[l].expert_down, made.weights.layers[l].expert_down));
  }
  // The writer stores each layer's experts back to back, so the stack is a view of the mapping.
  const Tensor& gate = loaded.weights.layers[1].expert_gate;
  EXPECT_EQ(gate.shape, (Shape{8, 96, 64}));
  Checkpoint ckpt = Checkpoint::open(dir.path());
  const TensorEntry* e0 = ckpt.find("model.layers.1.block_sparse_moe.experts.0.w1.weight");
  auto mapping = std::static_pointer_cast<MappedFile>(gate.owner);
  EXPECT_EQ(mapping->path(), e0->file->path());
  EXPECT_EQ(static_cast<const std::byte*>(gate.data), mapping->data() + e0->offset);
}

TEST(ModelLoader, ShardedCheckpointLoadsAndMatches) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-mixtral");
  WriteStats stats = write_random_checkpoint(c, dir.path(), 3, 200 << 10);
  EXPECT_GT(stats.shards, 2);
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  Model loaded = load_model(dir.path());
  Model made = make_random_model(c, 3);
  EXPECT_TRUE(testing::same_bytes(loaded.weights.layers[1].expert_up, made.weights.layers[1].expert_up));
  EXPECT_TRUE(testing::same_bytes(loaded.weights.final_norm, made.weights.final_norm));
}

// Rewrites the checkpoint of `dir` with `edit` applied to its list of tensors.
void rewrite_checkpoint(
    const std::filesystem::path& dir,
    const std::function<void(std::vector<std::pair<TensorSpec, std::vector<char>>>&)>& edit) {
  std::vector<std::pair<TensorSpec, std::vector<char>>> tensors;
  {
    SafetensorsFile f = SafetensorsFile::open(dir / "model.safetensors");
    for (const auto& [name, e] : f.tensors()) {
      const char* p = reinterpret_cast<const char*>(e.file->data() + e.offset);
      tensors.push_back({{name, e.dtype, e.shape}, std::vector<char>(p, p + e.nbytes)});
    }
  }
  edit(tensors);
  std::vector<TensorSpec> specs;
  for (auto& [spec, _] : tensors) specs.push_back(spec);
  SafetensorsWriter w(dir / "model.safetensors", specs);
  for (auto& [_, bytes] : tensors) w.write(bytes.data(), bytes.size());
  w.finish();
}

TEST(ModelLoader, ExpertsStoredInterleavedAreRepacked) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-mixtral");
  write_random_checkpoint(c, dir.path(), 5);
  // Name order interleaves w1/w2/w3 of each expert, as many real checkpoints do.
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    std::sort(tensors.begin(), tensors.end(),
              [](auto& a, auto& b) { return a.first.name < b.first.name; });
  });
  Model loaded = load_model(dir.path());
  Model made = make_random_model(c, 5);
  EXPECT_TRUE(testing::same_bytes(loaded.weights.layers[0].expert_gate, made.weights.layers[0].expert_gate));
  EXPECT_TRUE(testing::same_bytes(loaded.weights.layers[1].expert_down, made.weights.layers[1].expert_down));
}

TEST(ModelLoader, MissingTensorIsNamed) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir.path(), 1);
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    std::erase_if(tensors,
                  [](auto& t) { return t.first.name == "model.layers.1.self_attn.k_proj.weight"; });
  });
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "'model.layers.1.self_attn.k_proj.weight'",
                        "missing", "[32, 64]");
}

TEST(ModelLoader, WrongShapeIsNamedWithExpectedAndActual) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir.path(), 1);
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    for (auto& [spec, bytes] : tensors)
      if (spec.name == "model.norm.weight") spec.shape = {32, 2};
  });
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "model.safetensors", "'model.norm.weight'",
                        "expected shape [64], got [32, 2]");
}

// A Qwen3-MoE checkpoint whose tensors disagree with its config: a q_norm of the full width where
// the config says per head, a missing k_norm, a dense layer's MLP where the config says MoE.
TEST(ModelLoader, Qwen3MoeTensorsThatDisagreeWithTheConfigAreNamed) {
  TempDir work;
  ModelConfig c = preset_config("tiny-qwen3-moe");
  // Each case in a folder of its own: a checkpoint is only written into a new or empty folder.
  std::filesystem::path dir = work / "wrong-shape";
  write_random_checkpoint(c, dir, 1);
  Model loaded = load_model(dir);
  EXPECT_EQ(loaded.weights.layers[1].q_norm.shape, (Shape{24}));
  EXPECT_EQ(loaded.weights.layers[0].expert_gate.shape, (Shape{8, 40, 64}));
  rewrite_checkpoint(dir, [](auto& tensors) {
    for (auto& [spec, bytes] : tensors)
      if (spec.name == "model.layers.1.self_attn.q_norm.weight")
        spec.shape = {96}, bytes.resize(96 * 2);
  });
  EXPECT_ERROR_MENTIONS(load_model(dir), "'model.layers.1.self_attn.q_norm.weight'",
                        "expected shape [24], got [96]");
  dir = work / "missing";
  write_random_checkpoint(c, dir, 1);
  rewrite_checkpoint(dir, [](auto& tensors) {
    std::erase_if(tensors,
                  [](auto& t) { return t.first.name == "model.layers.0.self_attn.k_norm.weight"; });
  });
  EXPECT_ERROR_MENTIONS(load_model(dir), "'model.layers.0.self_attn.k_norm.weight'",
                        "missing", "[24]");
  // The checkpoint of a model whose layer 1 is dense, under a config that says it is MoE.
  ModelConfig dense = c;
  dense.dense_layers = {1};
  dir = work / "dense-layer";
  write_random_checkpoint(dense, dir, 1);
  std::ofstream(dir / "config.json") << config_to_json(c).dump(2);
  EXPECT_ERROR_MENTIONS(load_model(dir), "'model.layers.1.mlp.gate.weight'", "missing",
                        "[8, 64]");
}

// OLMoE's k_norm spans every KV head: a per-head one (as Qwen3's) is refused, naming the width.
TEST(ModelLoader, OlmoeKNormOfOneHeadIsNamed) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-olmoe");
  write_random_checkpoint(c, dir.path(), 1);
  EXPECT_EQ(load_model(dir.path()).weights.layers[0].k_norm.shape, (Shape{32}));
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    for (auto& [spec, bytes] : tensors)
      if (spec.name == "model.layers.0.self_attn.k_norm.weight")
        spec.shape = {16}, bytes.resize(16 * 2);
  });
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "'model.layers.0.self_attn.k_norm.weight'",
                        "expected shape [32], got [16]");
}

// Qwen2-MoE: a checkpoint without a layer's shared-expert gate is refused, naming the tensor and
// its shape; the gate and the shared expert land in the dense MLP slots.
TEST(ModelLoader, Qwen2MoeMissingSharedExpertGateIsNamed) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-qwen2-moe");
  write_random_checkpoint(c, dir.path(), 1);
  Model loaded = load_model(dir.path());
  EXPECT_EQ(loaded.weights.layers[1].mlp_scale.shape, (Shape{1, 64}));
  EXPECT_EQ(loaded.weights.layers[1].mlp_down.shape, (Shape{64, 72}));
  EXPECT_EQ(loaded.weights.layers[1].bk.shape, (Shape{32}));
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    std::erase_if(tensors, [](auto& t) {
      return t.first.name == "model.layers.1.mlp.shared_expert_gate.weight";
    });
  });
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "'model.layers.1.mlp.shared_expert_gate.weight'",
                        "missing", "[1, 64]");
}

// DBRX's fused Wqkv becomes three views of its rows; its flat w1/v1 are views [E, I, H]; its w2
// is repacked so that expert e's canonical down projection [H, I] is the transpose of rows
// [e·I, (e+1)·I) of w2. The loaded model equals the one made in memory.
TEST(ModelLoader, DbrxFusedQkvAndFlatExpertsMapOntoTheCanonicalWeights) {
  TempDir dir;
  const ModelConfig c = preset_config("tiny-dbrx");
  write_random_checkpoint(c, dir.path(), 5);
  Model loaded = load_model(dir.path());
  Model made = make_random_model(c, 5);
  const int64_t H = 64, qd = 64, kvd = 32, E = 7, I = 40;
  Checkpoint ckpt = Checkpoint::open(dir.path());
  const Tensor wqkv = ckpt.find("transformer.blocks.1.norm_attn_norm.attn.Wqkv.weight")->view();
  ASSERT_EQ(wqkv.shape, (Shape{qd + 2 * kvd, H}));
  const LayerWeights& L = loaded.weights.layers[1];
  EXPECT_EQ(L.wq.shape, (Shape{qd, H}));
  EXPECT_EQ(L.wv.shape, (Shape{kvd, H}));
  // Views of one mapping, not copies: the rows of the fused tensor follow each other, the flat
  // experts share the mapping's owner (this second Checkpoint is a mapping of its own, so its
  // addresses differ; its bytes are the file's).
  EXPECT_EQ(L.wk.data, L.wq.as<uint16_t>() + qd * H);
  EXPECT_EQ(L.wv.data, L.wq.as<uint16_t>() + (qd + kvd) * H);
  EXPECT_EQ(std::memcmp(L.wq.data, wqkv.data, wqkv.nbytes()), 0);
  const Tensor w1 = ckpt.find("transformer.blocks.1.ffn.experts.mlp.w1")->view();
  EXPECT_EQ(L.expert_gate.shape, (Shape{E, I, H}));
  EXPECT_EQ(L.expert_gate.owner, L.wq.owner);
  EXPECT_EQ(std::memcmp(L.expert_gate.data, w1.data, w1.nbytes()), 0);
  const Tensor w2 = ckpt.find("transformer.blocks.1.ffn.experts.mlp.w2")->view();
  ASSERT_EQ(L.expert_down.shape, (Shape{E, H, I}));
  for (int64_t e : {0, 3, 6})
    for (int64_t h : {0, 17, 63})
      for (int64_t i : {0, 21, 39})
        ASSERT_EQ(L.expert_down.as<uint16_t>()[(e * H + h) * I + i],
                  w2.as<uint16_t>()[(e * I + i) * H + h])
            << "e=" << e << " h=" << h << " i=" << i;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights &a = loaded.weights.layers[size_t(l)], &b = made.weights.layers[size_t(l)];
    for (auto [x, y] : {std::pair{&a.wq, &b.wq},
                        {&a.wk, &b.wk},
                        {&a.wv, &b.wv},
                        {&a.expert_up, &b.expert_up},
                        {&a.expert_down, &b.expert_down},
                        {&a.attn_norm, &b.attn_norm}})
      EXPECT_TRUE(testing::same_bytes(*x, *y)) << "layer " << l;
  }
  EXPECT_TRUE(testing::same_bytes(loaded.weights.final_norm, made.weights.final_norm));
}

// A DBRX checkpoint whose Wqkv is wider than its config says (written for 2 KV heads, read
// under kv_n_heads 1) is refused, naming the tensor and the width the config expects.
TEST(ModelLoader, DbrxWqkvOfTheWrongWidthIsNamed) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-dbrx");
  write_random_checkpoint(c, dir.path(), 1);
  c.num_kv_heads = 1;
  std::ofstream(dir / "config.json") << config_to_json(c).dump(2);
  EXPECT_ERROR_MENTIONS(load_model(dir.path()),
                        "'transformer.blocks.0.norm_attn_norm.attn.Wqkv.weight'",
                        "expected shape [96, 64], got [128, 64]");
}

TEST(ModelLoader, UnknownExtraTensorIsAnError) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir.path(), 1);
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    tensors.push_back({{"model.layers.0.mystery.weight", DType::F32, {2}}, std::vector<char>(8)});
    tensors.push_back(
        {{"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {2}}, std::vector<char>(8)});
  });
  EXPECT_ERROR_MENTIONS(load_model(dir.path()),
                        "unexpected tensor 'model.layers.0.mystery.weight'");
}

TEST(ModelLoader, IntegerWeightsAreRejected) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir.path(), 1);
  rewrite_checkpoint(dir.path(), [](auto& tensors) {
    for (auto& [spec, bytes] : tensors)
      if (spec.name == "model.norm.weight") spec.dtype = DType::I32, bytes.resize(64 * 4);
  });
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "'model.norm.weight'", "expected dtype", "I32");
}

TEST(ModelLoader, TiedEmbeddingsShareTheTable) {
  TempDir dir;
  ModelConfig c = preset_config("tiny-mixtral");
  c.tie_word_embeddings = true;
  write_random_checkpoint(c, dir.path(), 2);
  Model m = load_model(dir.path());
  EXPECT_EQ(m.weights.lm_head.data, m.weights.embed.data);
}

TEST(ModelLoader, FolderWithoutConfigSaysSo) {
  TempDir dir;
  EXPECT_ERROR_MENTIONS(load_model(dir.path()), "no config.json");
}

TEST(ReferenceForward, IncrementalDecodeMatchesOneShotPrefill) {
  ModelConfig c = preset_config("tiny-mixtral");
  c.sliding_window = 4;
  Model m = make_random_model(c, 11);
  std::vector<int> tokens = {1, 50, 99, 7, 300, 12, 5, 44, 200};
  ReferenceForward whole(m);
  std::vector<float> all = whole.forward(tokens);
  ReferenceForward step(m);
  std::vector<float> prefix = step.forward(std::span(tokens).first(5));
  ASSERT_EQ(prefix.size(), size_t(5 * c.vocab_size));
  for (size_t t = 5; t < tokens.size(); ++t) {
    std::vector<float> row = step.forward(std::span(tokens).subspan(t, 1));
    for (int v = 0; v < c.vocab_size; ++v)
      ASSERT_NEAR(row[v], all[t * c.vocab_size + v], 1e-4f) << "position " << t << " logit " << v;
  }
  EXPECT_EQ(step.length(), int(tokens.size()));
}

TEST(ReferenceForward, RejectsTokenOutsideVocabulary) {
  Model m = make_random_model(preset_config("tiny-mixtral"), 1);
  ReferenceForward f(m);
  std::vector<int> tokens = {1, 384};
  EXPECT_ERROR_MENTIONS(f.forward(tokens), "token id 384", "[0, 384)");
}

}  // namespace
}  // namespace sluice
