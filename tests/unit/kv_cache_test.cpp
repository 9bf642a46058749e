#include "runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "kernel_test_util.h"

namespace sluice {
namespace {

KvCacheConfig small_config(int64_t blocks, int block_size = 4) {
  return {.n_layers = 2,
          .kv_heads = 2,
          .head_dim = 3,
          .block_size = block_size,
          .total_blocks = blocks};
}

TEST(PagedKvCache, AppendTakesBlocksOnlyAtBlockBoundaries) {
  PagedKvCache cache(small_config(10));
  cache.allocate(7);
  EXPECT_EQ(cache.blocks_needed(7, 1), 1);
  ASSERT_TRUE(cache.append_slots(7, 3));  // positions 0..2: one block
  EXPECT_EQ(cache.block_table(7).size(), 1u);
  EXPECT_EQ(cache.blocks_needed(7, 1), 0);
  ASSERT_TRUE(cache.append_slots(7, 1));  // position 3 fills block 0
  EXPECT_EQ(cache.block_table(7).size(), 1u);
  ASSERT_TRUE(cache.append_slots(7, 5));  // positions 4..8: two more blocks
  EXPECT_EQ(cache.block_table(7).size(), 3u);
  EXPECT_EQ(cache.length(7), 9);
  EXPECT_EQ(cache.free_blocks(), 7);
  EXPECT_DOUBLE_EQ(cache.usage(), 0.3);
}

TEST(PagedKvCache, ExhaustionDefersWithoutChangingState) {
  PagedKvCache cache(small_config(3));
  cache.allocate(1);
  cache.allocate(2);
  ASSERT_TRUE(cache.append_slots(1, 8));   // 2 blocks
  EXPECT_FALSE(cache.append_slots(2, 5));  // needs 2, 1 free
  EXPECT_EQ(cache.length(2), 0);
  EXPECT_TRUE(cache.block_table(2).empty());
  EXPECT_EQ(cache.free_blocks(), 1);
  EXPECT_TRUE(cache.append_slots(2, 4));  // exactly the last block
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_TRUE(cache.append_slots(2, 0));
  EXPECT_FALSE(cache.append_slots(1, 1));
  EXPECT_EQ(cache.length(1), 8);
}

TEST(PagedKvCache, ReleasedBlocksAreReusedAndNothingLeaks) {
  PagedKvCache cache(small_config(6));
  for (int round = 0; round < 50; ++round) {
    for (int64_t s = 0; s < 3; ++s) {
      cache.allocate(s);
      ASSERT_TRUE(cache.append_slots(s, 1 + int((round + s) % 8)));
    }
    // Every block id is owned by at most one sequence.
    std::set<int32_t> owned;
    int64_t used = 0;
    for (int64_t s = 0; s < 3; ++s) {
      for (int32_t b : cache.block_table(s)) {
        EXPECT_TRUE(owned.insert(b).second) << "block " << b << " owned twice";
        EXPECT_GE(b, 0);
        EXPECT_LT(b, 6);
      }
      used += int64_t(cache.block_table(s).size());
    }
    EXPECT_EQ(cache.free_blocks() + used, 6);
    for (int64_t s = 0; s < 3; ++s) cache.release(s);
    EXPECT_EQ(cache.free_blocks(), 6);
    EXPECT_EQ(cache.live_sequences(), 0u);
  }
}

TEST(PagedKvCache, ReleasedBlockGoesToTheNextSequence) {
  PagedKvCache cache(small_config(2));
  cache.allocate(1);
  ASSERT_TRUE(cache.append_slots(1, 4));
  const int32_t block = cache.block_table(1)[0];
  cache.release(1);
  cache.allocate(2);
  ASSERT_TRUE(cache.append_slots(2, 1));
  EXPECT_EQ(cache.block_table(2)[0], block);
}

TEST(PagedKvCache, WritesLandWhereTheBlockTableAndLayoutSay) {
  const KvCacheConfig c = small_config(8, 4);
  PagedKvCache cache(c);
  cache.allocate(3);
  cache.allocate(4);
  // Interleave the two sequences so their blocks are not contiguous.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cache.append_slots(3, 4));
    ASSERT_TRUE(cache.append_slots(4, 2));
  }
  const int width = c.kv_heads * c.head_dim, stride = width + 2;
  const int n = 11;
  auto k = test::random_floats(size_t(n * stride), 11);
  auto v = test::random_floats(size_t(n * stride), 12);
  cache.write_tokens(1, 3, 0, 5, k.data(), v.data(), stride);
  cache.write_tokens(1, 3, 5, n - 5, k.data() + 5 * stride, v.data() + 5 * stride, stride);
  KvLayerView view = cache.layer_view(1);
  auto table = cache.block_table(3);
  for (int p = 0; p < n; ++p) {
    for (int h = 0; h < c.kv_heads; ++h) {
      for (int d = 0; d < c.head_dim; ++d) {
        const int64_t at = int64_t(p % c.block_size) * c.head_dim + d;
        const size_t src = size_t(p * stride + h * c.head_dim + d);
        EXPECT_EQ(view.k_tile(table[size_t(p / c.block_size)], h)[at], f32_to_bf16(k[src]));
        EXPECT_EQ(view.v_tile(table[size_t(p / c.block_size)], h)[at], f32_to_bf16(v[src]));
      }
    }
  }
}

// A one-plane cache (MLA's latent and RoPE key): one row per token, [block][slot][row] in each
// layer, half a two-plane block's bytes; the K/V calls refused, as a two-plane cache refuses rows.
TEST(PagedKvCache, OnePlaneRowsLandWhereTheBlockTableSays) {
  KvCacheConfig c{.n_layers = 3, .kv_heads = 1, .head_dim = 7, .block_size = 4, .total_blocks = 6};
  c.planes = 1;
  EXPECT_EQ(c.block_bytes(), int64_t(3) * 4 * 7 * 2);
  PagedKvCache cache(c);
  cache.allocate(1);
  cache.allocate(2);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cache.append_slots(1, 3));
    ASSERT_TRUE(cache.append_slots(2, 1));
  }
  const int n = 9, stride = 10;
  auto rows = test::random_floats(size_t(n * stride), 21);
  cache.write_rows(2, 1, 0, 4, rows.data(), stride);
  cache.write_rows(2, 1, 4, n - 4, rows.data() + 4 * stride, stride);
  const auto table = cache.block_table(1);
  for (int p = 0; p < n; ++p)
    for (int d = 0; d < c.head_dim; ++d)
      EXPECT_EQ(cache.block_data(2, table[size_t(p / 4)])[(p % 4) * c.head_dim + d],
                f32_to_bf16(rows[size_t(p * stride + d)]))
          << "position " << p << " value " << d;
  EXPECT_EQ(cache.stored_bytes(), int64_t(n) * c.head_dim * 2);
  EXPECT_EQ(cache.stored_token_layers(), n);
  std::vector<float> kv(7);
  EXPECT_THROW(cache.write_tokens(0, 1, 0, 1, kv.data(), kv.data()), Error);
  EXPECT_THROW(cache.layer_view(0), Error);
  PagedKvCache two_plane(small_config(2));
  two_plane.allocate(1);
  ASSERT_TRUE(two_plane.append_slots(1, 1));
  EXPECT_THROW(two_plane.write_rows(0, 1, 0, 1, kv.data()), Error);
  c.kv_heads = 2;
  EXPECT_THROW(PagedKvCache{c}, Error);  // one plane holds one row per token
}

TEST(PagedKvCache, RejectsMisuse) {
  PagedKvCache cache(small_config(2));
  cache.allocate(1);
  EXPECT_THROW(cache.allocate(1), Error);
  EXPECT_THROW(cache.append_slots(9, 1), Error);
  EXPECT_THROW(cache.release(9), Error);
  std::vector<float> row(6);
  EXPECT_THROW(cache.write_tokens(0, 1, 0, 1, row.data(), row.data()), Error);  // not appended
  ASSERT_TRUE(cache.append_slots(1, 1));
  EXPECT_THROW(cache.write_tokens(2, 1, 0, 1, row.data(), row.data()), Error);  // bad layer
}

TEST(PagedKvCache, BookkeepingOnlyCacheTracksBlocksButHoldsNoData) {
  KvCacheConfig c;
  c.n_layers = 2;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.block_size = 16;
  c.total_blocks = int64_t(1) << 20;  // 64 GiB of K/V if it were allocated
  c.with_storage = false;
  PagedKvCache kv(c);
  kv.allocate(1);
  EXPECT_TRUE(kv.append_slots(1, 40));
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_EQ(kv.free_blocks(), c.total_blocks - 3);
  std::vector<float> row(size_t(8 * 128));
  EXPECT_THROW(kv.write_tokens(0, 1, 0, 1, row.data(), row.data()), Error);
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), c.total_blocks);
}

// The host cache of a run whose attention is all on the GPU (ω = 0) has no blocks: it admits no
// position and reports no use; a negative size is refused.
TEST(PagedKvCache, AnEmptyPoolHoldsNothing) {
  PagedKvCache cache(small_config(0));
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_DOUBLE_EQ(cache.usage(), 0.0);
  cache.allocate(1);
  EXPECT_FALSE(cache.append_slots(1, 1));
  EXPECT_EQ(cache.length(1), 0);
  cache.release(1);
  EXPECT_THROW(PagedKvCache(small_config(-1)), Error);
}

}  // namespace
}  // namespace sluice
