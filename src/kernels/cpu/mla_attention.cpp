// Each head is one task: a pass over the cached rows for the scores (two dot products per row:
// the latent against q_latent, the RoPE key against q_rope), a softmax over them, and a second
// pass accumulating the latent rows weighted by it. Per head and token that is 2·(rank +
// rope_dim) FLOPs for the scores and 2·rank for the sum, over (rank + rope_dim)·2 bytes read
// per token, once per head: the rows of a block stay in L1/L2 across the heads of one task
// only, so the cache bytes are read from memory once per call and from L2 once per head.
// Only the dot and the axpy change with the ISA level; the softmax is scalar (one exp per head
// and token, against 4·rank + 2·rope_dim FLOPs of vector work).
#include "kernels/cpu/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {

namespace {

struct ScalarOps {
  static float dot(const float* q, const uint16_t* row, int n) {
    float s = 0.f;
    for (int i = 0; i < n; ++i) s += q[i] * bf16_to_f32(row[i]);
    return s;
  }
  static void axpy(float* acc, float w, const uint16_t* row, int n) {
    for (int i = 0; i < n; ++i) acc[i] += w * bf16_to_f32(row[i]);
  }
};

struct Avx2Ops {
  SLUICE_AVX2 static float dot(const float* q, const uint16_t* row, int n) {
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
      s = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), avx2::load_bf16(row + i), s);
    if (i < n)
      s = _mm256_fmadd_ps(avx2::load_partial(q + i, n - i), avx2::load_bf16_partial(row + i, n - i),
                          s);
    return avx2::reduce_add(s);
  }
  SLUICE_AVX2 static void axpy(float* acc, float w, const uint16_t* row, int n) {
    const __m256 wv = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(acc + i,
                       _mm256_fmadd_ps(wv, avx2::load_bf16(row + i), _mm256_loadu_ps(acc + i)));
    if (i < n)
      avx2::store_partial(acc + i, n - i,
                          _mm256_fmadd_ps(wv, avx2::load_bf16_partial(row + i, n - i),
                                          avx2::load_partial(acc + i, n - i)));
  }
};

struct Avx512Ops {
  SLUICE_AVX512 static float dot(const float* q, const uint16_t* row, int n) {
    __m512 s = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
      s = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), avx512::load_bf16(row + i), s);
    if (i < n) {
      const __mmask16 m = avx512::tail_mask(n - i);
      s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i),
                          avx512::load_bf16_partial(row + i, n - i), s);
    }
    return _mm512_reduce_add_ps(s);
  }
  SLUICE_AVX512 static void axpy(float* acc, float w, const uint16_t* row, int n) {
    const __m512 wv = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(acc + i,
                       _mm512_fmadd_ps(wv, avx512::load_bf16(row + i), _mm512_loadu_ps(acc + i)));
    if (i < n) {
      const __mmask16 m = avx512::tail_mask(n - i);
      _mm512_mask_storeu_ps(acc + i, m,
                            _mm512_fmadd_ps(wv, avx512::load_bf16_partial(row + i, n - i),
                                            _mm512_maskz_loadu_ps(m, acc + i)));
    }
  }
};

void check(const MlaDecodeArgs& a) {
  if (a.heads <= 0 || a.rank <= 0 || a.rope_dim < 0 || a.positions <= 0 || a.block_size <= 0)
    fail(
        "mla_decode_attention: expected positive heads, rank, positions and block_size and "
        "rope_dim >= 0, got {}, {}, {}, {} and {}",
        a.heads, a.rank, a.positions, a.block_size, a.rope_dim);
  if (int64_t(a.blocks.size()) * a.block_size < a.positions)
    fail("mla_decode_attention: {} blocks of {} hold fewer than the {} positions", a.blocks.size(),
         a.block_size, a.positions);
}

template <typename Ops>
void run(const MlaDecodeArgs& a) {
  check(a);
  const int row_len = a.rank + a.rope_dim;
  auto row = [&](int p) {
    return a.blocks[size_t(p / a.block_size)] + size_t(p % a.block_size) * size_t(row_len);
  };
#pragma omp parallel
  {
    std::vector<float> score(size_t(a.positions));
#pragma omp for schedule(static)
    for (int h = 0; h < a.heads; ++h) {
      const float* ql = a.q_latent + size_t(h) * a.rank;
      const float* qr = a.q_rope + size_t(h) * a.rope_dim;
      float max_score = -INFINITY;
      for (int p = 0; p < a.positions; ++p) {
        const uint16_t* r = row(p);
        const float s = Ops::dot(ql, r, a.rank) + Ops::dot(qr, r + a.rank, a.rope_dim);
        score[size_t(p)] = s * a.scale;
        max_score = std::max(max_score, score[size_t(p)]);
      }
      float sum = 0.f;
      for (int p = 0; p < a.positions; ++p)
        sum += (score[size_t(p)] = std::exp(score[size_t(p)] - max_score));
      float* out = a.out_latent + size_t(h) * a.rank;
      std::fill(out, out + a.rank, 0.f);
      const float inv = 1.0f / sum;
      for (int p = 0; p < a.positions; ++p) Ops::axpy(out, score[size_t(p)] * inv, row(p), a.rank);
    }
  }
}

void check(const MlaKvB& w) {
  if (!w.w || w.heads <= 0 || w.rank <= 0 || w.nope_dim <= 0 || w.v_dim <= 0)
    fail(
        "mla kv_b_proj: expected a weight and positive heads, rank, nope_dim and v_dim, got {}, "
        "{}, {}, {}",
        w.heads, w.rank, w.nope_dim, w.v_dim);
}

const uint16_t* w_uk(const MlaKvB& w, int h, int n) {
  return w.w + (size_t(h) * (w.nope_dim + w.v_dim) + size_t(n)) * size_t(w.rank);
}
const uint16_t* w_uv(const MlaKvB& w, int h, int v) {
  return w_uk(w, h, w.nope_dim + v);
}

// Per head: rank-wide axpys of W_UK's rows (2 · nope_dim · rank FLOPs over as many bf16
// weights: memory-bound, like a GEMM row of one token).
template <typename Ops>
void fold(const MlaKvB& w, const float* q_nope, int64_t stride, float* q_latent) {
  check(w);
#pragma omp parallel for schedule(static) if (w.heads >= 4)
  for (int h = 0; h < w.heads; ++h) {
    float* out = q_latent + size_t(h) * w.rank;
    std::fill(out, out + w.rank, 0.f);
    for (int n = 0; n < w.nope_dim; ++n)
      Ops::axpy(out, q_nope[h * stride + n], w_uk(w, h, n), w.rank);
  }
}

template <typename Ops>
void unfold(const MlaKvB& w, const float* out_latent, float* out) {
  check(w);
#pragma omp parallel for schedule(static) if (w.heads >= 4)
  for (int h = 0; h < w.heads; ++h)
    for (int v = 0; v < w.v_dim; ++v)
      out[size_t(h) * w.v_dim + v] =
          Ops::dot(out_latent + size_t(h) * w.rank, w_uv(w, h, v), w.rank);
}

}  // namespace

void mla_fold_query_scalar(const MlaKvB& w, const float* q, int64_t stride, float* q_latent) {
  fold<ScalarOps>(w, q, stride, q_latent);
}
void mla_fold_query(const MlaKvB& w, const float* q, int64_t stride, float* q_latent) {
  if (isa_at_least(IsaLevel::kAvx512)) return fold<Avx512Ops>(w, q, stride, q_latent);
  if (isa_at_least(IsaLevel::kAvx2)) return fold<Avx2Ops>(w, q, stride, q_latent);
  fold<ScalarOps>(w, q, stride, q_latent);
}
void mla_unfold_output_scalar(const MlaKvB& w, const float* out_latent, float* out) {
  unfold<ScalarOps>(w, out_latent, out);
}
void mla_unfold_output(const MlaKvB& w, const float* out_latent, float* out) {
  if (isa_at_least(IsaLevel::kAvx512)) return unfold<Avx512Ops>(w, out_latent, out);
  if (isa_at_least(IsaLevel::kAvx2)) return unfold<Avx2Ops>(w, out_latent, out);
  unfold<ScalarOps>(w, out_latent, out);
}

void mla_decode_attention_scalar(const MlaDecodeArgs& a) {
  run<ScalarOps>(a);
}

void mla_decode_attention(const MlaDecodeArgs& a) {
  if (isa_at_least(IsaLevel::kAvx512)) return run<Avx512Ops>(a);
  if (isa_at_least(IsaLevel::kAvx2)) return run<Avx2Ops>(a);
  run<ScalarOps>(a);
}

}  // namespace sluice::cpu
