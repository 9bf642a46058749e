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

void fill_parallel(DType dtype, void* dst, int64_t n, uint64_t key, Init init) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const size_t esize = dtype_size(dtype);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    fill_range(dtype, static_cast<char*>(dst) + lo * esize, lo, hi, key, init);
  }
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
    if (t.mapping != TensorMapping::kWhole) {
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

WriteStats write_random_checkpoint(const ModelConfig& config, const std::filesystem::path& dir,
                                   uint64_t seed, size_t shard_bytes) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  ModelWeights unused;
  std::vector<ExpectedTensor> order = storage_order(tensor_table(config, unused));
  // A fused tensor is in the table once per part: written once.
  std::set<std::string> seen;
  std::erase_if(order, [&](const ExpectedTensor& t) { return !seen.insert(t.name).second; });
  const size_t esize = dtype_size(config.dtype);
  auto bytes_of = [&](const ExpectedTensor& t) { return size_t(shape_numel(t.shape)) * esize; };

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
    std::vector<TensorSpec> specs;
    for (const auto& t : shards[s]) {
      specs.push_back({t.name, config.dtype, t.shape});
      weight_map[t.name] = file;
    }
    SafetensorsWriter writer(dir / file, specs, {{"format", "pt"}});
    for (const auto& t : shards[s]) {
      const int64_t n = shape_numel(t.shape);
      const uint64_t key = name_key(t.name, seed);
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
  return stats;
}

}  // namespace sluice
