#include "model/gguf_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/gguf_dequant.h"
#include "model/expert_files.h"
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

// `field` of config.json, a dotted name being a field of a nested object.
json::json_pointer field_pointer(const std::string& field) {
  std::string p = "/" + field;
  std::replace(p.begin(), p.end(), '.', '/');
  return json::json_pointer(p);
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
    j[field_pointer(k.config)] = v->value;
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

// The disk tier reads experts of this type: BF16 as stored, a block type dequantised as it lands
// (F32 and F16 experts, which loading keeps as stored, would run differently from disk).
bool takes_on_disk(uint32_t type) {
  return type == uint32_t(GgmlType::BF16) || is_dequantized_type(type);
}

// The shape with leading 1s dropped: llama.cpp keeps [1, H] tensors as [H] or [H, 1] alike.
Shape squeezed(Shape s) {
  while (s.size() > 1 && s.front() == 1) s.erase(s.begin());
  return s;
}

// The tensor's values as the engine takes them: a view for float types (a copy for small ones),
// else dequantised to BF16 row by row; the file's pages of a copy are then dropped.
Tensor read_tensor(const GgufTensorInfo& t, const Shape& shape) {
  // A small float tensor (a norm, a bias) is copied: a view would keep the 2 MiB block of the
  // page cache it lies in mapped (MappedFile::drop_pages), with the neighbouring tensors' bytes.
  constexpr size_t kSmall = size_t(2) << 20;
  if (is_float_type(t.type) && t.file && t.nbytes < kSmall) {
    Tensor out = Tensor::allocate(float_dtype(t.type), shape);
    std::memcpy(out.data, t.data(), t.nbytes);
    t.file->drop_pages(t.offset, t.nbytes);
    return out;
  }
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
  const int64_t row = t.dims[0];
  dequantize_to_bf16(t.type, t.data(), out.as<uint16_t>(), out.numel() / row, row);
  // The file's bytes are not read again: its pages leave this process (one copy resident).
  if (t.file) t.file->drop_pages(t.offset, t.nbytes);
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

// DeepSeek's kv_b [heads·(nope + v), R] from llama.cpp's split form: head h's rows are
// k_b[h] [R, nope] transposed, then v_b[h] [v, R]. Bytes are moved when both have one dtype,
// else both are widened to F32.
Tensor join_latent_kv(Tensor k_b, Tensor v_b) {
  const int64_t heads = k_b.shape[0], R = k_b.shape[1], nope = k_b.shape[2], v = v_b.shape[1];
  if (k_b.dtype != v_b.dtype) {
    for (Tensor* t : {&k_b, &v_b}) {
      Tensor f = Tensor::allocate(DType::F32, t->shape);
      to_f32(t->dtype, t->data, f.as<float>(), size_t(t->numel()));
      *t = std::move(f);
    }
  }
  const size_t es = dtype_size(k_b.dtype);
  Tensor out = Tensor::allocate(k_b.dtype, {heads * (nope + v), R});
  const auto* kb = static_cast<const char*>(k_b.data);
  const auto* vb = static_cast<const char*>(v_b.data);
  auto* dst = static_cast<char*>(out.data);
  for (int64_t h = 0; h < heads; ++h) {
    char* head = dst + size_t(h * (nope + v) * R) * es;
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(head + size_t(i * R + r) * es, kb + size_t((h * R + r) * nope + i) * es, es);
    std::memcpy(head + size_t(nope * R) * es, vb + size_t(h * v * R) * es, size_t(v * R) * es);
  }
  return out;
}

// "blk.3.attn_kv_b.weight" → "blk.3.attn_k_b.weight" (part "k_b") or "blk.3.attn_v_b.weight".
std::string latent_kv_part(const std::string& kv_b_name, const char* part) {
  const size_t at = kv_b_name.rfind("kv_b");
  return kv_b_name.substr(0, at) + part + kv_b_name.substr(at + 4);
}

// The GGUF tensors one table entry reads, with the row-major shape each must have.
struct GgufSource {
  const ExpectedTensor* want;
  GgufName gn;
  std::vector<std::pair<std::string, Shape>> parts;  // one, or DeepSeek's k_b and v_b
};

class GgufLoader {
 public:
  GgufLoader(const GgufFile& g, const FamilySpec& spec, Model& m)
      : g_(g), naming_(*spec.gguf), m_(m) {}

  void load(bool experts_on_disk) {
    TensorTable table = tensor_table(m_.config, m_.weights);
    std::optional<ExpertFilesBuilder> on_disk;
    if (experts_on_disk) on_disk.emplace(m_.weights);
    std::vector<GgufSource> plan;
    for (const ExpectedTensor& want : table.tensors) {
      GgufName gn = gguf_tensor_name(naming_, want.name);
      if (gn.name.empty())
        fail("{}: {} tensor '{}' has no GGUF name in the family's description", where(),
             m_.config.architecture, want.name);
      if (want.expert > 0) continue;  // the stacked GGUF tensor fills the slot once
      plan.push_back(source(want, std::move(gn)));
      for (const auto& part : plan.back().parts) used_.insert(part.first);
    }
    check_present(plan);
    check_nothing_left();
    std::set<std::string> read_now;  // what loading reads: all but the experts left on disk
    for (const GgufSource& s : plan)
      if (!on_disk || !on_disk->takes(*s.want))
        for (const auto& part : s.parts) read_now.insert(part.first);
    report_dequantized(g_, read_now);
    for (const GgufSource& s : plan)
      if (on_disk && on_disk->takes(*s.want))
        leave_on_disk(s, *on_disk);
      else
        load_one(s);
    if (m_.config.tie_word_embeddings) m_.weights.lm_head = m_.weights.embed;
    if (on_disk) m_.expert_files = on_disk->finish(m_.config, where());
  }

 private:
  std::string where() const { return g_.path().string(); }

  GgufSource source(const ExpectedTensor& want, GgufName gn) const {
    GgufSource s{&want, std::move(gn), {}};
    if (s.gn.rows == GgufRows::kLatentKvSplit && !g_.find_tensor(s.gn.name)) {
      const LatentAttentionShape& m = m_.config.mla;
      const int64_t heads = m_.config.num_heads;
      s.parts = {{latent_kv_part(s.gn.name, "k_b"), {heads, m.kv_lora_rank, m.qk_nope_head_dim}},
                 {latent_kv_part(s.gn.name, "v_b"), {heads, m.v_head_dim, m.kv_lora_rank}}};
    } else {
      s.parts = {{s.gn.name, expected_shape(want)}};
    }
    return s;
  }

  // Every tensor there, with the shape the metadata implies, before any is read.
  void check_present(const std::vector<GgufSource>& plan) const {
    for (const GgufSource& s : plan)
      for (const auto& [name, shape] : s.parts) {
        const GgufTensorInfo* t = g_.find_tensor(name);
        if (!t)
          fail("{}: tensor '{}' is missing (expected shape {} for {}, as the checkpoint's '{}')",
               where(), name, shape_str(shape), m_.config.architecture, s.want->name);
        if (squeezed(t->shape()) != squeezed(shape))
          fail(
              "{}: tensor '{}': expected shape {} from the GGUF metadata ({}), got {} (GGUF dims "
              "{})",
              t->file->path().string(), name, shape_str(shape),
              s.want->shape_from ? std::string(s.want->shape_from)
                                 : naming_.arch + std::string(".* keys"),
              shape_str(t->shape()), shape_str(t->dims));
      }
  }

  // The shape of the GGUF tensor that holds a table entry: the checkpoint's, experts stacked
  // [E, ...] (DBRX's flat ones as the canonical slot, w2 already transposed by the converter).
  Shape expected_shape(const ExpectedTensor& want) const {
    const int64_t E = m_.config.num_experts;
    switch (want.mapping) {
      case TensorMapping::kExpertsFlat:
        return {E, want.shape[0] / E, want.shape[1]};
      case TensorMapping::kExpertsFlatTransposed:
        return {E, want.shape[1], want.shape[0] / E};
      default:
        break;
    }
    Shape s = want.shape;
    if (want.expert >= 0) s.insert(s.begin(), E);
    return s;
  }

  Tensor read(const std::pair<std::string, Shape>& part) const {
    return read_tensor(*g_.find_tensor(part.first), part.second);
  }

  // A fused tensor is read once for the slots that take rows of it (DBRX's Wqkv: q, k and v).
  const Tensor& read_fused(const std::pair<std::string, Shape>& part) {
    auto it = fused_.find(part.first);
    if (it == fused_.end()) it = fused_.emplace(part.first, read(part)).first;
    return it->second;
  }

  void load_one(const GgufSource& s) {
    const ExpectedTensor& want = *s.want;
    if (s.parts.size() == 2)
      *want.slot = join_latent_kv(read(s.parts[0]), read(s.parts[1]));
    else if (want.mapping == TensorMapping::kRows)
      *want.slot = mapped_slot(want, read_fused(s.parts[0]));
    else if (naming_.interleaved_qk && s.gn.rows != GgufRows::kAsIs)
      *want.slot = unpermuted(read(s.parts[0]), s.gn.rows);
    else
      *want.slot = read(s.parts[0]);
  }

  // A routed expert slot's stacked tensor, each expert a slice of the file the pool reads.
  void leave_on_disk(const GgufSource& s, ExpertFilesBuilder& on_disk) const {
    const GgufTensorInfo& t = *g_.find_tensor(s.parts[0].first);
    if (!takes_on_disk(t.type))
      fail(
          "{}: tensor '{}': the disk tier reads a GGUF file's experts in BF16, or in a block type "
          "it dequantises as they land (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K); this one is {} (give "
          "--host-mem enough for the whole model)",
          t.file->path().string(), t.name, ggml_type_name(t.type));
    on_disk.add_gguf(*s.want, t.file->path(), t.offset, t.nbytes, m_.config.num_experts, t.type);
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
  std::map<std::string, Tensor> fused_;
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
  static const std::regex indexed(R"((\d+)\.(.*))");
  static const std::regex suffixed(R"((.*)\.(weight|bias))");
  static const std::regex expert(R"(\.experts\.\d+\.)");
  const std::string layers = naming.layer_prefix;
  std::string prefix, path = name;
  std::smatch m;
  if (name.starts_with(layers)) {
    const std::string rest = name.substr(layers.size());
    if (!std::regex_match(rest, m, indexed)) return {};
    prefix = "blk." + m[1].str() + ".";
    path = std::regex_replace(m[2].str(), expert, ".experts.*.");
  }
  std::string module, suffix;
  if (std::regex_match(path, m, suffixed)) {
    module = m[1];
    suffix = m[2];
  }
  for (const auto* list : {&naming.tensors, &llama_gguf_tensor_names()})
    for (const GgufTensorName& n : *list) {
      if (path == n.checkpoint) return {prefix + n.gguf, n.rows};  // named whole
      if (!suffix.empty() && module == n.checkpoint)
        return {prefix + n.gguf + "." + suffix, n.rows};
    }
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
  const FamilySpec* spec = family_of_gguf(g, arch);
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
  if (spec.gguf->llama_style_keys) read_keys(g, arch, spec, common_keys(), j);
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
  if (spec.gguf->derive_config) spec.gguf->derive_config(g, j);
  return j;
}

namespace {

// The ggml types of the routed experts' stacked tensors, per matrix (gate, up, down); a tensor
// missing is left out (loading names it).
std::array<std::set<uint32_t>, 3> expert_types(const GgufFile& g, const FamilySpec& spec,
                                               const ModelConfig& c) {
  std::array<std::set<uint32_t>, 3> types;
  ModelWeights w;
  const TensorTable table = tensor_table(c, w);
  std::map<const Tensor*, size_t> matrix_of;
  for (const LayerWeights& L : w.layers) {
    matrix_of[&L.expert_gate] = 0;
    matrix_of[&L.expert_up] = 1;
    matrix_of[&L.expert_down] = 2;
  }
  for (const ExpectedTensor& want : table.tensors) {
    const auto it = matrix_of.find(want.slot);
    if (want.expert > 0 || it == matrix_of.end()) continue;  // one stacked tensor per slot
    if (const GgufTensorInfo* t = g.find_tensor(gguf_tensor_name(*spec.gguf, want.name).name))
      types[it->second].insert(t->type);
  }
  return types;
}

// How the file stores the routed experts (ModelConfig::stored_experts): the widest type over the
// layers, and whether any is not BF16 (the disk tier dequantises those as they land). It replaces
// what the family's reader set for its checkpoints (llama.cpp's converter stores DBRX's w2 as the
// canonical down, not transposed).
void read_stored_experts(const GgufFile& g, const FamilySpec& spec, ModelConfig& c) {
  const auto types = expert_types(g, spec, c);
  c.stored_experts = {};
  for (size_t j = 0; j < 3; ++j)
    for (const uint32_t type : types[j]) {
      const auto info = ggml_type_info(type);
      if (!info) continue;  // loading names it
      ModelConfig::StoredExpertMatrix& s = c.stored_experts[j];
      s.file_bytes_per_value = std::max(s.file_bytes_per_value,
                                        double(info->block_bytes) / double(info->block_elements));
      s.made_on_read = s.made_on_read || type != uint32_t(GgmlType::BF16);
    }
}

// The config the metadata stands for, without the experts' storage.
ModelConfig metadata_config(const GgufFile& g, const FamilySpec& spec) {
  return parse_config(gguf_config_json(g, spec),
                      g.path().string() + " (GGUF metadata read as config.json fields)");
}

ModelConfig config_of(const GgufFile& g, const FamilySpec& spec) {
  ModelConfig c = metadata_config(g, spec);
  read_stored_experts(g, spec, c);
  return c;
}

}  // namespace

ModelConfig load_gguf_config(const std::filesystem::path& path) {
  const GgufFile g = GgufFile::open(path);
  return config_of(g, gguf_family(g));
}

std::string gguf_disk_tier_refusal(const std::filesystem::path& path) {
  const GgufFile g = GgufFile::open(path);
  const FamilySpec& spec = gguf_family(g);
  for (const auto& types : expert_types(g, spec, metadata_config(g, spec)))
    for (const uint32_t type : types)
      if (!takes_on_disk(type))
        return fmt::format(
            "a GGUF file whose routed experts are {}; the disk tier reads BF16 and "
            "the block types it dequantises",
            ggml_type_name(type));
  return "";
}

Model load_gguf_model(const std::filesystem::path& path, bool experts_on_disk) {
  const GgufFile g = GgufFile::open(path);
  const FamilySpec& spec = gguf_family(g);
  Model m;
  m.dir = path;
  m.config = config_of(g, spec);
  GgufLoader(g, spec, m).load(experts_on_disk);
  return m;
}

}  // namespace sluice
