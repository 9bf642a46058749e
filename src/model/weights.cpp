#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/expert_files.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"
#include "model/gguf_model.h"
#include "model/quantized_checkpoint.h"
#include "model/tensor_table.h"

namespace sluice {

namespace {

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

void require_one_dtype(const std::vector<const TensorEntry*>& experts) {
  const TensorEntry& first = *experts[0];
  for (const TensorEntry* x : experts)
    if (x->dtype != first.dtype)
      fail("{}: tensor '{}' is {} but '{}' is {}; experts of one layer must share a dtype",
           x->file->path().string(), x->name, dtype_name(x->dtype), first.name,
           dtype_name(first.dtype));
}

// Experts arrive as E separate tensors. When the file stores them back to back in order, the
// stacked [E, ...] tensor is a view of the mapping; otherwise it is repacked once here, expert by
// expert, each expert's pages of the mapping dropped once copied (one copy stays resident). The
// experts share a dtype (require_one_dtype).
Tensor stack_experts(const std::vector<const TensorEntry*>& experts) {
  const TensorEntry& first = *experts[0];
  bool contiguous = true;
  for (size_t e = 0; e < experts.size(); ++e) {
    const TensorEntry& x = *experts[e];
    if (x.file != first.file || x.offset != first.offset + e * first.nbytes) contiguous = false;
  }
  Shape shape = first.shape;
  shape.insert(shape.begin(), int64_t(experts.size()));
  if (contiguous) {
    Tensor t = first.view();
    t.shape = shape;
    return t;
  }
  Tensor t = Tensor::allocate(first.dtype, shape);
  for (size_t e = 0; e < experts.size(); ++e) {
    const TensorEntry& x = *experts[e];
    x.read_in();
    std::memcpy(static_cast<char*>(t.data) + e * first.nbytes, x.file->data() + x.offset,
                first.nbytes);
    x.drop_pages();
  }
  return t;
}

// The block scales of an F8_E4M3 checkpoint tensor, checked: FP8 declared by config.json, in a
// slot the GEMMs read in FP8, and `<name>_scale_inv` present, F32 and [⌈n/128⌉, ⌈k/128⌉].
const TensorEntry& fp8_scales(const Checkpoint& ckpt, const Model& m, const ExpectedTensor& want,
                              const TensorEntry& got) {
  const std::string file = got.file->path().string();
  if (!m.config.fp8_weights)
    fail(
        "{}: tensor '{}' is F8_E4M3 but config.json has no quantization_config declaring FP8 "
        "weights (quant_method \"fp8\", fmt \"e4m3\", weight_block_size [128, 128])",
        file, want.name);
  if (!fp8_slot_allowed(m.weights, want.slot) || want.mapping != TensorMapping::kWhole)
    fail(
        "{}: tensor '{}' is F8_E4M3; FP8 is read for the linear projections of attention, "
        "experts and MLPs stored one matrix per tensor; expected BF16, F16 or F32 here",
        file, want.name);
  const std::string name = fp8_scale_name(want.name);
  const Shape shape = fp8_scale_shape(want.shape[0], want.shape[1]);
  const TensorEntry* scales = ckpt.find(name);
  if (!scales)
    fail(
        "{}: tensor '{}' is missing: expected F32 {} block scales of the F8_E4M3 tensor '{}' {} "
        "(one per 128 x 128 block, the last row and column of blocks may be partial)",
        file, name, shape_str(shape), want.name, shape_str(want.shape));
  if (scales->dtype != DType::F32 || scales->shape != shape)
    fail(
        "{}: tensor '{}': expected F32 {} (the 128 x 128 block scales of '{}' {}: "
        "ceil(rows/128) x ceil(cols/128)), got {} {}",
        scales->file->path().string(), name, shape_str(shape), want.name, shape_str(want.shape),
        dtype_name(scales->dtype), shape_str(scales->shape));
  return *scales;
}

// The number of layers LoadOptions::layers keeps, checked against the model's.
int layers_kept(const ModelConfig& c, int asked, const std::filesystem::path& dir) {
  if (asked > c.num_layers)
    fail("{}: {} layers asked for (--layers); the model has {}", dir.string(), asked, c.num_layers);
  return asked > 0 ? asked : c.num_layers;
}

// The expert and dense-MLP slots (the matrices load_folder copies: stacked, quantized, packed or
// transposed) of the first `layers` layers, which it fills, and of the later ones, whose tensors
// it checks but never reads.
struct ExpertSlots {
  std::set<const Tensor*> kept, later;
};

ExpertSlots expert_slots(ModelWeights& w, int layers) {
  ExpertSlots slots;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& L = w.layers[l];
    for (const Tensor* t :
         {&L.expert_gate, &L.expert_up, &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down})
      (int(l) < layers ? slots.kept : slots.later).insert(t);
  }
  return slots;
}

// The quantization load_folder applies matrix by matrix as it reads the experts of the first
// `layers` layers: what `options` asks of a bf16/f16/f32 checkpoint whose experts stay in memory
// (its group resolved against those layers' rows); none otherwise (quantize_model_experts then
// keeps a quantized checkpoint, quantizes FP8 weights after loading, or refuses the disk tier's).
ExpertQuant quantize_at_load(ModelConfig c, int layers, const LoadOptions& options,
                             const std::filesystem::path& dir) {
  if (options.experts_on_disk || c.expert_quant.quantized() || c.fp8_weights) return {};
  c.num_layers = layers;
  return resolve_expert_quant(c, options.expert_quant, dir.string());
}

// Puts each checked tensor of the kept layers into its slot: a view of the mapping where it is
// stored as it runs, else a copy. The copies wait until every tensor is checked (fill_copies):
// experts stored one tensor each (stacked, or quantized as `quant` asks) with their FP8 block
// scales, and dense-MLP matrices quantized at load.
class SlotFiller {
 public:
  SlotFiller(ExpertSlots slots, ExpertQuant quant) : slots_(std::move(slots)), quant_(quant) {}

  // False: a later layer's tensor, left out.
  bool keeps(const ExpectedTensor& want) const { return !slots_.later.count(want.slot); }

  void place(const ExpectedTensor& want, const TensorEntry& got, const TensorEntry* scales) {
    if (want.mapping != TensorMapping::kWhole) {
      *want.slot = mapped_slot(want, got.view());
    } else if (want.expert >= 0) {
      add(experts_[want.slot], want.expert, &got);
      if (scales) add(expert_scales_[want.slot], want.expert, scales);
    } else if (quant_.quantized() && slots_.kept.count(want.slot)) {
      dense_to_quantize_[want.slot] = &got;
    } else {
      *want.slot = got.view();
      if (scales) want.slot->block_scales = std::make_shared<const Tensor>(scales->view());
    }
  }

  void fill_copies() const {
    // Values first: experts of mixed dtypes fail there, before a scale list with gaps is read.
    for (const auto& [slot, list] : experts_) require_one_dtype(list);
    for (const auto& [slot, list] : experts_)
      *slot =
          quant_.quantized() ? quantize_mapped_matrices(list, quant_, true) : stack_experts(list);
    for (const auto& [slot, list] : expert_scales_)
      slot->block_scales = std::make_shared<const Tensor>(stack_experts(list));
    for (const auto& [slot, matrix] : dense_to_quantize_)
      *slot = quantize_mapped_matrices({matrix}, quant_, false);
  }

 private:
  static void add(std::vector<const TensorEntry*>& list, int expert, const TensorEntry* entry) {
    if (list.size() <= size_t(expert)) list.resize(size_t(expert) + 1);
    list[size_t(expert)] = entry;
  }

  const ExpertSlots slots_;
  const ExpertQuant quant_;
  std::map<Tensor*, std::vector<const TensorEntry*>> experts_, expert_scales_;
  std::map<Tensor*, const TensorEntry*> dense_to_quantize_;
};

// Every tensor of the checkpoint was used, or is one the table ignores.
void require_no_unexpected_tensor(const Checkpoint& ckpt, const TensorTable& table,
                                  const std::map<std::string, bool>& used,
                                  const std::string& architecture) {
  for (const auto& [name, entry] : ckpt.tensors()) {
    if (used.count(name)) continue;
    bool ignored = false;
    for (const auto& suffix : table.ignored_suffixes) ignored |= name.ends_with(suffix);
    for (const auto& prefix : table.ignored_prefixes) ignored |= name.starts_with(prefix);
    if (!ignored)
      fail("{}: unexpected tensor '{}' {} {}: not part of a {} checkpoint with this config",
           entry.file->path().string(), name, dtype_name(entry.dtype), shape_str(entry.shape),
           architecture);
  }
}

// A float tensor's checks: its shape, and its dtype (BF16, F16 or F32, or F8_E4M3 where the
// slot allows it, whose block scales it returns; else null).
const TensorEntry* check_float_tensor(const Checkpoint& ckpt, const Model& m,
                                      const ExpectedTensor& want, const TensorEntry& got) {
  const std::string file = got.file->path().string();
  if (got.shape != want.shape)
    fail("{}: tensor '{}': expected shape {}, got {}{}", file, want.name, shape_str(want.shape),
         shape_str(got.shape),
         want.shape_from ? fmt::format(" (the shape follows config.json's {})", want.shape_from)
                         : "");
  if (got.dtype == DType::F8_E4M3) return &fp8_scales(ckpt, m, want, got);
  if (!is_float(got.dtype))
    fail("{}: tensor '{}': expected dtype BF16, F16 or F32{}, got {}", file, want.name,
         fp8_slot_allowed(m.weights, want.slot) ? " (or F8_E4M3 with block scales)" : "",
         dtype_name(got.dtype));
  return nullptr;
}

// The disk tier reads experts as stored, and its kernels take bf16 or FP8 ones.
void check_disk_tier_dtype(const ExpectedTensor& want, const TensorEntry& got) {
  if (got.dtype != DType::BF16 && got.dtype != DType::F8_E4M3)
    fail(
        "{}: tensor '{}': the disk tier reads experts as stored and runs bf16 or FP8 ones; this "
        "one is {} (give --host-mem enough for the whole model)",
        got.file->path().string(), want.name, dtype_name(got.dtype));
}

Model load_folder(const std::filesystem::path& dir, const LoadOptions& options) {
  Model m;
  m.dir = dir;
  if (!std::filesystem::exists(dir / "config.json"))
    fail("{}: no config.json (expected a Hugging Face model folder or a .gguf file)", dir.string());
  m.config = load_config(dir / "config.json");
  Checkpoint ckpt = Checkpoint::open(dir);
  TensorTable table = tensor_table(m.config, m.weights);
  if (m.config.tie_word_embeddings) table.ignored_suffixes.push_back("lm_head.weight");

  const int layers = layers_kept(m.config, options.layers, dir);
  SlotFiller slots(expert_slots(m.weights, layers),
                   quantize_at_load(m.config, layers, options, dir));
  std::map<std::string, bool> used;
  QuantizedCheckpointReader quantized(m.config, m.weights);
  ExpertFilesBuilder on_disk(m.weights);
  for (const ExpectedTensor& want : table.tensors) {
    const TensorEntry* got = ckpt.find(want.name);
    if (!got)
      fail("{}: tensor '{}' is missing (expected shape {} for {})", dir.string(), want.name,
           shape_str(want.shape), m.config.architecture);
    const bool stays_on_disk = options.experts_on_disk && on_disk.takes(want);
    if (stays_on_disk) {
      if (const TensorEntry* scales = quantized.check(ckpt, want, *got)) {
        on_disk.add(want, *got, scales);
        used[want.name] = used[scale_tensor_name(want.name)] = true;
        continue;
      }
    } else if (slots.keeps(want) ? quantized.add(ckpt, want, *got)
                                 : quantized.check(ckpt, want, *got) != nullptr) {
      used[want.name] = used[scale_tensor_name(want.name)] = true;
      continue;
    }
    const TensorEntry* scales = check_float_tensor(ckpt, m, want, *got);
    used[want.name] = true;
    if (scales) used[scales->name] = true;
    if (stays_on_disk) {
      check_disk_tier_dtype(want, *got);
      on_disk.add(want, *got, scales);
    } else if (slots.keeps(want)) {
      slots.place(want, *got, scales);
    }
  }
  require_no_unexpected_tensor(ckpt, table, used, m.config.architecture);
  slots.fill_copies();
  quantized.pack();
  if (m.config.tie_word_embeddings) m.weights.lm_head = m.weights.embed;
  if (options.experts_on_disk) m.expert_files = on_disk.finish(m.config, dir.string());
  return m;
}

}  // namespace

Model load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  Model m = is_gguf_file(dir) ? load_gguf_model(dir, options.experts_on_disk)
                               : load_folder(dir, options);
  m.config.num_layers = layers_kept(m.config, options.layers, dir);  // the first layers
  m.weights.layers.resize(size_t(m.config.num_layers));
  quantize_model_experts(m, options.expert_quant);
  return m;
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  return is_gguf_file(dir) ? load_gguf_config(dir) : load_config(dir / "config.json");
}

std::array<const Tensor*, 24> layer_tensors_but_experts(const LayerWeights& L) {
  return {&L.attn_norm, &L.wq,          &L.wk,       &L.wv,        &L.wo,       &L.bq,
          &L.bk,        &L.bv,          &L.bo,       &L.q_norm,    &L.k_norm,   &L.q_a,
          &L.q_a_norm,  &L.q_b,         &L.kv_a,     &L.kv_a_norm, &L.kv_b,     &L.ffn_norm,
          &L.router,    &L.router_bias, &L.mlp_gate, &L.mlp_up,    &L.mlp_down, &L.mlp_scale};
}

std::array<const Tensor*, 3> layer_expert_tensors(const LayerWeights& L) {
  return {&L.expert_gate, &L.expert_up, &L.expert_down};
}

std::vector<const Tensor*> weight_tensors(const ModelWeights& w) {
  std::vector<const Tensor*> all;
  std::set<const void*> seen;
  auto add = [&](const Tensor& t) {
    if (!t.empty() && seen.insert(t.data).second) all.push_back(&t);
  };
  add(w.embed);
  for (const LayerWeights& L : w.layers) {
    for (const Tensor* t : layer_tensors_but_experts(L)) add(*t);
    for (const Tensor* t : layer_expert_tensors(L)) add(*t);
  }
  add(w.final_norm);
  add(w.lm_head);
  return all;
}

size_t read_weights_into_memory(const Model& model) {
  size_t bytes = 0;
  for (const Tensor* t : weight_tensors(model.weights)) {
    read_into_memory(t->data, t->nbytes(), model.dir);
    bytes += t->nbytes();
    if (t->block_scales) {
      read_into_memory(t->block_scales->data, t->block_scales->nbytes(), model.dir);
      bytes += t->block_scales->nbytes();
    }
  }
  return bytes;
}

}  // namespace sluice
