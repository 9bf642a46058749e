#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Resolved {
  AttentionParams p;
  int group;  // query heads per KV head
};

Resolved resolve(const AttentionParams& in) {
  AttentionParams p = in;
  if (p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0 || p.heads % p.kv_heads != 0)
    fail(
        "attention: field 'heads': expected heads a positive multiple of kv_heads and "
        "head_dim > 0, got heads={} kv_heads={} head_dim={}",
        p.heads, p.kv_heads, p.head_dim);
  if (p.scale == 0.0f) p.scale = 1.0f / std::sqrt(float(p.head_dim));
  return {p, p.heads / p.kv_heads};
}

// Key positions [lo, hi] visible to a query at q_pos.
struct KeyRange {
  int lo, hi;
};
KeyRange visible_keys(const AttentionParams& p, int q_pos, int kv_len) {
  const int hi = std::min(q_pos, kv_len - 1);
  const int lo = p.sliding_window > 0 ? std::max(0, q_pos - p.sliding_window + 1) : 0;
  return {lo, hi};
}

void check_sequence(const AttentionParams& p, const KvLayerView& kv, const AttentionSequence& s) {
  const int64_t blocks_needed = (int64_t(s.kv_len) + kv.block_size - 1) / kv.block_size;
  if (s.n_q < 0 || s.q_start < 0 || s.q_start + s.n_q > s.kv_len ||
      int64_t(s.block_table.size()) < blocks_needed)
    fail(
        "attention: field 'sequence': expected 0 <= q_start, q_start + n_q <= kv_len and a "
        "block table covering kv_len, got q_start={} n_q={} kv_len={} with {} blocks of {}",
        s.q_start, s.n_q, s.kv_len, s.block_table.size(), kv.block_size);
  if (kv.kv_heads != p.kv_heads || kv.head_dim != p.head_dim)
    fail("attention: field 'kv': expected a cache with kv_heads={} head_dim={}, got {} {}",
         p.kv_heads, p.head_dim, kv.kv_heads, kv.head_dim);
}

// ---- Scalar fallback: per (token, head), scores → softmax → weighted sum over the pages. ----

void attention_scalar(const AttentionParams& p, int group, const KvLayerView& kv,
                      const AttentionSequence& s) {
  const int d = p.head_dim, bs = kv.block_size;
  const int64_t q_stride = s.q_stride ? s.q_stride : int64_t(p.heads) * d;
  const int64_t out_stride = s.out_stride ? s.out_stride : int64_t(p.heads) * d;
  std::vector<float> scores(size_t(s.kv_len));
  for (int i = 0; i < s.n_q; ++i) {
    const KeyRange keys = visible_keys(p, s.q_start + i, s.kv_len);
    for (int h = 0; h < p.heads; ++h) {
      const float* q = s.q + i * q_stride + int64_t(h) * d;
      float* out = s.out + i * out_stride + int64_t(h) * d;
      std::fill(out, out + d, 0.0f);
      if (keys.lo > keys.hi) continue;
      const int g = h / group;
      float max_score = kNegInf;
      for (int t = keys.lo; t <= keys.hi; ++t) {
        const uint16_t* k = kv.k_tile(s.block_table[size_t(t / bs)], g) + int64_t(t % bs) * d;
        float dot = 0;
        for (int c = 0; c < d; ++c) dot += q[c] * bf16_to_f32(k[c]);
        scores[size_t(t)] = dot * p.scale;
        max_score = std::max(max_score, scores[size_t(t)]);
      }
      float sum = 0;
      for (int t = keys.lo; t <= keys.hi; ++t) {
        const float w = std::exp(scores[size_t(t)] - max_score);
        sum += w;
        const uint16_t* v = kv.v_tile(s.block_table[size_t(t / bs)], g) + int64_t(t % bs) * d;
        for (int c = 0; c < d; ++c) out[c] += w * bf16_to_f32(v[c]);
      }
      for (int c = 0; c < d; ++c) out[c] /= sum;
    }
  }
}

// ---- AVX-512 path: one task = (sequence, KV head, chunk of queries). ----

struct Task {
  int seq, kv_head, q_begin, q_end;
};

// Per-thread scratch, padded to whole vectors of 16 floats.
struct Scratch {
  std::vector<float> q, acc, scores, k_tile, v_tile, max, sum;
};

SLUICE_AVX512 inline float reduce_add(__m512 v) {
  __m512 t = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));  // swap 256-bit halves
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xb1));         // swap 128-bit lanes
  t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0x4e));            // swap 64-bit pairs
  t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0xb1));            // swap neighbours
  return _mm512_cvtss_f32(t);
}

// Converts rows [0, n) of a bf16 [rows, d] tile into fp32 rows of `dp` floats (zero padded).
SLUICE_AVX512 void tile_to_f32(const uint16_t* tile, int n, int d, int dp, float* out) {
  for (int j = 0; j < n; ++j) {
    const uint16_t* row = tile + int64_t(j) * d;
    float* o = out + int64_t(j) * dp;
    int c = 0;
    for (; c + 16 <= d; c += 16) _mm512_storeu_ps(o + c, avx512::load_bf16(row + c));
    if (c < d) _mm512_storeu_ps(o + c, avx512::load_bf16_partial(row + c, d - c));
  }
}

// Sixteen dot products q·k_j (j < 16, k rows dp floats apart) returned as one vector. Sixteen
// independent FMA chains hide the FMA latency; one transpose-and-add tree (45 shuffles/adds)
// replaces sixteen horizontal reductions.
SLUICE_AVX512 __m512 dot16(const float* q, const float* k, int dp) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < dp; c += 16) {
    const __m512 qv = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + int64_t(j) * dp + c), acc[j]);
  }
  // Within each 128-bit lane, pair sources (2i, 2i+1): [a0+a2, b0+b2, a1+a3, b1+b3].
  __m512 pairs[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                             _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
  // Then quads: each 128-bit lane holds one partial sum for each of 4 consecutive sources.
  __m512 quads[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Finally add the four 128-bit lanes of each quad, placing quad i in lane i.
  const __m512 q01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xdd));
  const __m512 q23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                   _mm512_shuffle_f32x4(quads[2], quads[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(q01, q23, 0x88), _mm512_shuffle_f32x4(q01, q23, 0xdd));
}

// acc[0, 16·NV) = acc·correction + Σ_{j in [j_lo, j_hi]} p[j]·v[j] with the NV accumulators in
// registers, so consecutive FMAs of one key are independent.
template <int NV>
SLUICE_AVX512 void accumulate_pv(float* acc, const float* p, int j_lo, int j_hi, const float* v,
                                 int dp, float correction) {
  __m512 a[NV];
  const __m512 corr = _mm512_set1_ps(correction);
#pragma GCC unroll 8
  for (int u = 0; u < NV; ++u) a[u] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * u), corr);
  for (int j = j_lo; j <= j_hi; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u)
      a[u] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + int64_t(j) * dp + 16 * u), a[u]);
  }
#pragma GCC unroll 8
  for (int u = 0; u < NV; ++u) _mm512_storeu_ps(acc + 16 * u, a[u]);
}

SLUICE_AVX512 void run_task(const AttentionParams& p, int group, const KvLayerView& kv,
                            const AttentionSequence& s, const Task& task, Scratch& sc) {
  const int d = p.head_dim, bs = kv.block_size;
  const int dp = (d + 15) / 16 * 16, bsp = (bs + 15) / 16 * 16;
  const int64_t q_stride = s.q_stride ? s.q_stride : int64_t(p.heads) * d;
  const int64_t out_stride = s.out_stride ? s.out_stride : int64_t(p.heads) * d;
  const int n_rows = (task.q_end - task.q_begin) * group;  // row r: query q_begin + r / group,
                                                           // head kv_head·group + r % group
  sc.q.assign(size_t(n_rows) * dp, 0.0f);
  sc.acc.assign(size_t(n_rows) * dp, 0.0f);
  sc.scores.resize(size_t(n_rows) * bsp);
  // Padded to whole groups of 16 keys for dot16; padding rows hold zeros or stale keys of an
  // earlier block, whose scores are masked out.
  sc.k_tile.assign(size_t(bsp) * dp, 0.0f);
  sc.v_tile.assign(size_t(bs) * dp, 0.0f);
  sc.max.assign(size_t(n_rows), kNegInf);
  sc.sum.assign(size_t(n_rows), 0.0f);
  for (int r = 0; r < n_rows; ++r) {
    const int i = task.q_begin + r / group, h = task.kv_head * group + r % group;
    const float* q = s.q + i * q_stride + int64_t(h) * d;
    // Scale folded into q: one multiply per query element instead of one per score.
    for (int c = 0; c < d; ++c) sc.q[size_t(r) * dp + c] = q[c] * p.scale;
  }

  // Keys any query of the chunk can see.
  const KeyRange first = visible_keys(p, s.q_start + task.q_begin, s.kv_len);
  const KeyRange last = visible_keys(p, s.q_start + task.q_end - 1, s.kv_len);
  for (int block = first.lo / bs; block <= last.hi / bs; ++block) {
    const int p0 = block * bs, n_keys = std::min(bs, s.kv_len - p0);
    const int32_t page = s.block_table[size_t(block)];
    tile_to_f32(kv.k_tile(page, task.kv_head), n_keys, d, dp, sc.k_tile.data());
    tile_to_f32(kv.v_tile(page, task.kv_head), n_keys, d, dp, sc.v_tile.data());

    // Scores of every row against every key of the block, 16 keys at a time.
    for (int r = 0; r < n_rows; ++r)
      for (int j = 0; j < n_keys; j += 16)
        _mm512_storeu_ps(
            sc.scores.data() + int64_t(r) * bsp + j,
            dot16(sc.q.data() + int64_t(r) * dp, sc.k_tile.data() + int64_t(j) * dp, dp));

    for (int r = 0; r < n_rows; ++r) {
      const KeyRange keys = visible_keys(p, s.q_start + task.q_begin + r / group, s.kv_len);
      const int j_lo = std::max(0, keys.lo - p0), j_hi = std::min(n_keys - 1, keys.hi - p0);
      if (j_lo > j_hi) continue;
      float* score = sc.scores.data() + int64_t(r) * bsp;
      float block_max = kNegInf;
      for (int j = j_lo; j <= j_hi; ++j) block_max = std::max(block_max, score[j]);
      const float new_max = std::max(sc.max[size_t(r)], block_max);
      // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first block).
      const float correction = std::exp(sc.max[size_t(r)] - new_max);
      sc.max[size_t(r)] = new_max;
      // p_j = exp(s_j - max) for visible keys, exactly 0 for masked ones.
      const __m512 vmax = _mm512_set1_ps(new_max);
      float block_sum = 0;
      for (int j = 0; j < bsp; j += 16) {
        const int lo = std::max(j_lo - j, 0), hi = std::min(j_hi - j, 15);
        const __mmask16 visible =
            lo > hi ? 0 : __mmask16(((1u << (hi + 1)) - 1u) & ~((1u << lo) - 1u));
        __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(score + j), vmax));
        e = _mm512_maskz_mov_ps(visible, e);
        _mm512_storeu_ps(score + j, e);
        block_sum += reduce_add(e);
      }
      sc.sum[size_t(r)] = sc.sum[size_t(r)] * correction + block_sum;
      float* acc = sc.acc.data() + int64_t(r) * dp;
      for (int c = 0; c < dp; c += 128) {
        switch (std::min(8, (dp - c) / 16)) {
          case 8:
            accumulate_pv<8>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          case 7:
            accumulate_pv<7>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          case 6:
            accumulate_pv<6>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          case 5:
            accumulate_pv<5>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          case 4:
            accumulate_pv<4>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          case 3:
            accumulate_pv<3>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          case 2:
            accumulate_pv<2>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
          default:
            accumulate_pv<1>(acc + c, score, j_lo, j_hi, sc.v_tile.data() + c, dp, correction);
            break;
        }
      }
    }
  }

  for (int r = 0; r < n_rows; ++r) {
    const int i = task.q_begin + r / group, h = task.kv_head * group + r % group;
    float* out = s.out + i * out_stride + int64_t(h) * d;
    const float sum = sc.sum[size_t(r)];
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (int c = 0; c < d; ++c) out[c] = sc.acc[size_t(r) * dp + c] * inv;
  }
}

}  // namespace

void paged_attention(const AttentionParams& params, const KvLayerView& kv,
                     std::span<const AttentionSequence> seqs) {
  const auto [p, group] = resolve(params);
  for (const auto& s : seqs) check_sequence(p, kv, s);
  if (!isa_at_least(IsaLevel::kAvx512)) {
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < seqs.size(); ++i) attention_scalar(p, group, kv, seqs[i]);
    return;
  }
  // Up to ~32 query rows per task: enough to reuse each K/V tile, small enough that the
  // accumulators (rows·head_dim·4 bytes) stay in L1/L2.
  const int q_chunk = std::max(1, 32 / group);
  std::vector<Task> tasks;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int g = 0; g < p.kv_heads; ++g)
      for (int q0 = 0; q0 < seqs[i].n_q; q0 += q_chunk)
        tasks.push_back({int(i), g, q0, std::min(seqs[i].n_q, q0 + q_chunk)});
#pragma omp parallel
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (size_t t = 0; t < tasks.size(); ++t)
      run_task(p, group, kv, seqs[size_t(tasks[t].seq)], tasks[t], scratch);
  }
}

void attention_reference(const AttentionParams& params, const float* q, int n_q, int q_start,
                         const float* k, const float* v, int kv_len, float* out) {
  const auto [p, group] = resolve(params);
  const int d = p.head_dim;
  std::vector<double> scores(static_cast<size_t>(kv_len));
  for (int i = 0; i < n_q; ++i) {
    const KeyRange keys = visible_keys(p, q_start + i, kv_len);
    for (int h = 0; h < p.heads; ++h) {
      const int g = h / group;
      const float* qh = q + (int64_t(i) * p.heads + h) * d;
      float* o = out + (int64_t(i) * p.heads + h) * d;
      double max_score = -1e300;
      for (int t = keys.lo; t <= keys.hi; ++t) {
        const float* kt = k + (int64_t(t) * p.kv_heads + g) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qh[c]) * kt[c];
        scores[size_t(t)] = dot * p.scale;
        max_score = std::max(max_score, scores[size_t(t)]);
      }
      double sum = 0;
      for (int t = keys.lo; t <= keys.hi; ++t) {
        scores[size_t(t)] = std::exp(scores[size_t(t)] - max_score);
        sum += scores[size_t(t)];
      }
      for (int c = 0; c < d; ++c) {
        double acc = 0;
        for (int t = keys.lo; t <= keys.hi; ++t)
          acc += scores[size_t(t)] * v[(int64_t(t) * p.kv_heads + g) * d + c];
        o[c] = keys.lo <= keys.hi ? float(acc / sum) : 0.0f;
      }
    }
  }
}

}  // namespace sluice::cpu
