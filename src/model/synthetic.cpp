#include "model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/staged_output.h"
#include "model/fp8_weights.h"
#include "model/tensor_table.h"

namespace sluice {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_key(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ splitmix64(seed);
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// How a tensor is initialised: uniform in [center - spread, center + spread]. Projections get
// std 1/sqrt(fan_in) so activations stay O(1) through the layers; norms scatter around 1;
// biases around 0, wide enough that a missing one shows.
struct Init {
  float center, spread;
};
Init init_for(const ExpectedTensor& t) {
  if (t.name.ends_with(".bias")) return {0.0f, 0.5f};
  // DeepSeek-V3's selection bias: comparable to the gaps between sigmoid scores, so it moves
  // the choice of experts, yet small enough that the chosen ones keep positive choice scores.
  if (t.name.ends_with("e_score_correction_bias")) return {0.0f, 0.25f};
  if (t.shape.size() == 1) return {1.0f, 0.1f};
  // fan_in: the last dimension, but the rows of one expert where the checkpoint stores its
  // transpose (DBRX's w2).
  const float fan_in = t.mapping == TensorMapping::kExpertsFlatTransposed
                           ? float(t.shape[0] / t.experts)
                           : float(t.shape.back());
  const bool embedding =
      t.name.find("embed_tokens") != std::string::npos || t.name.ends_with("wte.weight");
  const float std_dev = embedding ? 1.0f : 1.0f / std::sqrt(fan_in);
  return {0.0f, std_dev * std::sqrt(3.0f)};
}

// Fills elements [begin, end) of the tensor identified by `key`. Values depend only on the key and
// the element index, so any chunking (and any thread count) yields the same tensor.
constexpr int64_t kBlock = 1 << 14;
void fill_range(DType dtype, void* dst, int64_t begin, int64_t end, uint64_t key, Init init) {
  for (int64_t b = begin / kBlock; b * kBlock < end; ++b) {
    uint64_t state = splitmix64(key ^ splitmix64(uint64_t(b)));
    const int64_t lo = std::max(begin, b * kBlock), hi = std::min(end, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < hi; ++i) {
      state = splitmix64(state);
      if (i < lo) continue;
      float u = float(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      float value = init.center + init.spread * (2.0f * u - 1.0f);
      int64_t j = i - begin;
      switch (dtype) {
        case DType::BF16:
          static_cast<uint16_t*>(dst)[j] = f32_to_bf16(value);
          break;
        case DType::F16:
          static_cast<uint16_t*>(dst)[j] = f32_to_f16(value);
          break;
        default:
          static_cast<float*>(dst)[j] = value;
          break;
      }
    }
  }
}

// Elements [begin, end) into dst, on every thread.
void fill_parallel_range(DType dtype, void* dst, int64_t begin, int64_t end, uint64_t key,
                         Init init) {
  const int64_t blocks = (end - begin + kBlock - 1) / kBlock;
  const size_t esize = dtype_size(dtype);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t lo = begin + b * kBlock, hi = std::min(end, lo + kBlock);
    fill_range(dtype, static_cast<char*>(dst) + (lo - begin) * esize, lo, hi, key, init);
  }
}

void fill_parallel(DType dtype, void* dst, int64_t n, uint64_t key, Init init) {
  fill_parallel_range(dtype, dst, 0, n, key, init);
}

// The table's tensors reordered so that each stacked slot's experts lie back to back in order.
std::vector<ExpectedTensor> storage_order(const TensorTable& table) {
  std::map<Tensor*, size_t> first_seen;
  for (size_t i = 0; i < table.tensors.size(); ++i)
    first_seen.try_emplace(table.tensors[i].slot, i);
  std::vector<ExpectedTensor> order = table.tensors;
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return first_seen[a.slot] < first_seen[b.slot];
  });
  return order;
}

// Whether a synthetic checkpoint stores tensor `t` in FP8: every projection the GEMMs read when
// the config says FP8 (DeepSeek-V3's release: all but the embedding, norms, router and lm_head).
bool writes_fp8(const ModelConfig& c, const ModelWeights& slots, const ExpectedTensor& t) {
  return c.fp8_weights && t.mapping == TensorMapping::kWhole && fp8_slot_allowed(slots, t.slot);
}

// The FP8 form of table entry `t` [n, k] (one expert of its stacked slot, or the whole slot):
// the bf16 checkpoint's values quantized matrix by matrix, so no bf16 copy of a stack is held.
void fill_fp8_slot(const ModelConfig& c, const ExpectedTensor& t, uint64_t key) {
  const int64_t n = t.shape[0], k = t.shape[1];
  Shape shape = t.shape, scale_shape = fp8_scale_shape(n, k);
  if (t.expert >= 0) {
    shape.insert(shape.begin(), c.num_experts);
    scale_shape.insert(scale_shape.begin(), c.num_experts);
  }
  if (t.slot->empty()) {
    *t.slot = Tensor::allocate(DType::F8_E4M3, shape);
    t.slot->block_scales =
        std::make_shared<const Tensor>(Tensor::allocate(DType::F32, scale_shape));
  }
  const Tensor matrix = t.expert >= 0 ? t.slot->slice0(t.expert) : *t.slot;
  std::vector<uint16_t> w(size_t(n * k));
  fill_parallel(DType::BF16, w.data(), n * k, key, init_for(t));
  quantize_fp8_blocks(w.data(), n, k, matrix.as<uint8_t>(), matrix.block_scales->as<float>());
}

// Streams the FP8 codes of tensor `t` [n, k]: the values of the bf16 checkpoint (fill_range's,
// element for element) quantized a band of whole 128-row blocks at a time; returns its scales.
std::vector<float> write_fp8_codes(const ExpectedTensor& t, uint64_t key, int64_t chunk_elements,
                                   SafetensorsWriter& writer) {
  const int64_t n = t.shape[0], k = t.shape[1];
  const int64_t band = std::max<int64_t>(1, chunk_elements / (k * cpu::kFp8Block)) * cpu::kFp8Block;
  const Shape scale_shape = fp8_scale_shape(n, k);
  std::vector<float> scales(size_t(scale_shape[0] * scale_shape[1]));
  std::vector<uint16_t> w;
  std::vector<uint8_t> codes;
  for (int64_t r0 = 0; r0 < n; r0 += band) {
    const int64_t rows = std::min(band, n - r0);
    w.resize(size_t(rows * k));
    codes.resize(w.size());
    fill_parallel_range(DType::BF16, w.data(), r0 * k, (r0 + rows) * k, key, init_for(t));
    quantize_fp8_blocks(w.data(), rows, k, codes.data(),
                        scales.data() + (r0 / cpu::kFp8Block) * scale_shape[1]);
    writer.write(codes.data(), codes.size());
  }
  return scales;
}

void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) fail("{}: write failed", path.string());
}

}  // namespace

Model make_random_model(const ModelConfig& config, uint64_t seed) {
  Model m;
  m.config = config;
  TensorTable table = tensor_table(config, m.weights);
  std::map<std::string, Tensor> mapped_whole;  // a mapped entry's checkpoint tensor, made once
  for (const ExpectedTensor& t : table.tensors) {
    if (writes_fp8(config, m.weights, t)) {
      fill_fp8_slot(config, t, name_key(t.name, seed));
    } else if (t.mapping != TensorMapping::kWhole) {
      auto [it, fresh] = mapped_whole.try_emplace(t.name);
      if (fresh) {
        it->second = Tensor::allocate(config.dtype, t.shape);
        fill_parallel(config.dtype, it->second.data, it->second.numel(), name_key(t.name, seed),
                      init_for(t));
      }
      *t.slot = mapped_slot(t, it->second);
      // A transposed slot is a copy and its tensor's only user: free the checkpoint-layout one
      // now rather than at the end, or both (DBRX's w2: 2.1 GB a layer) are alive at once.
      if (t.mapping == TensorMapping::kExpertsFlatTransposed) mapped_whole.erase(it);
    } else if (t.expert < 0) {
      *t.slot = Tensor::allocate(config.dtype, t.shape);
      fill_parallel(config.dtype, t.slot->data, t.slot->numel(), name_key(t.name, seed),
                    init_for(t));
    } else {
      if (t.slot->empty()) {
        Shape stacked = t.shape;
        stacked.insert(stacked.begin(), config.num_experts);
        *t.slot = Tensor::allocate(config.dtype, stacked);
      }
      Tensor slice = t.slot->slice0(t.expert);
      fill_parallel(config.dtype, slice.data, slice.numel(), name_key(t.name, seed), init_for(t));
    }
  }
  if (config.tie_word_embeddings) m.weights.lm_head = m.weights.embed;
  return m;
}

WriteStats write_random_checkpoint(const ModelConfig& config,
                                   const std::filesystem::path& final_dir, uint64_t seed,
                                   size_t shard_bytes) {
  StagedDirectory staged(final_dir);  // complete or absent, even after kill -9
  const std::filesystem::path& dir = staged.path();
  ModelWeights unused;
  std::vector<ExpectedTensor> order = storage_order(tensor_table(config, unused));
  // A fused tensor is in the table once per part: written once.
  std::set<std::string> seen;
  std::erase_if(order, [&](const ExpectedTensor& t) { return !seen.insert(t.name).second; });
  const size_t esize = dtype_size(config.dtype);
  auto bytes_of = [&](const ExpectedTensor& t) {
    if (!writes_fp8(config, unused, t)) return size_t(shape_numel(t.shape)) * esize;
    return size_t(shape_numel(t.shape)) +
           size_t(shape_numel(fp8_scale_shape(t.shape[0], t.shape[1]))) * 4;
  };

  // Cut into shards between slots, so a stack of experts never straddles two files.
  std::vector<std::vector<ExpectedTensor>> shards(1);
  size_t shard_size = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i, group = 0;
    while (j < order.size() && order[j].slot == order[i].slot) group += bytes_of(order[j++]);
    if (shard_size > 0 && shard_size + group > shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().insert(shards.back().end(), order.begin() + i, order.begin() + j);
    shard_size += group;
    i = j;
  }

  WriteStats stats;
  stats.shards = int(shards.size());
  nlohmann::json weight_map = nlohmann::json::object();
  constexpr int64_t kChunk = int64_t(1) << 24;  // elements per write: bounds memory at 64 MiB
  std::vector<char> buffer(size_t(kChunk) * esize);
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string file = shards.size() == 1 ? "model.safetensors"
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1,
                                                        shards.size());
    // An FP8 slot's scales follow all its codes, so a stack of experts' codes lies back to back
    // and loads as a view of the mapping.
    std::vector<TensorSpec> specs, scale_specs;
    for (size_t i = 0; i < shards[s].size(); ++i) {
      const ExpectedTensor& t = shards[s][i];
      weight_map[t.name] = file;
      if (!writes_fp8(config, unused, t)) {
        specs.push_back({t.name, config.dtype, t.shape});
      } else {
        specs.push_back({t.name, DType::F8_E4M3, t.shape});
        scale_specs.push_back(
            {fp8_scale_name(t.name), DType::F32, fp8_scale_shape(t.shape[0], t.shape[1])});
        weight_map[fp8_scale_name(t.name)] = file;
      }
      if (i + 1 == shards[s].size() || shards[s][i + 1].slot != t.slot) {
        specs.insert(specs.end(), scale_specs.begin(), scale_specs.end());
        scale_specs.clear();
      }
    }
    SafetensorsWriter writer(dir / file, specs, {{"format", "pt"}});
    std::vector<std::vector<float>> slot_scales;
    for (size_t i = 0; i < shards[s].size(); ++i) {
      const ExpectedTensor& t = shards[s][i];
      const int64_t n = shape_numel(t.shape);
      const uint64_t key = name_key(t.name, seed);
      if (writes_fp8(config, unused, t)) {
        slot_scales.push_back(write_fp8_codes(t, key, kChunk, writer));
        stats.bytes += size_t(n);
        if (i + 1 == shards[s].size() || shards[s][i + 1].slot != t.slot) {
          for (const std::vector<float>& scales : slot_scales) {
            writer.write(scales.data(), scales.size() * sizeof(float));
            stats.bytes += scales.size() * sizeof(float);
          }
          slot_scales.clear();
        }
        continue;
      }
      for (int64_t begin = 0; begin < n; begin += kChunk) {
        const int64_t end = std::min(n, begin + kChunk), count = end - begin;
        const int64_t per_thread_blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < per_thread_blocks; ++b) {
          int64_t lo = begin + b * kBlock, hi = std::min(end, lo + kBlock);
          fill_range(config.dtype, buffer.data() + (lo - begin) * esize, lo, hi, key, init_for(t));
        }
        writer.write(buffer.data(), size_t(count) * esize);
        stats.bytes += size_t(count) * esize;
      }
    }
    writer.finish();
  }
  if (shards.size() > 1)
    write_json(dir / "model.safetensors.index.json",
               {{"metadata", {{"total_size", stats.bytes}}}, {"weight_map", weight_map}});
  write_json(dir / "config.json", config_to_json(config));
  write_synthetic_tokenizer(config, dir);
  staged.commit();
  return stats;
}

}  // namespace sluice
