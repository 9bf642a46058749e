// The policy: every choice the engine makes about batching and memory, as data. The scheduler
// and the executor obey it; the planner fills it (engine/engine_plan.h); the command line can
// override any field.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/config.h"

namespace sluice {

// What GEMM inputs are rounded to. The router always runs in fp32: its top-k choice is
// discontinuous, and bf16 rounding would flip near-tied experts.
enum class Precision {
  kBf16,  // activations rounded to bf16 at each GEMM input: the fast path (AVX512-BF16 / AMX)
  kF32,   // fp32 activations against bf16 weights: equal to the reference up to addition order
};

const char* precision_name(Precision p);

struct Policy {
  int batch = 0;             // B: sequences decoding together (0: automatic)
  int attn_micro_batch = 0;  // b_a: tokens per attention micro-batch (0: automatic)
  int expert_batch = 0;      // b_e: most tokens in one expert GEMM (0: automatic)
  int prefill_chunk = 0;     // most prompt tokens prefilled per step (0: automatic)
  int kv_block_size = 16;    // tokens per KV-cache block
  int kv_blocks = 0;         // KV-cache blocks in host memory (0: automatic)
  int threads = 0;           // 0: every core
  Precision precision = Precision::kBf16;
  // Most rows of logits one step makes: one per decoding sequence (0 means B), or every row of a
  // step where whole prompts are scored (`perplexity`). Sizes the offload executor's buffers.
  int logit_rows = 0;
  // How the experts' (routed and shared) weights are held: bf16, or quantized at load with one
  // scale per row and group of expert_group inputs (0: the default, model/expert_quant.h). A
  // quantized checkpoint is used as it is (asking for another dtype is an error).
  ExpertDtype expert_dtype = ExpertDtype::kBf16;
  int expert_group = 0;
  // The disk tier (the routed experts stay in their files, read into a host page pool): how many
  // experts the pool holds. 0: every weight is in host memory.
  int pool_experts = 0;

  // Most rows per expert (and dense-MLP) GEMM on an offload device: b_e suits the CPU's caches,
  // but a GPU at 16 rows reads each weight from device memory once per 16 rows and stays memory
  // bound (an H200's ridge is ≈ 175 FLOP per byte: m ≈ 175 in bf16), so the device takes up to
  // kDeviceExpertRows rows, and never more than a step has (B + the prefill chunk). Measured on an
  // H200: prefill at 16 rows ran at 30% of the link's speed (bench/RESULTS.md, GPU offload).
  static constexpr int kDeviceExpertRows = 1024;
  int device_expert_rows() const;

  std::string describe() const;  // one line, for logs and reports
  nlohmann::json to_json() const;
};

// K and V (with MLA the latent and the RoPE key), every layer, bf16.
size_t kv_bytes_per_token(const ModelConfig& config);

}  // namespace sluice
