// Models with random weights and real shapes: written as a complete Hugging Face folder
// (`sluice make-model`) or made directly in memory (`sluice bench --preset`). For one seed both
// hold the same values, tensor by tensor.
#pragma once

#include <cstdint>
#include <filesystem>

#include "model/weights.h"

namespace sluice {

Model make_random_model(const ModelConfig& config, uint64_t seed);

struct WriteStats {
  size_t bytes = 0;
  int shards = 0;
};
// Streams the checkpoint with memory bounded by one chunk; shards at tensor-group boundaries
// once a shard would pass `shard_bytes`.
WriteStats write_random_checkpoint(const ModelConfig& config, const std::filesystem::path& dir,
                                   uint64_t seed, size_t shard_bytes = size_t(4) << 30);

// Writes tokenizer.json (byte-level BPE, GPT-2 style, merges learned from a built-in English
// text, at most `vocab_size` tokens), tokenizer_config.json and generation_config.json.
void write_synthetic_tokenizer(const ModelConfig& config, const std::filesystem::path& dir);

}  // namespace sluice
