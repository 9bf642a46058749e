#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
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

// ---- Vector paths: one task = (sequence, KV head, chunk of queries). ----
//
// run_task walks the blocks once with an online softmax; the per-ISA leaf kernels (a struct of
// static SLUICE_AVX512 / SLUICE_AVX2 functions with kLanes floats per vector) convert the tiles,
// score 16 or 8 keys at a time, exponentiate a row's visible scores and accumulate P·V.

struct Task {
  int seq, kv_head, q_begin, q_end;
};

// Per-thread scratch, rows padded to whole vectors.
struct Scratch {
  std::vector<float> q, acc, scores, k_tile, v_tile, max, sum;
};

int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

// ---- AVX-512 leaves. ----

SLUICE_AVX512 inline float reduce_add(__m512 v) {
  __m512 t = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));  // swap 256-bit halves
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xb1));         // swap 128-bit lanes
  t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0x4e));            // swap 64-bit pairs
  t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0xb1));            // swap neighbours
  return _mm512_cvtss_f32(t);
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

struct Avx512Leaves {
  static constexpr int kLanes = 16;

  // Converts rows [0, n) of a bf16 [rows, d] tile into fp32 rows of `dp` floats (zero padded).
  SLUICE_AVX512 static void tile_to_f32(const uint16_t* tile, int n, int d, int dp, float* out) {
    for (int j = 0; j < n; ++j) {
      const uint16_t* row = tile + int64_t(j) * d;
      float* o = out + int64_t(j) * dp;
      int c = 0;
      for (; c + 16 <= d; c += 16) _mm512_storeu_ps(o + c, avx512::load_bf16(row + c));
      if (c < d) _mm512_storeu_ps(o + c, avx512::load_bf16_partial(row + c, d - c));
    }
  }

  // score[j] = q·k_j for j < n_keys rounded up to 16 (k rows dp floats apart).
  SLUICE_AVX512 static void scores(const float* q, const float* k, int n_keys, int dp,
                                   float* score) {
    for (int j = 0; j < n_keys; j += 16)
      _mm512_storeu_ps(score + j, dot16(q, k + int64_t(j) * dp, dp));
  }

  // score[j] = exp(score[j] - max) for j in [j_lo, j_hi], exactly 0 for the other j < bsp;
  // returns their sum.
  SLUICE_AVX512 static float exp_visible(float* score, int bsp, int j_lo, int j_hi, float max) {
    const __m512 vmax = _mm512_set1_ps(max);
    float sum = 0;
    for (int j = 0; j < bsp; j += 16) {
      const int lo = std::max(j_lo - j, 0), hi = std::min(j_hi - j, 15);
      const __mmask16 visible =
          lo > hi ? 0 : __mmask16(((1u << (hi + 1)) - 1u) & ~((1u << lo) - 1u));
      __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(score + j), vmax));
      e = _mm512_maskz_mov_ps(visible, e);
      _mm512_storeu_ps(score + j, e);
      sum += reduce_add(e);
    }
    return sum;
  }

  // acc[0, 16·NV) = acc·correction + Σ_{j in [j_lo, j_hi]} p[j]·v[j] with the NV accumulators in
  // registers, so consecutive FMAs of one key are independent.
  template <int NV>
  SLUICE_AVX512 static void accumulate_pv(float* acc, const float* p, int j_lo, int j_hi,
                                          const float* v, int dp, float correction) {
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
};

// ---- AVX2 leaves: the same steps on 8 lanes (16 ymm registers bound the unrolling). ----

// Eight dot products q·k_j (j < 8, k rows dp floats apart) returned as one vector: eight
// independent FMA chains, then one hadd tree instead of eight horizontal reductions.
SLUICE_AVX2 __m256 dot8(const float* q, const float* k, int dp) {
  __m256 acc[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int c = 0; c < dp; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + int64_t(j) * dp + c), acc[j]);
  }
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | the same for the high 128 bits].
  const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
  // Per 128-bit half: the partial sums of sources 0..3 (and 4..7) in lanes 0..3.
  const __m256 s0123 = _mm256_hadd_ps(h01, h23), s4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

struct Avx2Leaves {
  static constexpr int kLanes = 8;

  SLUICE_AVX2 static void tile_to_f32(const uint16_t* tile, int n, int d, int dp, float* out) {
    for (int j = 0; j < n; ++j) {
      const uint16_t* row = tile + int64_t(j) * d;
      float* o = out + int64_t(j) * dp;
      int c = 0;
      for (; c + 8 <= d; c += 8) _mm256_storeu_ps(o + c, avx2::load_bf16(row + c));
      if (c < d) _mm256_storeu_ps(o + c, avx2::load_bf16_partial(row + c, d - c));
    }
  }

  SLUICE_AVX2 static void scores(const float* q, const float* k, int n_keys, int dp, float* score) {
    for (int j = 0; j < n_keys; j += 8)
      _mm256_storeu_ps(score + j, dot8(q, k + int64_t(j) * dp, dp));
  }

  SLUICE_AVX2 static float exp_visible(float* score, int bsp, int j_lo, int j_hi, float max) {
    const __m256 vmax = _mm256_set1_ps(max);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lo = _mm256_set1_epi32(j_lo - 1), hi = _mm256_set1_epi32(j_hi + 1);
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < bsp; j += 8) {
      const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(j));
      const __m256i visible =
          _mm256_and_si256(_mm256_cmpgt_epi32(idx, lo), _mm256_cmpgt_epi32(hi, idx));
      __m256 e = avx2::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(score + j), vmax));
      e = _mm256_and_ps(e, _mm256_castsi256_ps(visible));  // also clears inf/NaN of stale lanes
      _mm256_storeu_ps(score + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    return avx2::reduce_add(sum);
  }

  template <int NV>
  SLUICE_AVX2 static void accumulate_pv(float* acc, const float* p, int j_lo, int j_hi,
                                        const float* v, int dp, float correction) {
    __m256 a[NV];
    const __m256 corr = _mm256_set1_ps(correction);
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) a[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * u), corr);
    for (int j = j_lo; j <= j_hi; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u)
        a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + int64_t(j) * dp + 8 * u), a[u]);
    }
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) _mm256_storeu_ps(acc + 8 * u, a[u]);
  }
};

// ---- The task, generic over the leaves. ----

// accumulate_pv over a whole padded row, up to 8 vectors per pass (8 accumulators + the
// broadcast + a load fit the 16 (AVX2) or 32 (AVX-512) vector registers).
template <class L, int NV = 8>
void accumulate_chunk(int vectors, float* acc, const float* p, int j_lo, int j_hi, const float* v,
                      int dp, float correction) {
  if constexpr (NV > 1)
    if (vectors < NV)
      return accumulate_chunk<L, NV - 1>(vectors, acc, p, j_lo, j_hi, v, dp, correction);
  L::template accumulate_pv<NV>(acc, p, j_lo, j_hi, v, dp, correction);
}

template <class L>
void accumulate_row(float* acc, const float* p, int j_lo, int j_hi, const float* v, int dp,
                    float correction) {
  constexpr int kChunk = 8 * L::kLanes;
  for (int c = 0; c < dp; c += kChunk)
    accumulate_chunk<L>(std::min(8, (dp - c) / L::kLanes), acc + c, p, j_lo, j_hi, v + c, dp,
                        correction);
}

// Geometry of one task: n_rows query rows (row r: query q_begin + r / group, head
// kv_head·group + r % group), head_dim d padded to dp, block_size bs padded to bsp.
struct TaskShape {
  int d, dp, bs, bsp, n_rows;
  int64_t q_stride, out_stride;
};

template <class L>
TaskShape task_shape(const AttentionParams& p, int group, const KvLayerView& kv,
                     const AttentionSequence& s, const Task& task) {
  const int64_t width = int64_t(p.heads) * p.head_dim;
  return {.d = p.head_dim,
          .dp = round_up(p.head_dim, L::kLanes),
          .bs = kv.block_size,
          .bsp = round_up(kv.block_size, L::kLanes),
          .n_rows = (task.q_end - task.q_begin) * group,
          .q_stride = s.q_stride ? s.q_stride : width,
          .out_stride = s.out_stride ? s.out_stride : width};
}

// Sizes the scratch and loads the task's query rows, scaled (one multiply per query element
// instead of one per score).
void load_queries(const AttentionParams& p, int group, const AttentionSequence& s, const Task& task,
                  const TaskShape& t, Scratch& sc) {
  sc.q.assign(size_t(t.n_rows) * t.dp, 0.0f);
  sc.acc.assign(size_t(t.n_rows) * t.dp, 0.0f);
  sc.scores.resize(size_t(t.n_rows) * t.bsp);
  // Padded to whole vectors of keys for the score leaf; padding rows hold zeros or stale keys of
  // an earlier block, whose scores are masked out.
  sc.k_tile.assign(size_t(t.bsp) * t.dp, 0.0f);
  sc.v_tile.assign(size_t(t.bs) * t.dp, 0.0f);
  sc.max.assign(size_t(t.n_rows), kNegInf);
  sc.sum.assign(size_t(t.n_rows), 0.0f);
  for (int r = 0; r < t.n_rows; ++r) {
    const int i = task.q_begin + r / group, h = task.kv_head * group + r % group;
    const float* q = s.q + i * t.q_stride + int64_t(h) * t.d;
    for (int c = 0; c < t.d; ++c) sc.q[size_t(r) * t.dp + c] = q[c] * p.scale;
  }
}

// Folds one block (keys p0 .. p0 + n_keys - 1, scores already in sc.scores) into row r's
// running max, sum and accumulator.
template <class L>
void update_row(const AttentionParams& p, int group, const AttentionSequence& s, const Task& task,
                const TaskShape& t, int p0, int n_keys, int r, Scratch& sc) {
  const KeyRange keys = visible_keys(p, s.q_start + task.q_begin + r / group, s.kv_len);
  const int j_lo = std::max(0, keys.lo - p0), j_hi = std::min(n_keys - 1, keys.hi - p0);
  if (j_lo > j_hi) return;
  float* score = sc.scores.data() + int64_t(r) * t.bsp;
  float block_max = kNegInf;
  for (int j = j_lo; j <= j_hi; ++j) block_max = std::max(block_max, score[j]);
  const float new_max = std::max(sc.max[size_t(r)], block_max);
  // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first block).
  const float correction = std::exp(sc.max[size_t(r)] - new_max);
  sc.max[size_t(r)] = new_max;
  const float block_sum = L::exp_visible(score, t.bsp, j_lo, j_hi, new_max);
  sc.sum[size_t(r)] = sc.sum[size_t(r)] * correction + block_sum;
  accumulate_row<L>(sc.acc.data() + int64_t(r) * t.dp, score, j_lo, j_hi, sc.v_tile.data(), t.dp,
                    correction);
}

void store_outputs(int group, const AttentionSequence& s, const Task& task, const TaskShape& t,
                   const Scratch& sc) {
  for (int r = 0; r < t.n_rows; ++r) {
    const int i = task.q_begin + r / group, h = task.kv_head * group + r % group;
    float* out = s.out + i * t.out_stride + int64_t(h) * t.d;
    const float sum = sc.sum[size_t(r)];
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (int c = 0; c < t.d; ++c) out[c] = sc.acc[size_t(r) * t.dp + c] * inv;
  }
}

template <class L>
void run_task(const AttentionParams& p, int group, const KvLayerView& kv,
              const AttentionSequence& s, const Task& task, Scratch& sc) {
  const TaskShape t = task_shape<L>(p, group, kv, s, task);
  load_queries(p, group, s, task, t, sc);
  // Keys any query of the chunk can see.
  const KeyRange first = visible_keys(p, s.q_start + task.q_begin, s.kv_len);
  const KeyRange last = visible_keys(p, s.q_start + task.q_end - 1, s.kv_len);
  for (int block = first.lo / t.bs; block <= last.hi / t.bs; ++block) {
    const int p0 = block * t.bs, n_keys = std::min(t.bs, s.kv_len - p0);
    const int32_t page = s.block_table[size_t(block)];
    L::tile_to_f32(kv.k_tile(page, task.kv_head), n_keys, t.d, t.dp, sc.k_tile.data());
    L::tile_to_f32(kv.v_tile(page, task.kv_head), n_keys, t.d, t.dp, sc.v_tile.data());
    for (int r = 0; r < t.n_rows; ++r)
      L::scores(sc.q.data() + int64_t(r) * t.dp, sc.k_tile.data(), n_keys, t.dp,
                sc.scores.data() + int64_t(r) * t.bsp);
    for (int r = 0; r < t.n_rows; ++r) update_row<L>(p, group, s, task, t, p0, n_keys, r, sc);
  }
  store_outputs(group, s, task, t, sc);
}

template <class L>
void attention_vector(const AttentionParams& p, int group, const KvLayerView& kv,
                      std::span<const AttentionSequence> seqs) {
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
      run_task<L>(p, group, kv, seqs[size_t(tasks[t].seq)], tasks[t], scratch);
  }
}

}  // namespace

void paged_attention(const AttentionParams& params, const KvLayerView& kv,
                     std::span<const AttentionSequence> seqs) {
  // Named members, not a structured binding: clang 14 cannot capture one in the OpenMP region.
  const Resolved resolved = resolve(params);
  const AttentionParams& p = resolved.p;
  const int group = resolved.group;
  for (const auto& s : seqs) check_sequence(p, kv, s);
  if (isa_at_least(IsaLevel::kAvx512)) return attention_vector<Avx512Leaves>(p, group, kv, seqs);
  if (isa_at_least(IsaLevel::kAvx2)) return attention_vector<Avx2Leaves>(p, group, kv, seqs);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < seqs.size(); ++i) attention_scalar(p, group, kv, seqs[i]);
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
