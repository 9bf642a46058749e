// MLA decode attention in the absorbed form: every ISA level against the scalar loop at awkward
// sizes and block layouts, and the absorbed form against the plain one (k and v decompressed
// through kv_b_proj) that transformers computes.
#include "kernels/cpu/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"
#include "test_util.h"

namespace sluice::cpu {
namespace {

struct Shape {
  int heads, rank, rope_dim, positions, block_size;
};

// A paged cache of `positions` rows, its blocks scattered in one buffer in reverse order.
struct PagedCache {
  std::vector<uint16_t> storage;
  std::vector<const uint16_t*> blocks;
  PagedCache(const Shape& s, uint32_t seed) {
    const int row = s.rank + s.rope_dim;
    const int n_blocks = (s.positions + s.block_size - 1) / s.block_size;
    storage = test::random_bf16(size_t(n_blocks) * s.block_size * row, seed);
    for (int b = 0; b < n_blocks; ++b)
      blocks.push_back(storage.data() + size_t(n_blocks - 1 - b) * s.block_size * row);
  }
  const uint16_t* row(const Shape& s, int p) const {
    return blocks[size_t(p / s.block_size)] + size_t(p % s.block_size) * (s.rank + s.rope_dim);
  }
};

MlaDecodeArgs args_for(const Shape& s, const PagedCache& cache, const std::vector<float>& ql,
                       const std::vector<float>& qr, std::vector<float>& out) {
  MlaDecodeArgs a;
  a.heads = s.heads;
  a.rank = s.rank;
  a.rope_dim = s.rope_dim;
  a.positions = s.positions;
  a.scale = 1.0f / std::sqrt(float(s.rank));
  a.blocks = cache.blocks;
  a.block_size = s.block_size;
  a.q_latent = ql.data();
  a.q_rope = qr.data();
  a.out_latent = out.data();
  return a;
}

const std::vector<Shape> kShapes = {
    {1, 1, 2, 1, 1},      {3, 7, 2, 5, 4},  {5, 17, 6, 37, 16},  {2, 33, 64, 29, 3},
    {4, 512, 64, 19, 16}, {7, 15, 0, 9, 8}, {16, 24, 8, 67, 32}, {1, 100, 10, 130, 7},
};

TEST(MlaAttention, EveryLevelMatchesTheScalarLoop) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(::testing::Message()
                   << isa_name(level) << " heads " << s.heads << " rank " << s.rank << " rope "
                   << s.rope_dim << " positions " << s.positions << " block " << s.block_size);
      const PagedCache cache(s, 11);
      const auto ql = test::random_floats(size_t(s.heads) * s.rank, 12);
      const auto qr = test::random_floats(size_t(s.heads) * s.rope_dim + 1, 13);
      std::vector<float> want(size_t(s.heads) * s.rank), got(want.size());
      mla_decode_attention_scalar(args_for(s, cache, ql, qr, want));
      mla_decode_attention(args_for(s, cache, ql, qr, got));
      EXPECT_LE(testing::relative_max_error(got, want), 1e-5);
    }
  }
}

// q_nope · (W_UK c) = (W_UKᵀ q_nope) · c and Σ w (W_UV c) = W_UV Σ w c: the absorbed kernel with
// the fold and unfold around it equals attention over the decompressed keys and values.
TEST(MlaAttention, AbsorbedFormEqualsTheDecompressedOne) {
  const Shape s{3, 20, 6, 23, 5};
  const int N = 9, V = 7;  // qk_nope_head_dim, v_head_dim
  const PagedCache cache(s, 21);
  const auto w_uk = test::random_floats(size_t(s.heads) * N * s.rank, 22, 0.3f);  // [h][N][R]
  const auto w_uv = test::random_floats(size_t(s.heads) * V * s.rank, 23, 0.3f);  // [h][V][R]
  const auto q_nope = test::random_floats(size_t(s.heads) * N, 24);
  const auto q_rope = test::random_floats(size_t(s.heads) * s.rope_dim, 25);
  const float scale = 1.0f / std::sqrt(float(N + s.rope_dim));

  std::vector<float> q_latent(size_t(s.heads) * s.rank, 0.f);
  for (int h = 0; h < s.heads; ++h)
    for (int n = 0; n < N; ++n)
      for (int r = 0; r < s.rank; ++r)
        q_latent[size_t(h) * s.rank + r] +=
            w_uk[(size_t(h) * N + n) * s.rank + r] * q_nope[size_t(h) * N + n];
  std::vector<float> out_latent(size_t(s.heads) * s.rank);
  MlaDecodeArgs a = args_for(s, cache, q_latent, q_rope, out_latent);
  a.scale = scale;
  mla_decode_attention(a);

  for (int h = 0; h < s.heads; ++h) {
    // The plain form in double: k_nope = W_UK c, v = W_UV c per position.
    std::vector<double> score(size_t(s.positions)), v_out(size_t(V), 0.0);
    double max_score = -INFINITY, sum = 0;
    for (int p = 0; p < s.positions; ++p) {
      const uint16_t* row = cache.row(s, p);
      double dot = 0;
      for (int n = 0; n < N; ++n) {
        double k = 0;
        for (int r = 0; r < s.rank; ++r)
          k += double(w_uk[(size_t(h) * N + n) * s.rank + r]) * bf16_to_f32(row[r]);
        dot += double(q_nope[size_t(h) * N + n]) * k;
      }
      for (int d = 0; d < s.rope_dim; ++d)
        dot += double(q_rope[size_t(h) * s.rope_dim + d]) * bf16_to_f32(row[s.rank + d]);
      score[size_t(p)] = dot * scale;
      max_score = std::max(max_score, score[size_t(p)]);
    }
    for (double& x : score) sum += (x = std::exp(x - max_score));
    for (int p = 0; p < s.positions; ++p)
      for (int v = 0; v < V; ++v) {
        double val = 0;
        for (int r = 0; r < s.rank; ++r)
          val += double(w_uv[(size_t(h) * V + v) * s.rank + r]) * bf16_to_f32(cache.row(s, p)[r]);
        v_out[size_t(v)] += score[size_t(p)] / sum * val;
      }
    // The absorbed form's output, unfolded through W_UV.
    std::vector<float> got(static_cast<size_t>(V)), want(static_cast<size_t>(V));
    for (int v = 0; v < V; ++v) {
      double val = 0;
      for (int r = 0; r < s.rank; ++r)
        val += double(w_uv[(size_t(h) * V + v) * s.rank + r]) * out_latent[size_t(h) * s.rank + r];
      got[size_t(v)] = float(val);
      want[size_t(v)] = float(v_out[size_t(v)]);
    }
    EXPECT_LE(testing::relative_max_error(got, want), 1e-5) << "head " << h;
  }
}

// The fold and the unfold at every level against the plain loops, and the plain loops against
// the definitions in double: W_UK's rows of head h are kv_b rows h·(N+V) .. h·(N+V)+N-1, W_UV's
// the V after them.
TEST(MlaAttention, FoldAndUnfoldMatchTheirDefinitions) {
  struct Dims {
    int heads, rank, nope, v;
  };
  const Dims dims[] = {
      {1, 1, 1, 1}, {3, 17, 5, 7}, {4, 33, 16, 9}, {2, 512, 24, 40}, {5, 64, 8, 16}};
  for (const Dims& d : dims) {
    const auto kv_b = test::random_bf16(size_t(d.heads) * (d.nope + d.v) * d.rank, 31, 0.3f);
    const MlaKvB w{kv_b.data(), d.heads, d.rank, d.nope, d.v};
    const int64_t stride = d.nope + 3;  // q_nope inside wider heads, as q's [nope | rope] heads
    const auto q = test::random_floats(size_t(d.heads) * stride, 32);
    const auto lat = test::random_floats(size_t(d.heads) * d.rank, 33);
    std::vector<float> fold_want(size_t(d.heads) * d.rank), unfold_want(size_t(d.heads) * d.v);
    mla_fold_query_scalar(w, q.data(), stride, fold_want.data());
    mla_unfold_output_scalar(w, lat.data(), unfold_want.data());
    std::vector<float> fold_def(fold_want.size()), unfold_def(unfold_want.size());
    for (int h = 0; h < d.heads; ++h) {
      for (int r = 0; r < d.rank; ++r) {
        double acc = 0;
        for (int n = 0; n < d.nope; ++n)
          acc += double(q[size_t(h * stride + n)]) *
                 bf16_to_f32(kv_b[(size_t(h) * (d.nope + d.v) + n) * d.rank + r]);
        fold_def[size_t(h) * d.rank + r] = float(acc);
      }
      for (int v = 0; v < d.v; ++v) {
        double acc = 0;
        for (int r = 0; r < d.rank; ++r)
          acc += double(lat[size_t(h) * d.rank + r]) *
                 bf16_to_f32(kv_b[(size_t(h) * (d.nope + d.v) + d.nope + v) * d.rank + r]);
        unfold_def[size_t(h) * d.v + v] = float(acc);
      }
    }
    EXPECT_LE(testing::relative_max_error(fold_want, fold_def), 1e-5);
    EXPECT_LE(testing::relative_max_error(unfold_want, unfold_def), 1e-5);
    for (IsaLevel level : isa_levels_up_to_current()) {
      ScopedIsaLevel at(level);
      std::vector<float> fold_got(fold_want.size()), unfold_got(unfold_want.size());
      mla_fold_query(w, q.data(), stride, fold_got.data());
      mla_unfold_output(w, lat.data(), unfold_got.data());
      EXPECT_LE(testing::relative_max_error(fold_got, fold_want), 1e-5)
          << isa_name(level) << " heads " << d.heads << " rank " << d.rank;
      EXPECT_LE(testing::relative_max_error(unfold_got, unfold_want), 1e-5)
          << isa_name(level) << " heads " << d.heads << " rank " << d.rank;
    }
  }
}

TEST(MlaAttention, TooFewBlocksIsAnError) {
  const Shape s{1, 4, 2, 9, 4};
  const PagedCache cache(s, 1);
  std::vector<const uint16_t*> two(cache.blocks.begin(), cache.blocks.begin() + 2);
  const auto ql = test::random_floats(4, 2), qr = test::random_floats(2, 3);
  std::vector<float> out(4);
  MlaDecodeArgs a = args_for(s, cache, ql, qr, out);
  a.blocks = two;
  EXPECT_ERROR_MENTIONS(mla_decode_attention(a), "2 blocks of 4", "9 positions");
}

}  // namespace
}  // namespace sluice::cpu
