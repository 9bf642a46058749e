#include "model/gguf_model.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/gguf_dequant.h"
#include "model/tensor_table.h"

namespace sluice {

namespace {

using nlohmann::json;

// The fields of every Llama-style config.json, as llama.cpp's converter writes them.
const std::vector<GgufKey>& common_keys() {
  static const std::vector<GgufKey> keys = {
      {"hidden_size", "embedding_length", true},
      {"num_hidden_layers", "block_count", true},
      {"num_attention_heads", "attention.head_count", true},
      {"num_key_value_heads", "attention.head_count_kv"},
      {"head_dim", "attention.key_length"},
      {"rms_norm_eps", "attention.layer_norm_rms_epsilon"},
      {"rope_theta", "rope.freq_base"},
      {"max_position_embeddings", "context_length"},
  };
  return keys;
}

std::string supported_archs() {
  std::string s;
  for (const FamilySpec* f : all_families())
    if (f->gguf) s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", f->gguf->arch, f->model_type);
  return s;
}

void read_keys(const GgufFile& g, const std::string& arch, const FamilySpec& spec,
               const std::vector<GgufKey>& keys, json& j) {
  for (const GgufKey& k : keys) {
    const GgufValue* v = g.find(arch + "." + k.gguf);
    if (!v && k.fallback) v = g.find(arch + "." + k.fallback);
    if (!v) {
      if (k.required)
        fail("{}: key '{}.{}' is missing from the GGUF metadata (it gives {}'s {})",
             g.path().string(), arch, k.gguf, spec.model_type, k.config);
      continue;
    }
    j[k.config] = v->value;
  }
}

// The layers without a router tensor: dense ones.
json dense_layers(const GgufFile& g, int64_t layers) {
  json out = json::array();
  for (int64_t l = 0; l < layers; ++l)
    if (!g.find_tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l))) out.push_back(l);
  return out;
}

DType float_dtype(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32:
      return DType::F32;
    case GgmlType::F16:
      return DType::F16;
    default:
      return DType::BF16;
  }
}

bool is_float_type(uint32_t type) {
  const auto t = GgmlType(type);
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

bool is_dequantized_type(uint32_t type) {
  const auto t = GgmlType(type);
  return t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
         t == GgmlType::Q6_K;
}

// The shape with leading 1s dropped: llama.cpp keeps [1, H] tensors as [H] or [H, 1] alike.
Shape squeezed(Shape s) {
  while (s.size() > 1 && s.front() == 1) s.erase(s.begin());
  return s;
}

// The tensor's values as the engine takes them: a view for float types, else dequantised to
// BF16 row by row.
Tensor read_tensor(const GgufTensorInfo& t, const Shape& shape) {
  if (is_float_type(t.type)) {
    Tensor v;
    v.dtype = float_dtype(t.type);
    v.shape = shape;
    v.data = const_cast<std::byte*>(t.data());
    v.owner = t.file;
    return v;
  }
  if (!is_dequantized_type(t.type))
    fail(
        "{}: tensor '{}': ggml type {} is not supported (sluice loads F32, F16, BF16, Q8_0, Q4_0, "
        "Q4_K, Q5_K and Q6_K)",
        t.file->path().string(), t.name, ggml_type_name(t.type));
  Tensor out = Tensor::allocate(DType::BF16, shape);
  const int64_t row = t.dims[0], rows = out.numel() / row;
  const size_t row_bytes = t.nbytes / size_t(rows);
  std::vector<float> buf(size_t(row), 0.f);
  auto* dst = out.as<uint16_t>();
  for (int64_t r = 0; r < rows; ++r) {
    dequantize(t.type, t.data() + size_t(r) * row_bytes, buf.data(), row);
    for (int64_t i = 0; i < row; ++i) dst[r * row + i] = f32_to_bf16(buf[size_t(i)]);
  }
  return out;
}

// One line on stderr naming the quantised types that are turned into BF16 at load.
void report_dequantized(const GgufFile& g, const std::set<std::string>& used) {
  std::map<std::string, int> counts;
  for (const std::string& name : used) {
    const GgufTensorInfo& t = *g.find_tensor(name);
    if (is_dequantized_type(t.type)) ++counts[ggml_type_name(t.type)];
  }
  if (counts.empty()) return;
  std::string list;
  for (const auto& [type, n] : counts)
    list += fmt::format("{}{} {} tensors", list.empty() ? "" : ", ", n, type);
  std::fprintf(stderr, "sluice: %s: dequantizing %s to BF16 at load\n", g.path().c_str(),
               list.c_str());
}

class GgufLoader {
 public:
  GgufLoader(const GgufFile& g, const FamilySpec& spec, Model& m)
      : g_(g), naming_(*spec.gguf), m_(m) {}

  void load() {
    TensorTable table = tensor_table(m_.config, m_.weights);
    std::vector<std::pair<const ExpectedTensor*, GgufName>> plan;
    for (const ExpectedTensor& want : table.tensors) {
      GgufName gn = gguf_tensor_name(naming_, want.name);
      if (gn.name.empty() || want.mapping != TensorMapping::kWhole)
        fail("{}: {} tensor '{}' has no GGUF name in the family's description", where(),
             m_.config.architecture, want.name);
      if (want.expert > 0) continue;  // the stacked GGUF tensor fills the slot once
      used_.insert(gn.name);
      plan.emplace_back(&want, std::move(gn));
    }
    check_present(plan);
    check_nothing_left();
    report_dequantized(g_, used_);
    for (const auto& [want, gn] : plan) load_one(*want, gn);
    if (m_.config.tie_word_embeddings) m_.weights.lm_head = m_.weights.embed;
  }

 private:
  std::string where() const { return g_.path().string(); }

  // Every tensor there, with the shape the metadata implies, before any is read.
  void check_present(const std::vector<std::pair<const ExpectedTensor*, GgufName>>& plan) const {
    for (const auto& [want, gn] : plan) {
      const GgufTensorInfo* t = g_.find_tensor(gn.name);
      if (!t)
        fail("{}: tensor '{}' is missing (expected shape {} for {}, as the checkpoint's '{}')",
             where(), gn.name, shape_str(expected_shape(*want)), m_.config.architecture,
             want->name);
      if (squeezed(t->shape()) != squeezed(expected_shape(*want)))
        fail(
            "{}: tensor '{}': expected shape {} from the GGUF metadata ({}), got {} (GGUF dims "
            "{})",
            t->file->path().string(), gn.name, shape_str(expected_shape(*want)),
            want->shape_from ? std::string(want->shape_from)
                             : naming_.arch + std::string(".* keys"),
            shape_str(t->shape()), shape_str(t->dims));
    }
  }

  Shape expected_shape(const ExpectedTensor& want) const {
    Shape s = want.shape;
    if (want.expert >= 0) s.insert(s.begin(), m_.config.num_experts);
    return s;
  }

  void load_one(const ExpectedTensor& want, const GgufName& gn) {
    const GgufTensorInfo& t = *g_.find_tensor(gn.name);
    Tensor v = read_tensor(t, expected_shape(want));
    if (naming_.interleaved_qk && gn.rows != GgufRows::kAsIs) v = unpermuted(v, gn.rows);
    *want.slot = std::move(v);
  }

  Tensor unpermuted(const Tensor& v, GgufRows rows) const {
    const ModelConfig& c = m_.config;
    const int64_t heads = rows == GgufRows::kQueryHeads ? c.num_heads : c.num_kv_heads;
    Tensor out = Tensor::allocate(v.dtype, v.shape);
    const size_t row_bytes = v.nbytes() / size_t(v.shape[0]);
    unpermute_qk_rows(v.data, out.data, heads, c.head_dim, row_bytes);
    return out;
  }

  void check_nothing_left() const {
    for (const auto& [name, t] : g_.tensors())
      if (!used_.count(name))
        fail("{}: unexpected tensor '{}' {} {}: not part of a {} model with this metadata",
             t.file->path().string(), name, ggml_type_name(t.type), shape_str(t.shape()),
             m_.config.architecture);
  }

  const GgufFile& g_;
  const GgufNaming& naming_;
  Model& m_;
  std::set<std::string> used_;
};

}  // namespace

const std::vector<GgufTensorName>& llama_gguf_tensor_names() {
  static const std::vector<GgufTensorName> names = {
      {"model.embed_tokens", "token_embd"},
      {"model.norm", "output_norm"},
      {"lm_head", "output"},
      {"input_layernorm", "attn_norm"},
      {"self_attn.q_proj", "attn_q", GgufRows::kQueryHeads},
      {"self_attn.k_proj", "attn_k", GgufRows::kKeyHeads},
      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"},
      {"post_attention_layernorm", "ffn_norm"},
  };
  return names;
}

GgufName gguf_tensor_name(const GgufNaming& naming, const std::string& name) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.*)\.(weight|bias))");
  static const std::regex whole(R"((.*)\.(weight|bias))");
  static const std::regex expert(R"(\.experts\.\d+\.)");
  std::smatch m;
  std::string prefix, path, suffix;
  if (std::regex_match(name, m, layer)) {
    prefix = "blk." + m[1].str() + ".";
    path = std::regex_replace(m[2].str(), expert, ".experts.*.");
    suffix = m[3];
  } else if (std::regex_match(name, m, whole)) {
    path = m[1];
    suffix = m[2];
  } else {
    return {};
  }
  for (const auto* list : {&naming.tensors, &llama_gguf_tensor_names()})
    for (const GgufTensorName& n : *list)
      if (path == n.checkpoint) return {prefix + n.gguf + "." + suffix, n.rows};
  return {};
}

void unpermute_qk_rows(const void* src, void* dst, int64_t heads, int64_t head_dim,
                       size_t row_bytes) {
  const int64_t half = head_dim / 2;
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(d + size_t(h * head_dim + j * half + i) * row_bytes,
                    s + size_t(h * head_dim + 2 * i + j) * row_bytes, row_bytes);
}

const FamilySpec& gguf_family(const GgufFile& g) {
  const std::string arch = g.required_string("general.architecture");
  const FamilySpec* spec = family_of_gguf_arch(arch);
  if (!spec)
    fail("{}: key 'general.architecture': GGUF architecture '{}' is not supported (supported: {})",
         g.path().string(), arch, supported_archs());
  return *spec;
}

json gguf_config_json(const GgufFile& g, const FamilySpec& spec) {
  const std::string arch = spec.gguf->arch;
  json j = json::parse(spec.gguf->implied_config);
  j["model_type"] = spec.model_type;
  j["architectures"] = json::array({spec.architecture});
  j["torch_dtype"] = "bfloat16";
  read_keys(g, arch, spec, common_keys(), j);
  read_keys(g, arch, spec, spec.gguf->keys, j);
  // The vocabulary is the embedding's rows (GGUF dims [hidden, vocab]).
  if (const GgufTensorInfo* e = g.find_tensor("token_embd.weight"); e && e->dims.size() == 2)
    j["vocab_size"] = e->dims[1];
  else if (const auto n = g.integer(arch + ".vocab_size"))
    j["vocab_size"] = *n;
  else
    fail("{}: tensor 'token_embd.weight' is missing (it gives the vocabulary size)",
         g.path().string());
  j["tie_word_embeddings"] = g.find_tensor("output.weight") == nullptr;
  if (const auto bos = g.integer("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = *bos;
  if (const auto eos = g.integer("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = *eos;
  for (const auto& [field, tensor] : spec.gguf->present_flags)
    j[field] = g.find_tensor(std::string("blk.0.") + tensor) != nullptr;
  if (spec.gguf->dense_layers_field && j["num_hidden_layers"].is_number_integer())
    j[spec.gguf->dense_layers_field] = dense_layers(g, j["num_hidden_layers"].get<int64_t>());
  return j;
}

namespace {

ModelConfig config_of(const GgufFile& g, const FamilySpec& spec) {
  return parse_config(gguf_config_json(g, spec),
                      g.path().string() + " (GGUF metadata read as config.json fields)");
}

}  // namespace

ModelConfig load_gguf_config(const std::filesystem::path& path) {
  const GgufFile g = GgufFile::open(path);
  return config_of(g, gguf_family(g));
}

Model load_gguf_model(const std::filesystem::path& path) {
  const GgufFile g = GgufFile::open(path);
  const FamilySpec& spec = gguf_family(g);
  Model m;
  m.dir = path;
  m.config = config_of(g, spec);
  GgufLoader(g, spec, m).load();
  return m;
}

}  // namespace sluice
