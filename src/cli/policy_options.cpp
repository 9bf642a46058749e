#include "cli/policy_options.h"

namespace sluice::cli {

void add_policy_options(CLI::App& sub, Policy& p) {
  const char* group = "Policy (0: automatic)";
  sub.add_option("--batch", p.batch, "B: sequences decoded together")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--attn-micro-batch", p.attn_micro_batch, "b_a: tokens per attention micro-batch")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-batch", p.expert_batch, "b_e: most tokens in one expert GEMM")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--prefill-chunk", p.prefill_chunk, "Most prompt tokens prefilled per step")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--kv-blocks", p.kv_blocks, "KV-cache blocks in host memory")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--kv-block-size", p.kv_block_size, "Tokens per KV-cache block")
      ->group(group)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--threads", p.threads, "Worker threads")
      ->group(group)
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--precision", p.precision,
                 "GEMM activations: bf16 (fast) or f32 (equal to the reference forward)")
      ->group(group)
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Precision>{{"bf16", Precision::kBf16}, {"f32", Precision::kF32}}))
      ->default_str("bf16");
}

}  // namespace sluice::cli
