#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"
#include "runtime/kv_cache.h"

namespace sluice::cpu {
namespace {

struct Case {
  int heads, kv_heads, head_dim, block_size, kv_len, n_q, window;
};

// Fills a cache with one sequence per case (interleaving their blocks), runs the batched kernel
// and compares every output with the dense double-precision reference.
void expect_matches_reference(const std::vector<Case>& cases, IsaLevel level) {
  const Case& c0 = cases[0];
  int64_t blocks = 0;
  for (const Case& c : cases) blocks += (c.kv_len + c.block_size - 1) / c.block_size + 1;
  PagedKvCache cache({.n_layers = 2,
                      .kv_heads = c0.kv_heads,
                      .head_dim = c0.head_dim,
                      .block_size = c0.block_size,
                      .total_blocks = blocks});
  const int width = c0.kv_heads * c0.head_dim, q_width = c0.heads * c0.head_dim;
  std::vector<std::vector<float>> ks, vs, qs, outs;
  std::vector<AttentionSequence> seqs;
  for (size_t s = 0; s < cases.size(); ++s) {
    const Case& c = cases[s];
    // Scale 2 on K gives peaked softmaxes, where the running-max rescaling matters.
    ks.push_back(test::random_floats(size_t(c.kv_len * width), 100 + uint32_t(s), 2.0f));
    vs.push_back(test::random_floats(size_t(c.kv_len * width), 200 + uint32_t(s)));
    qs.push_back(test::random_floats(size_t(c.n_q * q_width), 300 + uint32_t(s)));
    outs.emplace_back(size_t(c.n_q * q_width), -7.0f);
    for (auto* m : {&ks.back(), &vs.back()})
      for (float& x : *m) x = test::round_bf16(x);  // what the cache will hold
    cache.allocate(int64_t(s));
  }
  // Grow the sequences a few tokens at a time, round robin, so their blocks interleave.
  for (int pos = 0;; pos += 5) {
    bool any = false;
    for (size_t s = 0; s < cases.size(); ++s) {
      const int n = std::min(5, cases[s].kv_len - pos);
      if (n <= 0) continue;
      any = true;
      ASSERT_TRUE(cache.append_slots(int64_t(s), n));
      cache.write_tokens(1, int64_t(s), pos, n, ks[s].data() + pos * width,
                         vs[s].data() + pos * width);
    }
    if (!any) break;
  }
  for (size_t s = 0; s < cases.size(); ++s) {
    const Case& c = cases[s];
    seqs.push_back({.q = qs[s].data(),
                    .out = outs[s].data(),
                    .n_q = c.n_q,
                    .q_start = c.kv_len - c.n_q,
                    .kv_len = c.kv_len,
                    .block_table = cache.block_table(int64_t(s))});
  }
  const AttentionParams params{.heads = c0.heads,
                               .kv_heads = c0.kv_heads,
                               .head_dim = c0.head_dim,
                               .sliding_window = c0.window};
  {
    ScopedIsaLevel at(level);
    paged_attention(params, cache.layer_view(1), seqs);
  }
  for (size_t s = 0; s < cases.size(); ++s) {
    const Case& c = cases[s];
    std::vector<float> ref(size_t(c.n_q * q_width));
    attention_reference(params, qs[s].data(), c.n_q, c.kv_len - c.n_q, ks[s].data(), vs[s].data(),
                        c.kv_len, ref.data());
    // The kernels accumulate in fp32 over up to 513 keys: worst case ~513·2^-24 ≈ 3e-5 relative
    // to the O(1) values; the order of additions differs between paths, typical errors ~2e-6.
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(outs[s][i], ref[i], 1e-5 * (1 + std::abs(ref[i])))
          << "heads=" << c.heads << " kv_heads=" << c.kv_heads << " d=" << c.head_dim
          << " bs=" << c.block_size << " kv_len=" << c.kv_len << " n_q=" << c.n_q
          << " window=" << c.window << " at " << i << " (" << isa_name(level) << ")";
  }
}

// Lengths around block boundaries, GQA groups of 1, 3, 4 and 32 heads, head dims that are and
// are not multiples of 16 (AVX-512) or 8 (AVX2) lanes, blocks of 1, 3, 5 and 7 positions (odd
// block counts).
const Case kShapes[] = {
    {4, 1, 64, 16, 1, 1, 0},   {4, 4, 64, 16, 15, 1, 0},    {6, 2, 80, 16, 16, 1, 0},
    {6, 2, 80, 16, 17, 1, 0},  {32, 8, 128, 16, 100, 1, 0}, {32, 1, 128, 32, 513, 1, 0},
    {4, 2, 72, 32, 513, 1, 0}, {8, 2, 128, 7, 40, 1, 0},    {2, 1, 1, 4, 9, 1, 0},
    {3, 1, 7, 5, 31, 1, 0},    {4, 2, 12, 16, 33, 1, 0},    {2, 2, 129, 3, 31, 1, 0},
    {6, 3, 36, 1, 7, 1, 0},    {5, 5, 17, 9, 129, 1, 0},
};

TEST(CpuAttention, DecodeMatchesReference) {
  for (IsaLevel level : isa_levels_up_to_current())
    for (const Case& c : kShapes) expect_matches_reference({c, c}, level);
}

TEST(CpuAttention, PrefillChunkIsCausal) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    expect_matches_reference({{4, 2, 64, 16, 17, 17, 0}, {4, 2, 64, 16, 100, 33, 0}}, level);
    expect_matches_reference({{32, 8, 128, 16, 513, 70, 0}}, level);
    expect_matches_reference({{6, 2, 80, 32, 15, 15, 0}, {6, 2, 80, 32, 16, 1, 0}}, level);
    expect_matches_reference({{6, 3, 20, 7, 50, 13, 0}, {6, 3, 20, 7, 3, 3, 0}}, level);
    expect_matches_reference({{3, 1, 129, 5, 37, 37, 0}}, level);
  }
}

TEST(CpuAttention, SlidingWindowHidesOldKeys) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    expect_matches_reference({{4, 1, 64, 16, 100, 1, 16}, {4, 1, 64, 16, 513, 1, 100}}, level);
    expect_matches_reference({{6, 2, 80, 16, 100, 40, 17}, {6, 2, 80, 16, 17, 17, 1}}, level);
    expect_matches_reference({{32, 8, 128, 32, 513, 65, 64}}, level);
    expect_matches_reference({{3, 1, 7, 5, 60, 20, 6}, {3, 1, 7, 5, 11, 1, 3}}, level);
  }
}

TEST(CpuAttention, WindowOfOneCopiesTheOwnValue) {
  // With sliding_window = 1 each query sees only its own position: out = V[q_pos].
  PagedKvCache cache(
      {.n_layers = 1, .kv_heads = 1, .head_dim = 16, .block_size = 4, .total_blocks = 4});
  cache.allocate(0);
  ASSERT_TRUE(cache.append_slots(0, 6));
  auto k = test::random_floats(6 * 16, 1), v = test::random_floats(6 * 16, 2);
  cache.write_tokens(0, 0, 0, 6, k.data(), v.data());
  auto q = test::random_floats(6 * 2 * 16, 3);
  std::vector<float> out(q.size());
  AttentionSequence seq{.q = q.data(),
                        .out = out.data(),
                        .n_q = 6,
                        .q_start = 0,
                        .kv_len = 6,
                        .block_table = cache.block_table(0)};
  paged_attention({.heads = 2, .kv_heads = 1, .head_dim = 16, .sliding_window = 1},
                  cache.layer_view(0), {&seq, 1});
  for (int i = 0; i < 6; ++i)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 16; ++c)
        EXPECT_FLOAT_EQ(out[size_t((i * 2 + h) * 16 + c)], test::round_bf16(v[size_t(i * 16 + c)]));
}

TEST(CpuAttention, RejectsInconsistentArguments) {
  PagedKvCache cache(
      {.n_layers = 1, .kv_heads = 2, .head_dim = 16, .block_size = 4, .total_blocks = 2});
  cache.allocate(0);
  ASSERT_TRUE(cache.append_slots(0, 4));
  std::vector<float> q(4 * 16), out(q.size());
  AttentionSequence seq{.q = q.data(),
                        .out = out.data(),
                        .n_q = 1,
                        .q_start = 4,
                        .kv_len = 4,
                        .block_table = cache.block_table(0)};
  EXPECT_THROW(
      paged_attention({.heads = 4, .kv_heads = 2, .head_dim = 16}, cache.layer_view(0), {&seq, 1}),
      Error);  // query beyond kv_len
  seq.q_start = 3;
  EXPECT_THROW(
      paged_attention({.heads = 3, .kv_heads = 2, .head_dim = 16}, cache.layer_view(0), {&seq, 1}),
      Error);  // heads not a multiple of kv_heads
  seq.kv_len = 5;
  seq.q_start = 4;
  EXPECT_THROW(
      paged_attention({.heads = 4, .kv_heads = 2, .head_dim = 16}, cache.layer_view(0), {&seq, 1}),
      Error);  // block table too short
}

}  // namespace
}  // namespace sluice::cpu
