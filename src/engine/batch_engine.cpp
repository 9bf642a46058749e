#include "engine/batch_engine.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/clock.h"
#include "core/error.h"
#include "engine/disk_experts.h"
#include "engine/host_attention.h"
#include "engine/offload_executor.h"
#include "engine/offload_layout.h"
#include "engine/routing_rule.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/rope.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"
#include "runtime/kv_cache.h"
#include "runtime/offload/host_math.h"
#include "runtime/scheduler.h"

namespace sluice {

namespace {

// The GEMMs run on bf16 weights, or on FP8 ones with block scales (dequantised tile by tile);
// other dtypes are converted once here.
Tensor as_bf16(const Tensor& t) {
  if (t.empty() || t.dtype == DType::BF16 || t.dtype == DType::F8_E4M3) return t;
  Tensor out = Tensor::allocate(DType::BF16, t.shape);
  std::vector<float> row(size_t(t.shape.back()));
  const int64_t rows = t.numel() / t.shape.back();
  for (int64_t r = 0; r < rows; ++r) {
    to_f32(t.dtype, static_cast<const char*>(t.data) + r * row.size() * dtype_size(t.dtype),
           row.data(), row.size());
    cpu::f32_to_bf16_row(row.data(), out.as<uint16_t>() + r * row.size(), row.size());
  }
  return out;
}

// Norm weights and biases are tiny: held in fp32 whatever the checkpoint stores.
Tensor as_f32(const Tensor& t) {
  if (t.empty()) return t;
  Tensor out = Tensor::allocate(DType::F32, t.shape);
  to_f32(t.dtype, t.data, out.as<float>(), size_t(t.numel()));
  return out;
}

// One token's place in the expert phase: its row in the step and its routing weight.
struct Routed {
  int row;
  float weight;
};

// Experts with up to kConcurrentExpertRows rows in a step run at once, one per thread, when at
// least kConcurrentExpertsPerThread per thread in a row do (concurrent_experts); the others one
// after another, each GEMM split among the threads. Measured on 2 AMD EPYC Zen 4 cores
// (2026-12-07, `bench`, B = 64, prompt 128, interleaved runs):
// - with no limit on the rows, Qwen3-30B-A3B's prefill (128 experts of 768 × 2048, ~128 rows
//   each, runs of ~4) ran its expert GEMMs at 241 GFLOP/s against 264 one after another: the
//   threads waited at each run's end, whole experts being uneven work;
// - at 32 rows, its decode (~4 rows per expert, runs of ~64) took 175, 173 and 192 tokens/s
//   against 171, 174 and 163; Mixtral's bf16 decode (~16 rows, one run of 8) 94.5 and 88.7
//   against 89.1 and 91.6;
// - Mixtral's int8 decode, whose plan's b_e = 32 makes runs of 2, lost: 144.4 and 132.1 against
//   151.0 and 145.7. Hence at least 4 experts per thread in a run.
// On more cores, splitting a small expert's GEMM among them costs more.
constexpr size_t kConcurrentExpertRows = 32;
constexpr size_t kConcurrentExpertsPerThread = 4;

// What expert GEMMs did, added to the books by the thread that started them.
struct ExpertTally {
  double flops = 0, weight_bytes = 0;
};

// x_row[i] += weight · d[i] for i in [i0, i1): the one way an expert's output row joins its token,
// so that the concurrent and the one-after-another expert paths give the same bits.
void add_weighted(float* x_row, const float* d, float weight, int i0, int i1) {
  for (int i = i0; i < i1; ++i) x_row[i] += weight * d[i];
}

// The model features the batch engine's kernels do not run yet, refused by name before anything
// is allocated (the reference path, `sluice logits`, runs them all).
const ModelConfig& check_engine_supports(const ModelConfig& c) {
  auto refuse = [&](const char* feature, const char* field) {
    fail(
        "engine: {} uses {} (config field '{}'), which the batch engine does not run yet; "
        "`sluice logits` computes it on the reference path",
        c.architecture, feature, field);
  };
  // RoPE runs in the engines' own kernels for multi-head latent attention (on the host, beside
  // its attention); multi-head attention rotates on the device too, whose rope is plain.
  const bool latent = c.attention == AttentionKind::kLatent;
  if (!latent && c.rope_scaling.kind != RopeScalingKind::kNone)
    refuse("YaRN RoPE scaling with multi-head attention", "rope_scaling");
  if (!latent && c.rope_interleaved)
    refuse("RoPE on adjacent pairs with multi-head attention", "rope_interleave");
  if (latent && c.sliding_window > 0)
    refuse("a sliding window with multi-head latent attention", "sliding_window");
  return c;
}

}  // namespace

struct BatchEngine::Impl {
  ModelConfig c;
  ModelWeights w;
  Policy policy;
  PagedKvCache kv;
  offload::HostMath math;  // norms, RoPE and routing (stateless)
  EngineStats stats;
  BatchEngine::LogitsObserver observe_logits;
  BatchEngine::RoutingObserver observe_routing;
  BatchEngine::StepObserver observe_step;

  // Step buffers, grown to the largest step seen.
  std::vector<float> x, h, q, k, v, attn, router_logits, final_rows, logits;
  std::vector<float> q_a;        // MLA's q-LoRA rows [T, q_lora_rank]
  std::vector<float> mlp_scale;  // per row: the dense MLP's output scale (1 without mlp_scale)
  std::vector<uint16_t> moe_in;  // ffn-normed rows, bf16, the input of every expert GEMM
  std::vector<float> inv_freq;   // the device rope's table (whole heads, no scaling)
  std::vector<float> latent_inv_freq;  // rope_inv_freq(c): MLA's rope part, YaRN included
  std::vector<int> positions, tokens, top_ids;
  std::vector<int64_t> row_request;  // each row's request id (for the routing observer)
  std::vector<float> top_weights;
  std::vector<std::vector<Routed>> routed;  // per expert
  std::vector<uint16_t> expert_x;           // gathered rows [b_e, H], bf16 precision
  std::vector<float> expert_xf;             // gathered rows [b_e, H], fp32 precision
  std::vector<float> gate, up, act, down;   // [b_e, I], [b_e, I], [b_e, I], [b_e, H]
  std::unique_ptr<DiskExperts> disk;        // the routed experts stay on disk (else null)

  // The offload path (null: the layers run here, on the CPU). Declared last: destroyed first.
  std::unique_ptr<OffloadBackend> backend;  // when the engine opened the device itself
  // The device KV pool's books, for the Scheduler (null without a GPU share of attention), and
  // the CPU's share ω that places sequences between it and `kv`.
  std::unique_ptr<PagedKvCache> device_kv;
  double cpu_share = 1;
  std::unique_ptr<OffloadExecutor> offload;

  Impl(const Model& model, const Policy& p, const EngineDevice& device)
      : c(check_engine_supports(model.config)), policy(p), kv(kv_config(model.config, p, device)) {
    w.embed = model.weights.embed;
    w.final_norm = as_f32(model.weights.final_norm);
    w.lm_head = as_bf16(model.weights.lm_head);
    for (const LayerWeights& L : model.weights.layers) {
      LayerWeights b = L;
      for (Tensor* t : {&b.attn_norm, &b.ffn_norm, &b.q_norm, &b.k_norm, &b.bq, &b.bk, &b.bv, &b.bo,
                        &b.q_a_norm, &b.kv_a_norm, &b.router_bias})
        *t = as_f32(*t);
      for (Tensor* t :
           {&b.wq, &b.wk, &b.wv, &b.wo, &b.router, &b.expert_gate, &b.expert_up, &b.expert_down,
            &b.mlp_gate, &b.mlp_up, &b.mlp_down, &b.mlp_scale, &b.q_a, &b.q_b, &b.kv_a, &b.kv_b})
        if (!(c.expert_quant.quantized() && is_expert_slot(b, t))) *t = as_bf16(*t);
      w.layers.push_back(std::move(b));
    }
    routed.resize(c.num_experts);
    inv_freq = cpu::rope_inv_freq(c.head_dim, c.rope_theta);
    latent_inv_freq = rope_inv_freq(c);
    stats.kv_cache_bytes = size_t(kv.config().block_bytes()) * kv.total_blocks();
    if (model.expert_files) {
      if (p.pool_experts < kMinPoolExperts)
        fail(
            "engine: policy field 'pool_experts': the experts stay on disk and need a pool of at "
            "least {} experts, got {}",
            kMinPoolExperts, p.pool_experts);
      disk = std::make_unique<DiskExperts>(c, model.expert_files, p.pool_experts);
      stats.disk_reads = disk->read_note();
    }
    if (device.device) {
      if (!device.math) fail("engine: field 'math': a device needs its DeviceMath");
      const KvCacheConfig books = device_kv_config(c, policy, device.settings);
      if (books.total_blocks > 0) {
        device_kv = std::make_unique<PagedKvCache>(books);
        cpu_share = cpu_attention_share(device.settings);
      }
      offload =
          std::make_unique<OffloadExecutor>(c, w, policy, kv, device_kv.get(), device, disk.get());
    }
  }

  // The host cache: every KV block on the CPU engine; with an offload device the CPU share's,
  // the device KV pool holding the rest (host_kv_blocks, as the planner sizes host memory).
  static KvCacheConfig kv_config(const ModelConfig& c, const Policy& p, const EngineDevice& d) {
    return kv_pool_config(
        c, p, d.device ? host_kv_blocks(p.kv_blocks, cpu_attention_share(d.settings)) : p.kv_blocks,
        true);
  }

  // y = x · weightᵀ + beta · y. fp32 inputs are rounded to bf16 unless the policy asks for fp32
  // precision or `exact` is set.
  void gemm(const void* xin, DType x_dtype, int m, const Tensor& weight, float* y, float beta = 0,
            bool exact = false) {
    stats.flops += 2.0 * m * weight.shape[0] * weight.shape[1];
    stats.weight_bytes += untallied_gemm(xin, x_dtype, m, weight, y, beta, exact);
  }

  // gemm without the books, safe on several threads at once; returns the weight bytes read.
  double untallied_gemm(const void* xin, DType x_dtype, int m, const Tensor& weight, float* y,
                        float beta = 0, bool exact = false) const {
    const bool f32 = x_dtype == DType::F32 && (exact || policy.precision == Precision::kF32);
    if (weight.dtype == DType::F8_E4M3) {
      const cpu::Fp8Matrix fp8 = fp8_matrix(weight);
      cpu::gemm_fp8({.m = m,
                     .x = xin,
                     .x_dtype = x_dtype,
                     .w = &fp8,
                     .y = y,
                     .beta = beta,
                     .round_x_to_bf16 = !f32});
      return double(fp8.bytes());
    }
    if (f32) {
      cpu::gemm_f32({m, weight.shape[0], weight.shape[1], static_cast<const float*>(xin),
                     weight.as<const uint16_t>(), y, beta});
      return double(weight.nbytes());
    }
    cpu::GemmArgs a;
    a.m = m;
    a.n = weight.shape[0];
    a.k = weight.shape[1];
    a.x = xin;
    a.x_dtype = x_dtype;
    a.w = weight.as<const uint16_t>();
    a.y = y;
    a.beta = beta;
    cpu::gemm(a);
    return double(weight.nbytes());
  }

  // Matrix `e` of an expert slot (e = -1: a dense-MLP slot) of rows × cols, as expert_gemm takes
  // it: the weight tensor (bf16, or FP8 with its block scales), or the packed quantized bytes.
  Tensor slot_matrix(const Tensor& slot, int64_t e, int64_t rows, int64_t cols) const {
    if (!c.expert_quant.quantized()) return e >= 0 ? slot.slice0(e) : slot;
    Tensor packed;
    packed.dtype = DType::U8;
    packed.shape = {rows, cols};
    packed.data = const_cast<uint8_t*>(quant_matrix(c, slot, rows, cols, e).data);
    return packed;
  }

  // Matrix j (gate, up, down) of an expert in the disk tier's pool, rows × cols (bf16, packed
  // quantized, or FP8 codes with their block scales) in slot_matrix's form.
  Tensor pool_matrix(const ExpertMatrices& pooled, size_t j, int64_t rows, int64_t cols) const {
    Tensor t;
    t.dtype = c.expert_quant.quantized() ? DType::U8
              : pooled.block_scales[j]   ? DType::F8_E4M3
                                         : DType::BF16;
    t.shape = {rows, cols};
    t.data = const_cast<void*>(pooled.weights[j]);
    if (pooled.block_scales[j]) {
      Tensor scales;
      scales.shape = fp8_scale_shape(rows, cols);
      scales.data = const_cast<float*>(pooled.block_scales[j]);
      t.block_scales = std::make_shared<const Tensor>(std::move(scales));
    }
    return t;
  }

  // The matrices of expert `e` of layer L where they stay in memory: gate, up, down.
  std::array<Tensor, 3> expert_matrices(const LayerWeights& L, int e) const {
    const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
    return {slot_matrix(L.expert_gate, e, I, H), slot_matrix(L.expert_up, e, I, H),
            slot_matrix(L.expert_down, e, H, I)};
  }

  // y = x · Wᵀ for a rows × cols expert matrix (slot_matrix or pool_matrix): the bf16 (or FP8)
  // GEMM, or with quantized experts the int8-dot-product GEMM (x quantized to int8 on the fly).
  // Adds what it did to `tally`, not to the books: it runs on several threads at once in
  // concurrent_experts.
  void expert_gemm(const void* xin, DType x_dtype, int m, const Tensor& matrix, float* y,
                   ExpertTally& tally) const {
    const int64_t rows = matrix.shape[0], cols = matrix.shape[1];
    tally.flops += 2.0 * m * rows * cols;
    if (!c.expert_quant.quantized()) {
      tally.weight_bytes += untallied_gemm(xin, x_dtype, m, matrix, y);
      return;
    }
    const cpu::QuantView packed = quant_view(c, matrix.data, rows, cols);
    tally.weight_bytes += double(packed.bytes());
    cpu::gemm_int8({.m = m, .x = xin, .x_dtype = x_dtype, .w = &packed, .y = y});
  }

  // The elementwise kernels as the offload path's HostMath makes them (one set of calls, so the
  // stand-in device computes this engine's numbers by construction).

  // y = x · weightᵀ, then + bias (when present).
  void project(const float* xin, int m, const Tensor& weight, const Tensor& bias, float* y) {
    gemm(xin, DType::F32, m, weight, y);
    if (!bias.empty()) math.add_bias(nullptr, y, bias.as<const float>(), m, weight.shape[0]);
  }

  // The model's norm over rows of hidden size: RMSNorm, or LayerNorm without bias.
  void norm(const float* in, int rows, const Tensor& weight, float* out) {
    if (c.norm == NormKind::kLayerNorm)
      math.layer_norm(nullptr, in, out, rows, c.hidden_size, weight.as<const float>(),
                      c.rms_norm_eps);
    else
      math.rms_norm(nullptr, in, out, rows, c.hidden_size, weight.as<const float>(),
                    c.rms_norm_eps);
  }

  // The q or k norm in place over `rows` rows of `heads` heads: per head, or over the row.
  void qk_norm(float* x_rows, int rows, int heads, const Tensor& weight) {
    if (weight.empty()) return;
    const bool per_head = c.qk_norm == QkNorm::kPerHead;
    math.rms_norm(nullptr, x_rows, x_rows, per_head ? int64_t(rows) * heads : rows,
                  per_head ? c.head_dim : int64_t(heads) * c.head_dim, weight.as<const float>(),
                  c.rms_norm_eps);
  }

  // q * cos + rotate_half(q) * sin at each row's position, in place.
  void rope(float* x_rows, int rows, int heads, const int* pos) {
    math.rope(nullptr, x_rows, rows, heads, c.head_dim, pos, inv_freq.data());
  }

  // x.clamp_(min=-clip_qkv, max=clip_qkv) when the model clips.
  void clip(float* values, size_t n) {
    if (c.clip_qkv > 0) math.clamp(nullptr, values, int64_t(n), c.clip_qkv);
  }

  void grow(int T) {
    const int H = c.hidden_size;
    x.resize(size_t(T) * H);
    h.resize(size_t(T) * H);
    // With MLA, k holds kv_a_proj_with_mqa's output (the latent and the RoPE key) and v is
    // unused.
    const bool latent = c.attention == AttentionKind::kLatent;
    q.resize(size_t(T) * c.q_dim());
    k.resize(size_t(T) * (latent ? c.kv_cache_values_per_token() : c.kv_dim()));
    v.resize(size_t(T) * (latent ? 0 : c.kv_dim()));
    attn.resize(size_t(T) * c.attn_out_dim());
    q_a.resize(size_t(T) * (latent ? c.mla.q_lora_rank : 0));
    router_logits.resize(size_t(T) * c.num_experts);
    mlp_scale.resize(size_t(T));
    moe_in.resize(size_t(T) * H);
    positions.resize(T);
    tokens.resize(T);
    row_request.resize(T);
    top_ids.resize(size_t(T) * c.experts_per_token);
    top_weights.resize(size_t(T) * c.experts_per_token);
  }

  void attention_phase(int l, const StepPlan& plan, const std::vector<int>& item_row,
                       int item_begin, int item_end);
  void latent_attention(int l, const StepPlan& plan, const std::vector<int>& item_row,
                        int item_begin, int item_end);
  void attention_output(int l, int r0, int n);
  void route(int l, int r0, int n);
  void expert_phase(int l);
  size_t end_of_concurrent_run(const std::vector<int>& chosen, size_t first) const;
  void run_expert(const std::array<Tensor, 3>& mats, const std::vector<Routed>& list);
  void concurrent_experts(const LayerWeights& L, const std::vector<int>& chosen, size_t first,
                          size_t last);
  void join_in_expert_order(const std::vector<int>& chosen, size_t first,
                            const std::vector<size_t>& r0);
  void gather_expert_rows(const Routed* rows, int m, size_t r0);
  void expert_ffn(const std::array<Tensor, 3>& mats, int m, size_t r0, ExpertTally& tally);
  void ffn_rows(const std::array<Tensor, 3>& mats, const void* xin, DType x_dtype, int m, size_t r0,
                ExpertTally& tally);
  void add_expert_tally(const ExpertTally& tally, int64_t calls, int64_t rows);
  void dense_mlp_phase(int l, int T);
  std::vector<int> execute(const StepPlan& plan, Scheduler& sched);
  // The steps of execute: each item's rows (item_row[i] is item i's first row) with their
  // positions, tokens and requests; the embeddings; the layers on the host; and the logits of
  // the output rows, observed and sampled.
  std::vector<int> lay_out_rows(const StepPlan& plan, const Scheduler& sched);
  void embed(int T);
  void run_layers(const StepPlan& plan, const std::vector<int>& item_row);
  bool device_may_pick_greedily(const StepPlan& plan, Scheduler& sched) const;
  struct OutputRow;
  std::vector<int> sample_outputs(const StepPlan& plan, Scheduler& sched,
                                  const std::vector<OutputRow>& out, std::span<const float> logits);
  struct OutputRow {
    int row;       // in the step's rows
    int item;      // in plan.items
    int position;  // in its sequence
    bool sample;   // picks the sequence's next token
  };
  std::vector<OutputRow> output_rows(const StepPlan& plan, const std::vector<int>& item_row,
                                     const Scheduler& sched) const;
  // Rows of logits made at once on the host (a scored prompt can ask for thousands).
  static constexpr int kLogitRowsAtOnce = 256;
};

void BatchEngine::Impl::attention_phase(int l, const StepPlan& plan,
                                        const std::vector<int>& item_row, int ib, int ie) {
  if (c.attention == AttentionKind::kLatent) return latent_attention(l, plan, item_row, ib, ie);
  const LayerWeights& L = w.layers[l];
  const int H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int r0 = item_row[ib], n = item_row[ie] - r0;
  auto t0 = Clock::now();
  // hidden_states = input_layernorm(x); q, k, v = q_proj(h), k_proj(h), v_proj(h) (+ biases)
  norm(&x[size_t(r0) * H], n, L.attn_norm, &h[size_t(r0) * H]);
  project(&h[size_t(r0) * H], n, L.wq, L.bq, &q[size_t(r0) * qd]);
  project(&h[size_t(r0) * H], n, L.wk, L.bk, &k[size_t(r0) * kvd]);
  project(&h[size_t(r0) * H], n, L.wv, L.bv, &v[size_t(r0) * kvd]);
  stats.dense_seconds += seconds_since(t0);

  t0 = Clock::now();
  // q = q_norm(q); k = k_norm(k); q, k, v clamped to ±clip_qkv; then RoPE
  qk_norm(&q[size_t(r0) * qd], n, c.num_heads, L.q_norm);
  qk_norm(&k[size_t(r0) * kvd], n, c.num_kv_heads, L.k_norm);
  clip(&q[size_t(r0) * qd], size_t(n) * qd);
  clip(&k[size_t(r0) * kvd], size_t(n) * kvd);
  clip(&v[size_t(r0) * kvd], size_t(n) * kvd);
  rope(&q[size_t(r0) * qd], n, c.num_heads, &positions[r0]);
  rope(&k[size_t(r0) * kvd], n, c.num_kv_heads, &positions[r0]);
  std::vector<HostAttentionItem> items;
  for (int i = ib; i < ie; ++i) {
    const StepItem& it = plan.items[i];
    const size_t row = size_t(item_row[i]);
    items.push_back({it.slot, it.first_pos, it.count, &q[row * qd], &k[row * kvd], &v[row * kvd],
                     &attn[row * qd]});
  }
  host_attention(c, kv, l, items, stats);
  stats.attention_seconds += seconds_since(t0);
  attention_output(l, r0, n);
}

// DeepseekV2Attention: q = q_proj(h), or q_b_proj(q_a_layernorm(q_a_proj(h))); compressed_kv =
// kv_a_proj_with_mqa(h); then the absorbed-form attention over the latent cache
// (host_latent_attention), and o_proj.
void BatchEngine::Impl::latent_attention(int l, const StepPlan& plan,
                                         const std::vector<int>& item_row, int ib, int ie) {
  const LayerWeights& L = w.layers[l];
  const int H = c.hidden_size, qd = c.q_dim(), ckv = c.kv_cache_values_per_token();
  const int ad = c.attn_out_dim(), qr = c.mla.q_lora_rank;
  const int r0 = item_row[ib], n = item_row[ie] - r0;
  auto t0 = Clock::now();
  norm(&x[size_t(r0) * H], n, L.attn_norm, &h[size_t(r0) * H]);
  if (qr > 0) {
    gemm(&h[size_t(r0) * H], DType::F32, n, L.q_a, &q_a[size_t(r0) * qr]);
    math.rms_norm(nullptr, &q_a[size_t(r0) * qr], &q_a[size_t(r0) * qr], n, qr,
                  L.q_a_norm.as<const float>(), c.rms_norm_eps);
    gemm(&q_a[size_t(r0) * qr], DType::F32, n, L.q_b, &q[size_t(r0) * qd]);
  } else {
    gemm(&h[size_t(r0) * H], DType::F32, n, L.wq, &q[size_t(r0) * qd]);
  }
  gemm(&h[size_t(r0) * H], DType::F32, n, L.kv_a, &k[size_t(r0) * ckv]);
  stats.dense_seconds += seconds_since(t0);

  t0 = Clock::now();
  std::vector<HostAttentionItem> items;
  for (int i = ib; i < ie; ++i) {
    const StepItem& it = plan.items[i];
    const size_t row = size_t(item_row[i]);
    items.push_back(
        {it.slot, it.first_pos, it.count, &q[row * qd], &k[row * ckv], nullptr, &attn[row * ad]});
  }
  host_latent_attention(c, L, latent_inv_freq, kv, l, items, stats);
  stats.attention_seconds += seconds_since(t0);
  attention_output(l, r0, n);
}

// x = x + o_proj(attn) (+ bias); h = post_attention_layernorm(x); the routing of the rows.
void BatchEngine::Impl::attention_output(int l, int r0, int n) {
  const LayerWeights& L = w.layers[l];
  const int H = c.hidden_size, ad = c.attn_out_dim();
  auto t0 = Clock::now();
  gemm(&attn[size_t(r0) * ad], DType::F32, n, L.wo, &x[size_t(r0) * H], 1.0f);
  if (!L.bo.empty()) math.add_bias(nullptr, &x[size_t(r0) * H], L.bo.as<const float>(), n, H);
  norm(&x[size_t(r0) * H], n, L.ffn_norm, &h[size_t(r0) * H]);
  route(l, r0, n);
  // Each row goes to k experts (and the dense MLP): round it to bf16 once here rather than in
  // every expert GEMM.
  if (policy.precision == Precision::kBf16)
    cpu::f32_to_bf16_row(&h[size_t(r0) * H], &moe_in[size_t(r0) * H], size_t(n) * H);
  stats.dense_seconds += seconds_since(t0);
}

// router_logits = gate(h), top-k into the experts' lists; the dense MLP's scale
// sigmoid(mlp_scale · h) (Qwen2-MoE's shared_expert_gate). Both GEMMs take h in fp32: the top-k
// is discontinuous in its input.
void BatchEngine::Impl::route(int l, int r0, int n) {
  const LayerWeights& L = w.layers[l];
  const int H = c.hidden_size, K = c.experts_per_token, E = c.num_experts;
  if (!L.router.empty()) {
    gemm(&h[size_t(r0) * H], DType::F32, n, L.router, &router_logits[size_t(r0) * E], 0,
         /*exact=*/true);
    cpu::RoutingArgs a = routing_rule(c);
    a.logits = &router_logits[size_t(r0) * E];
    a.tokens = n;
    a.selection_bias = L.router_bias.empty() ? nullptr : L.router_bias.as<const float>();
    a.expert_ids = &top_ids[size_t(r0) * K];
    a.weights = &top_weights[size_t(r0) * K];
    math.route_top_k(nullptr, a);
    for (int r = r0; r < r0 + n; ++r) {
      for (int j = 0; j < K; ++j)
        routed[top_ids[size_t(r) * K + j]].push_back({r, top_weights[size_t(r) * K + j]});
      if (observe_routing)
        observe_routing(row_request[r], positions[r], l,
                        std::span<const int>(&top_ids[size_t(r) * K], size_t(K)));
    }
  }
  float* scale = &mlp_scale[size_t(r0)];
  if (L.mlp_scale.empty()) {
    std::fill_n(scale, n, 1.0f);
    return;
  }
  gemm(&h[size_t(r0) * H], DType::F32, n, L.mlp_scale, scale, 0, /*exact=*/true);
  math.sigmoid(nullptr, scale, n);
}

// Each expert once over all its tokens of the step:
// x[row] += weight · w2(silu(w1 h) * w3 h), at most b_e rows per GEMM. Runs of experts with few
// rows that fit the b_e step buffers together run at once, one per thread (concurrent_experts);
// the others one after another, each GEMM on every thread (run_expert), as do all with the
// experts on disk.
void BatchEngine::Impl::expert_phase(int l) {
  const LayerWeights& L = w.layers[l];
  if (L.router.empty()) return;  // a dense layer
  const size_t H = size_t(c.hidden_size), I = size_t(c.expert_intermediate_size);
  const size_t rows = size_t(policy.expert_batch);
  auto t0 = Clock::now();
  const bool f32 = policy.precision == Precision::kF32;
  (f32 ? expert_xf.resize(rows * H) : expert_x.resize(rows * H));
  gate.resize(rows * I);
  up.resize(rows * I);
  act.resize(rows * I);
  down.resize(rows * H);
  std::vector<int> chosen;
  int step_tokens = 0;
  for (int e = 0; e < c.num_experts; ++e)
    if (!routed[e].empty()) {
      chosen.push_back(e);
      step_tokens += int(routed[e].size());
    }
  if (disk) {
    disk->begin_layer(l, chosen, step_tokens / c.experts_per_token);
    for (size_t i = 0; i < chosen.size(); ++i) {
      const ExpertMatrices pooled = disk->acquire(int(i));
      run_expert({pool_matrix(pooled, 0, I, H), pool_matrix(pooled, 1, I, H),
                  pool_matrix(pooled, 2, H, I)},
                 routed[chosen[i]]);
      disk->release(int(i));
    }
    stats.disk = disk->stats();
  } else {
    for (size_t first = 0, last = 0; first < chosen.size(); first = last) {
      last = end_of_concurrent_run(chosen, first);
      if (last - first == 1)
        run_expert(expert_matrices(L, chosen[first]), routed[chosen[first]]);
      else
        concurrent_experts(L, chosen, first, last);
    }
  }
  for (auto& list : routed) list.clear();
  stats.expert_seconds += seconds_since(t0);
}

// The end of the run of experts from chosen[first] that run at once: each with at most
// kConcurrentExpertRows rows, all fitting the b_e step buffers together, and at least
// kConcurrentExpertsPerThread per thread (else first + 1: it runs alone).
size_t BatchEngine::Impl::end_of_concurrent_run(const std::vector<int>& chosen,
                                                size_t first) const {
  const size_t threads = size_t(omp_get_max_threads());
  size_t last = first, rows = 0;
  while (last < chosen.size()) {
    const size_t m = routed[chosen[last]].size();
    if (m > kConcurrentExpertRows || rows + m > size_t(policy.expert_batch)) break;
    rows += m;
    ++last;
  }
  const bool enough = threads > 1 && last - first >= kConcurrentExpertsPerThread * threads;
  return enough ? last : first + 1;
}

// One expert over its rows, b_e rows per GEMM, each GEMM on every thread.
void BatchEngine::Impl::run_expert(const std::array<Tensor, 3>& mats,
                                   const std::vector<Routed>& list) {
  const int H = c.hidden_size, be = policy.expert_batch;
  for (size_t begin = 0; begin < list.size(); begin += be) {
    const int m = int(std::min(list.size() - begin, size_t(be)));
    gather_expert_rows(&list[begin], m, 0);
    auto tg = Clock::now();
    ExpertTally tally;
    expert_ffn(mats, m, 0, tally);
    stats.expert_gemm_seconds += seconds_since(tg);
    add_expert_tally(tally, 1, m);
    for (int j = 0; j < m; ++j)
      add_weighted(&x[size_t(list[begin + j].row) * H], &down[size_t(j) * H],
                   list[begin + j].weight, 0, H);
  }
}

// Experts chosen[first, last) at once, longest first, one per thread, each on its own rows of
// the step buffers (their rows fit them together) and its GEMMs on that thread alone. Their
// outputs then join their tokens in expert order, as run_expert adds them, the threads sharing
// the columns. On few tokens per expert this saves each GEMM's split of W among the threads and
// the wait at its end.
void BatchEngine::Impl::concurrent_experts(const LayerWeights& L, const std::vector<int>& chosen,
                                           size_t first, size_t last) {
  const size_t count = last - first;
  std::vector<size_t> r0(count + 1, 0), order(count);
  for (size_t i = 0; i < count; ++i) r0[i + 1] = r0[i] + routed[chosen[first + i]].size();
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return r0[a + 1] - r0[a] > r0[b + 1] - r0[b]; });
  auto tg = Clock::now();
  double flops = 0, bytes = 0;
#pragma omp parallel reduction(+ : flops, bytes)
  {
    omp_set_num_threads(1);  // the kernels' own parallel regions run on this thread alone
    ExpertTally tally;
#pragma omp for schedule(dynamic, 1)
    for (size_t o = 0; o < count; ++o) {
      const size_t i = order[o];
      const std::vector<Routed>& list = routed[chosen[first + i]];
      gather_expert_rows(list.data(), int(list.size()), r0[i]);
      expert_ffn(expert_matrices(L, chosen[first + i]), int(list.size()), r0[i], tally);
    }
    flops += tally.flops;
    bytes += tally.weight_bytes;
  }
  stats.expert_gemm_seconds += seconds_since(tg);
  add_expert_tally({flops, bytes}, int64_t(count), int64_t(r0.back()));
  stats.concurrent_expert_calls += int64_t(count);
  join_in_expert_order(chosen, first, r0);
}

// x[row] += weight · down of each routed row of experts chosen[first, ...), whose outputs start
// at rows r0 of `down`, expert after expert as run_expert adds them; each thread takes a share of
// the columns (whole cache lines of x).
void BatchEngine::Impl::join_in_expert_order(const std::vector<int>& chosen, size_t first,
                                             const std::vector<size_t>& r0) {
  const int H = c.hidden_size, threads = omp_get_max_threads();
#pragma omp parallel for schedule(static)
  for (int t = 0; t < threads; ++t) {
    const int i0 = H * t / threads / 16 * 16;
    const int i1 = t + 1 == threads ? H : H * (t + 1) / threads / 16 * 16;
    for (size_t i = 0; i + 1 < r0.size(); ++i) {
      const std::vector<Routed>& list = routed[chosen[first + i]];
      for (size_t j = 0; j < list.size(); ++j)
        add_weighted(&x[size_t(list[j].row) * H], &down[(r0[i] + j) * H], list[j].weight, i0, i1);
    }
  }
}

// The m routed rows' inputs into rows [r0, r0 + m) of the expert step buffers.
void BatchEngine::Impl::gather_expert_rows(const Routed* rows, int m, size_t r0) {
  const int H = c.hidden_size;
  // h still holds every row's post-attention norm: the attention phase wrote each micro-batch's
  // rows and no later micro-batch touches them.
  for (int j = 0; j < m; ++j) {
    const size_t row = size_t(rows[j].row) * H;
    if (policy.precision == Precision::kF32)
      std::copy_n(&h[row], H, &expert_xf[(r0 + j) * H]);
    else
      std::copy_n(&moe_in[row], H, &expert_x[(r0 + j) * H]);
  }
}

// down(silu(gate x) * up x) for rows [r0, r0 + m) of the expert step buffers, gathered there.
void BatchEngine::Impl::expert_ffn(const std::array<Tensor, 3>& mats, int m, size_t r0,
                                   ExpertTally& tally) {
  const size_t H = size_t(c.hidden_size);
  if (policy.precision == Precision::kF32)
    ffn_rows(mats, &expert_xf[r0 * H], DType::F32, m, r0, tally);
  else
    ffn_rows(mats, &expert_x[r0 * H], DType::BF16, m, r0, tally);
}

// down(silu(gate x) * up x) for m rows of x (`mats`: gate, up, down), through rows
// [r0, r0 + m) of the gate, up, act and down step buffers.
void BatchEngine::Impl::ffn_rows(const std::array<Tensor, 3>& mats, const void* xin, DType x_dtype,
                                 int m, size_t r0, ExpertTally& tally) {
  const size_t I = size_t(mats[0].shape[0]), H = size_t(mats[2].shape[0]);
  expert_gemm(xin, x_dtype, m, mats[0], &gate[r0 * I], tally);
  expert_gemm(xin, x_dtype, m, mats[1], &up[r0 * I], tally);
  cpu::silu_mul(&gate[r0 * I], &up[r0 * I], &act[r0 * I], int64_t(m) * int64_t(I));
  expert_gemm(&act[r0 * I], DType::F32, m, mats[2], &down[r0 * H], tally);
}

// The books of `calls` expert FFNs over `rows` rows in all.
void BatchEngine::Impl::add_expert_tally(const ExpertTally& tally, int64_t calls, int64_t rows) {
  stats.flops += tally.flops;
  stats.weight_bytes += tally.weight_bytes;
  stats.expert_flops += tally.flops;
  stats.expert_gemm_calls += calls;
  stats.expert_tokens += rows;
}

// The dense MLP over every row of the step (a shared expert, or a dense layer's MLP), b_e rows
// per GEMM: x[row] += scale[row] · down(silu(gate h) * up h).
void BatchEngine::Impl::dense_mlp_phase(int l, int T) {
  const LayerWeights& L = w.layers[l];
  if (L.mlp_gate.empty()) return;
  const int H = c.hidden_size, I = c.dense_mlp_size(l), be = policy.expert_batch;
  auto t0 = Clock::now();
  const bool f32 = policy.precision == Precision::kF32;
  gate.resize(std::max(gate.size(), size_t(be) * I));
  up.resize(std::max(up.size(), size_t(be) * I));
  act.resize(std::max(act.size(), size_t(be) * I));
  down.resize(std::max(down.size(), size_t(be) * H));
  const std::array<Tensor, 3> mats = {slot_matrix(L.mlp_gate, -1, I, H),
                                      slot_matrix(L.mlp_up, -1, I, H),
                                      slot_matrix(L.mlp_down, -1, H, I)};
  ExpertTally tally;
  for (int begin = 0; begin < T; begin += be) {
    const int m = std::min(T - begin, be);
    if (f32)
      ffn_rows(mats, &h[size_t(begin) * H], DType::F32, m, 0, tally);
    else
      ffn_rows(mats, &moe_in[size_t(begin) * H], DType::BF16, m, 0, tally);
    math.add_scaled_rows(nullptr, down.data(), H, &mlp_scale[size_t(begin)], m,
                         &x[size_t(begin) * H]);
  }
  stats.flops += tally.flops;
  stats.weight_bytes += tally.weight_bytes;
  stats.dense_seconds += seconds_since(t0);
}

// The rows whose final hidden state a step needs, item by item: a scored request's prompt rows
// from its score_prompt_from on (when someone observes the logits), and each sampled row.
std::vector<BatchEngine::Impl::OutputRow> BatchEngine::Impl::output_rows(
    const StepPlan& plan, const std::vector<int>& item_row, const Scheduler& sched) const {
  std::vector<OutputRow> out;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const StepItem& it = plan.items[i];
    const int from = sched.sequence(it.slot).request.score_prompt_from;
    const int last = it.first_pos + it.count - 1;
    if (observe_logits && from >= 0) {
      const int prompt_end = int(sched.sequence(it.slot).request.prompt.size());
      for (int pos = std::max(from, it.first_pos); pos < std::min(last, prompt_end); ++pos)
        out.push_back({item_row[i] + (pos - it.first_pos), int(i), pos, false});
      if (!it.sample && last < prompt_end && last >= from)
        out.push_back({item_row[i + 1] - 1, int(i), last, false});
    }
    if (it.sample) out.push_back({item_row[i + 1] - 1, int(i), last, true});
  }
  return out;
}

std::vector<int> BatchEngine::Impl::lay_out_rows(const StepPlan& plan, const Scheduler& sched) {
  std::vector<int> item_row(plan.items.size() + 1, 0);
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const StepItem& it = plan.items[i];
    const ActiveSequence& s = sched.sequence(it.slot);
    item_row[i + 1] = item_row[i] + it.count;
    for (int j = 0; j < it.count; ++j) {
      positions[item_row[i] + j] = it.first_pos + j;
      tokens[item_row[i] + j] = s.tokens[it.first_pos + j];
      row_request[item_row[i] + j] = s.request.id;
    }
  }
  return item_row;
}

// inputs_embeds = embed_tokens(input_ids)
void BatchEngine::Impl::embed(int T) {
  const int H = c.hidden_size;
  auto t0 = Clock::now();
  const size_t embed_row = size_t(H) * dtype_size(w.embed.dtype);
  for (int r = 0; r < T; ++r) {
    if (tokens[r] < 0 || tokens[r] >= c.vocab_size)
      fail("token id {} is outside the vocabulary [0, {})", tokens[r], c.vocab_size);
    to_f32(w.embed.dtype, static_cast<const char*>(w.embed.data) + tokens[r] * embed_row,
           &x[size_t(r) * H], H);
  }
  stats.dense_seconds += seconds_since(t0);
}

void BatchEngine::Impl::run_layers(const StepPlan& plan, const std::vector<int>& item_row) {
  for (int l = 0; l < c.num_layers; ++l) {
    int ib = 0;
    for (int ie : plan.micro_batch_end) {
      attention_phase(l, plan, item_row, ib, ie);
      ib = ie;
    }
    expert_phase(l);
    dense_mlp_phase(l, plan.tokens);
  }
}

// Whether the device may pick the sampled tokens itself (its argmax): nobody observes the logits
// and every sampling item is greedy without logprobs.
bool BatchEngine::Impl::device_may_pick_greedily(const StepPlan& plan, Scheduler& sched) const {
  return !observe_logits &&
         std::all_of(plan.items.begin(), plan.items.end(), [&](const StepItem& it) {
           const Request& r = sched.sequence(it.slot).request;
           return !it.sample || (r.sampling.temperature == 0.0f && r.top_logprobs < 0);
         });
}

// The output rows' logits (from `device_logits`, or made here from final_rows when the lm_head
// is on the host), kLogitRowsAtOnce at a time: observed, and the sampling rows' tokens picked.
std::vector<int> BatchEngine::Impl::sample_outputs(const StepPlan& plan, Scheduler& sched,
                                                   const std::vector<OutputRow>& out,
                                                   std::span<const float> device_logits) {
  const int S = int(out.size()), H = c.hidden_size;
  std::vector<int> sampled;
  const bool host_lm_head = !offload || !offload->lm_head_on_device();
  for (int j0 = 0; j0 < S; j0 += kLogitRowsAtOnce) {
    const int n = std::min(kLogitRowsAtOnce, S - j0);
    const float* rows = device_logits.data() + size_t(j0) * c.vocab_size;
    if (host_lm_head) {
      auto t0 = Clock::now();
      norm(&final_rows[size_t(j0) * H], n, w.final_norm, h.data());
      logits.resize(size_t(n) * c.vocab_size);
      gemm(h.data(), DType::F32, n, w.lm_head, logits.data());
      stats.dense_seconds += seconds_since(t0);
      rows = logits.data();
    }
    auto t0 = Clock::now();
    for (int j = 0; j < n; ++j) {
      const OutputRow& o = out[size_t(j0 + j)];
      ActiveSequence& s = sched.sequence(plan.items[size_t(o.item)].slot);
      std::span<const float> row(rows + size_t(j) * c.vocab_size, size_t(c.vocab_size));
      if (observe_logits) observe_logits(s.request.id, o.position, row);
      if (!o.sample) continue;
      sampled.push_back(s.sampler.sample(row));
      if (s.request.top_logprobs >= 0)
        s.logprobs.push_back(token_logprob(row, sampled.back(), s.request.top_logprobs));
    }
    stats.sampling_seconds += seconds_since(t0);
  }
  return sampled;
}

std::vector<int> BatchEngine::Impl::execute(const StepPlan& plan, Scheduler& sched) {
  const int T = plan.tokens, H = c.hidden_size;
  grow(T);
  const std::vector<int> item_row = lay_out_rows(plan, sched);
  embed(T);
  // Final norm and lm_head only for the rows whose logits are wanted.
  const std::vector<OutputRow> out = output_rows(plan, item_row, sched);
  std::vector<int> out_rows(out.size());
  for (size_t j = 0; j < out.size(); ++j) out_rows[j] = out[j].row;
  const int S = int(out.size());
  final_rows.resize(size_t(S) * H);
  if (!offload) {
    run_layers(plan, item_row);
    for (int j = 0; j < S; ++j)
      std::copy_n(&x[size_t(out_rows[j]) * H], H, &final_rows[size_t(j) * H]);
    return sample_outputs(plan, sched, out, {});
  }
  // The output rows' logits, [S, V], or the sampled rows' greedy tokens: from the device when its
  // executor runs the lm_head.
  OffloadStepInput in{&plan, item_row, positions, x.data(), out_rows};
  in.greedy = device_may_pick_greedily(plan, sched);
  const OffloadStepOutput device_out = offload->run_layers(in, final_rows.data(), stats);
  // Picked on the device: what Sampler::sample picks at temperature 0 (it draws no random number).
  if (!device_out.greedy_tokens.empty())
    return {device_out.greedy_tokens.begin(), device_out.greedy_tokens.end()};
  return sample_outputs(plan, sched, out, device_out.logits);
}

BatchEngine::BatchEngine(const Model& model, const Policy& policy)
    : impl_(std::make_unique<Impl>(model, policy, EngineDevice{})) {}
BatchEngine::BatchEngine(const Model& model, const Policy& policy, const EngineDevice& device)
    : impl_(std::make_unique<Impl>(model, policy, device)) {}
BatchEngine::BatchEngine(const Model& model, const Policy& policy, const DeviceOptions& device) {
  std::unique_ptr<OffloadBackend> backend = open_offload_backend(device);
  EngineDevice d;
  if (backend) d = {backend->device.get(), backend->math.get(), device.settings};
  impl_ = std::make_unique<Impl>(model, policy, d);
  impl_->backend = std::move(backend);
}
BatchEngine::~BatchEngine() = default;
void BatchEngine::set_step_observer(StepObserver observer) {
  impl_->observe_step = std::move(observer);
}
void BatchEngine::set_logits_observer(LogitsObserver observer) {
  impl_->observe_logits = std::move(observer);
}
void BatchEngine::set_routing_observer(RoutingObserver observer) {
  if (impl_->offload)
    fail(
        "engine: the routing observer sees the CPU engine's routing, and this engine runs its "
        "layers on an offload device, which routes there");
  impl_->observe_routing = std::move(observer);
}
const Policy& BatchEngine::policy() const {
  return impl_->policy;
}
const EngineStats& BatchEngine::stats() const {
  return impl_->stats;
}

std::unique_ptr<Scheduler> BatchEngine::make_scheduler() {
  Impl& m = *impl_;
  return std::make_unique<Scheduler>(m.policy, m.kv, m.c.max_position_embeddings,
                                     DeviceKvPool{m.device_kv.get(), m.cpu_share});
}

std::vector<Completion> BatchEngine::step(Scheduler& sched) {
  Impl& m = *impl_;
  const int64_t turns_before = sched.device_turns_to_host();
  auto t0 = Clock::now();
  StepPlan plan = sched.plan_step();
  m.stats.scheduling_seconds += seconds_since(t0);
  if (plan.empty()) fail("engine: the scheduler has work left but planned an empty step");
  m.stats.peak_kv_usage = std::max(m.stats.peak_kv_usage, sched.kv_usage());
  auto t_step = Clock::now();
  const EngineStats before = m.stats;
  std::vector<int> sampled = m.execute(plan, sched);
  const double step_seconds = seconds_since(t_step);
  if (plan.prefill_tokens == 0) {
    ++m.stats.decode_only_steps;
    m.stats.decode_only_tokens += plan.decode_tokens;
    m.stats.decode_only_seconds += step_seconds;
    m.stats.decode_only_device_weight_bytes +=
        m.stats.device_weight_bytes - before.device_weight_bytes;
    m.stats.decode_only_flops += m.stats.flops - before.flops;
    m.stats.decode_only_expert_flops += m.stats.expert_flops - before.expert_flops;
    m.stats.decode_only_disk_bytes += m.stats.disk.bytes_read - before.disk.bytes_read;
    m.stats.decode_only_bytes +=
        m.stats.weight_bytes + m.stats.kv_bytes - before.weight_bytes - before.kv_bytes;
  }
  m.stats.prefill_seconds += step_seconds * plan.prefill_tokens / plan.tokens;
  m.stats.decode_seconds += step_seconds * plan.decode_tokens / plan.tokens;
  m.stats.prefill_tokens += plan.prefill_tokens;
  m.stats.decode_tokens += plan.decode_tokens;
  ++m.stats.steps;
  t0 = Clock::now();
  std::vector<Completion> done = sched.complete_step(plan, sampled);
  m.stats.scheduling_seconds += seconds_since(t0);
  m.stats.device_gpu_share_full += sched.device_turns_to_host() - turns_before;
  m.stats.kv_stored_bytes = m.kv.stored_bytes();
  m.stats.kv_stored_token_layers = m.kv.stored_token_layers();
  return done;
}

void BatchEngine::run(std::vector<Request> requests,
                      const std::function<void(Completion&&)>& on_finished) {
  Impl& m = *impl_;
  std::unique_ptr<Scheduler> sched = make_scheduler();
  int64_t finished = 0;
  // A request that can never run fails alone, reported before the others finish.
  for (Request& r : requests)
    if (std::optional<Completion> failed = sched->submit(std::move(r))) {
      ++finished;
      on_finished(std::move(*failed));
    }
  while (!sched->done()) {
    std::vector<Completion> done = step(*sched);
    finished += int64_t(done.size());
    for (Completion& c : done) on_finished(std::move(c));
    if (m.observe_step)
      m.observe_step(m.stats,
                     {finished, sched->active(), int64_t(sched->waiting()), sched->kv_usage()});
  }
}

}  // namespace sluice
