#include "kernels/cpu/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/kv_view.h"
#include "kernels/cpu/stream_read.h"

namespace sluice::cpu {
namespace {

template <typename F>
double best_seconds(F&& run, double min_seconds) {
  run();  // warm-up: primitive creation, first touch, page faults
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; ++rep) {
    auto start = Clock::now();
    run();
    double s = seconds_since(start);
    best = std::min(best, s);
    total += s;
  }
  return best;
}

// best_seconds of `run`, and of `read` run right after each call of `run`: the best of each.
template <typename F, typename G>
std::pair<double, double> best_paired_seconds(F&& run, G&& read, double min_seconds) {
  run();
  read();
  double best = 1e30, best_read = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; ++rep) {
    auto start = Clock::now();
    run();
    const auto middle = Clock::now();
    read();
    const auto end = Clock::now();
    const double s = std::chrono::duration<double>(middle - start).count();
    best = std::min(best, s);
    best_read = std::min(best_read, std::chrono::duration<double>(end - middle).count());
    total += s;
  }
  return {best, best_read};
}

// One layer of a paged bf16 pool in which sequence s owns blocks [s·blocks_per_seq, ...) and
// every sequence holds the same K = V rows, 64-byte aligned as the runtime's PagedKvCache
// allocates it.
struct BenchKvPool {
  std::unique_ptr<uint16_t, void (*)(void*)> memory{nullptr, &std::free};
  KvLayerView view;
  size_t blocks_per_seq = 0;
  std::vector<int32_t> tables;  // [batch · blocks_per_seq]: sequence s's table is its slice
};

BenchKvPool make_bench_pool(const AttentionBenchShape& b, const std::vector<float>& kv_rows) {
  BenchKvPool pool;
  pool.view = {.block_size = b.block_size, .kv_heads = b.kv_heads, .head_dim = b.head_dim};
  pool.blocks_per_seq = size_t((b.context + b.block_size - 1) / b.block_size);
  pool.tables.resize(pool.blocks_per_seq * size_t(b.batch));
  const size_t bytes = pool.tables.size() * size_t(pool.view.block_elems()) * 2;
  pool.memory.reset(static_cast<uint16_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
  pool.view.base = pool.memory.get();
  const int64_t width = int64_t(b.kv_heads) * b.head_dim;
  for (size_t block = 0; block < pool.tables.size(); ++block) {
    pool.tables[block] = int32_t(block);
    for (int h = 0; h < b.kv_heads; ++h)
      for (int slot = 0; slot < b.block_size; ++slot) {
        const int64_t pos = int64_t(block % pool.blocks_per_seq) * b.block_size + slot;
        if (pos >= b.context) break;
        const float* row = kv_rows.data() + pos * width + int64_t(h) * b.head_dim;
        const int64_t k_at = pool.view.k_tile(int32_t(block), h) - pool.view.base;
        const int64_t v_at = pool.view.v_tile(int32_t(block), h) - pool.view.base;
        uint16_t* base = pool.memory.get() + int64_t(slot) * b.head_dim;
        f32_to_bf16_row(row, base + k_at, size_t(b.head_dim));
        f32_to_bf16_row(row, base + v_at, size_t(b.head_dim));
      }
  }
  return pool;
}

}  // namespace

// Roofline for the expert GEMM: intensity = 2·m·n·k / (2·n·k + ...) ≈ m FLOP/byte when the
// weight dominates the traffic. With ~15 GB/s of DRAM and a measured bf16 peak P, the GEMM stops
// being weight-bandwidth bound at m ≈ P / 15e9 (the ridge point); below it the achieved FLOP/s
// grows linearly with m.
KernelTiming bench_gemm(int64_t m, int64_t n, int64_t k, DType x_dtype, GemmRowMode mode,
                        double min_seconds) {
  // Enough copies of W that together they are 3× the 260 MiB L3: each call then reads its W from
  // DRAM, as the engine does for weights streamed once per step.
  const size_t w_elems = size_t(n * k);
  const size_t copies = std::clamp<size_t>((size_t(768) << 20) / (2 * w_elems) + 1, 1, 64);
  std::vector<uint16_t> w(w_elems * copies), xb(size_t(m * k));
  std::vector<float> xf(size_t(m * k)), y(size_t(m * n));
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = float(int(i % 251) - 125) / 128.0f;
    xb[i] = f32_to_bf16(xf[i]);
  }
  const GemmRowMode saved = gemm_row_mode();
  set_gemm_row_mode(mode);
  const GemmArgs args{.m = m,
                      .n = n,
                      .k = k,
                      .x = x_dtype == DType::F32 ? static_cast<const void*>(xf.data()) : xb.data(),
                      .x_dtype = x_dtype,
                      .w = w.data(),
                      .y = y.data()};
  // The plain read takes the copy half the ring away from the call's, which the calls have not
  // touched for several copies' time: both read from DRAM.
  size_t call = 0;
  double sink = 0;
  KernelTiming t;
  std::tie(t.seconds, t.read_seconds) = best_paired_seconds(
      [&] {
        GemmArgs a = args;
        a.w = w.data() + (call % copies) * w_elems;
        gemm(a);
      },
      [&] {
        sink += read_stream(w.data() + ((call++ + copies / 2) % copies) * w_elems, 2 * w_elems);
      },
      min_seconds);
  t.read_bytes = sink == -1.0 ? 0 : 2.0 * double(w_elems);
  set_gemm_row_mode(saved);
  t.flops = 2.0 * double(m) * double(n) * double(k);
  t.bytes = 2.0 * double(n * k) + double(m * k) * double(dtype_size(x_dtype)) + 4.0 * double(m * n);
  return t;
}

// Roofline for the int8 expert GEMM: intensity ≈ 2·m int8 ops per byte of W (1 byte per
// weight, vs 2 for bf16), so at m ≤ 4 it is bound by DRAM and reads W at ~the stream rate; the
// ridge point is m ≈ int8 peak / (2 · DRAM bandwidth): ~5 for the AVX2 tile on 2 Zen 3 cores
// (vpsignb + vpmaddubsw + vpmaddwd ≈ 220 GOP/s, ~20 GB/s) and ~13 for vpdpbusd on 2 Zen 5
// cores (1.47 TOP/s, 57 GB/s).
KernelTiming bench_gemm_int8(int64_t m, int64_t n, int64_t k, int64_t group_size,
                             double min_seconds, QuantFormat format) {
  std::vector<uint16_t> w16(size_t(n * k));
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  std::vector<QuantWeights> w;
  w.push_back(quantize_weights(format, w16.data(), n, k, group_size));
  // Copies of W filling 768 MiB, 3× the largest L3 we run on, so each call reads W from DRAM.
  const size_t copies = std::clamp<size_t>((size_t(768) << 20) / w[0].bytes() + 1, 1, 64);
  while (w.size() < copies) w.push_back(w[0].clone());
  std::vector<float> x(size_t(m * k)), y(size_t(m * n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 251) - 125) / 128.0f;
  size_t call = 0;
  double sink = 0;
  KernelTiming t;
  std::tie(t.seconds, t.read_seconds) = best_paired_seconds(
      [&] { gemm_int8({.m = m, .x = x.data(), .w = &w[call % copies], .y = y.data()}); },
      [&] {
        const QuantWeights& other = w[(call++ + copies / 2) % copies];
        sink += read_stream(other.data, other.bytes());
      },
      min_seconds);
  t.read_bytes = sink == -1.0 ? 0 : double(w[0].bytes());
  t.flops = 2.0 * double(m) * double(n) * double(k);
  t.bytes = double(w[0].bytes()) + 4.0 * double(m * k) + 4.0 * double(m * n);
  return t;
}

// Roofline for decode attention: per sequence and KV head, K and V of the context are read once
// (2·context·head_dim·2 bytes) and used by `group` query heads at 4 FLOP per element (QK dot and
// PV axpy), i.e. group FLOP/byte: 4 for Mixtral (32/8), far below the CPU's ~10+ FLOP/byte
// balance, so decode attention should run at DRAM bandwidth. The default shape's KV (128 seqs ×
// 1024 tokens × 8 heads × 128 × 2 × 2 B = 512 MiB) is twice the L3, so it streams from DRAM.
KernelTiming bench_attention(const AttentionBenchShape& shape, double min_seconds) {
  const AttentionBenchShape& b = shape;
  const int64_t width = int64_t(b.kv_heads) * b.head_dim, q_width = int64_t(b.heads) * b.head_dim;
  std::vector<float> kv_rows(size_t(b.context * width));
  for (size_t i = 0; i < kv_rows.size(); ++i) kv_rows[i] = float(int(i % 97) - 48) / 64.0f;
  const BenchKvPool pool = make_bench_pool(b, kv_rows);
  std::vector<float> q(size_t(b.batch * b.n_q * q_width), 0.01f), out(q.size());
  std::vector<AttentionSequence> seqs;
  for (int s = 0; s < b.batch; ++s)
    seqs.push_back(
        {.q = q.data() + s * b.n_q * q_width,
         .out = out.data() + s * b.n_q * q_width,
         .n_q = b.n_q,
         .q_start = b.context - b.n_q,
         .kv_len = b.context,
         .block_table = std::span<const int32_t>(pool.tables)
                            .subspan(size_t(s) * pool.blocks_per_seq, pool.blocks_per_seq)});
  const AttentionParams params{.heads = b.heads, .kv_heads = b.kv_heads, .head_dim = b.head_dim};
  KernelTiming t;
  t.seconds = best_seconds([&] { paged_attention(params, pool.view, seqs); }, min_seconds);
  t.bytes = double(b.batch) * b.context * double(width) * 2 * 2;
  // QK and PV: 2 FLOP each per (query row, key, element); causal masking inside a prefill chunk
  // is ignored (upper bound).
  t.flops = double(b.batch) * b.n_q * b.context * double(q_width) * 4;
  return t;
}

}  // namespace sluice::cpu
