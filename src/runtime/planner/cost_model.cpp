#include "runtime/planner/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/gemm_int8.h"
#include "model/expert_quant.h"
#include "runtime/disk/expert_page_pool.h"

namespace sluice {

int StepShape::tokens() const {
  int t = 0;
  for (const auto& mb : micro_batches) t += mb.tokens;
  return t;
}

CpuCostModel::CpuCostModel(const HardwareProfile& profile, const ModelConfig& config,
                           const Policy& policy)
    : hw_(profile), c_(config), p_(policy) {
  if (p_.expert_batch <= 0)
    fail("cost model: policy field 'expert_batch': expected a resolved value > 0, got {}",
         p_.expert_batch);
  if (hw_.dram_bytes_per_s <= 0 || hw_.gemm_peak_flops <= 0 || hw_.elementwise_bytes_per_s <= 0 ||
      hw_.attention_bytes_per_s <= 0 || hw_.attention_flops <= 0)
    fail(
        "cost model: hardware profile: expected positive ceilings, got DRAM {} B/s, GEMM {} "
        "FLOP/s, elementwise {} B/s, attention {} B/s and {} FLOP/s",
        hw_.dram_bytes_per_s, hw_.gemm_peak_flops, hw_.elementwise_bytes_per_s,
        hw_.attention_bytes_per_s, hw_.attention_flops);
}

// GEMM Y[m,n] = X[m,k]·Wᵀ: 2·m·n·k FLOPs; bytes are W (bf16) once, X and Y once. In bf16
// precision the engine rounds X to bf16 inside cpu::gemm; in fp32 precision (and always for the
// router) it uses cpu::gemm_f32.
Task CpuCostModel::gemm_task(const std::string& name, const std::string& group, double m, int64_t n,
                             int64_t k, bool exact_f32) const {
  const bool f32 = exact_f32 || p_.precision == Precision::kF32;
  Task t;
  t.name = name;
  t.group = group;
  t.flops = 2.0 * m * double(n) * double(k);
  t.bytes = 2.0 * double(n) * double(k) + m * double(k) * (f32 ? 4 : 2) + 4.0 * m * double(n);
  // The time is sluice's own (its GEMM's curve, never faster than its measured peak); the bound
  // is the machine's: FLOPs against the ISA level's instruction peak, bytes against DRAM.
  const std::string act = f32 ? "f32" : "bf16";
  const double compute = t.flops / hw_.gemm_peak_flops, memory = t.bytes / hw_.dram_bytes_per_s;
  t.bound = t.flops / hw_.compute_ceiling_flops(act) > memory ? Bound::kCompute : Bound::kMemory;
  t.seconds =
      std::max({hw_.gemm_seconds(m, n, k, act), compute, memory}) + hw_.call_overhead_seconds;
  return t;
}

Task CpuCostModel::mlp_gemm_task(const std::string& name, const std::string& group, double m,
                                 int64_t n, int64_t k) const {
  const ExpertQuant& q = c_.expert_quant;
  if (!q.quantized()) return gemm_task(name, group, m, n, k);
  Task t;
  t.name = name;
  t.group = group;
  t.flops = 2.0 * m * double(n) * double(k);
  // W packed with its scales, X in fp32 (quantized on the fly), Y.
  t.bytes = double(cpu::quant_bytes(quant_format(q.dtype), n, k, q.group_size)) +
            4.0 * m * double(k) + 4.0 * m * double(n);
  // The measured speedup of the quantized GEMM over the bf16 one at this m; from older profiles,
  // the ratio of the instruction peaks (which at the avx2 level overstates int8's).
  const InstructionCeilings& peaks = hw_.instructions;
  const double measured =
      hw_.quant_gemm.at(quant_format(q.dtype) == cpu::QuantFormat::kInt4, m);
  const double speedup = measured > 0          ? measured
                         : peaks.measured()    ? peaks.int8_ops / peaks.bf16_flops
                                               : 1.0;
  const double compute = t.flops / (hw_.gemm_peak_flops * speedup),
               memory = t.bytes / hw_.dram_bytes_per_s;
  t.bound = t.flops / hw_.compute_ceiling_flops("int8") > memory ? Bound::kCompute : Bound::kMemory;
  t.seconds = std::max({hw_.gemm_seconds(m, n, k, "bf16") / speedup, compute, memory}) +
              hw_.call_overhead_seconds;
  return t;
}

Task CpuCostModel::elementwise_task(const std::string& name, const std::string& group,
                                    double bytes) const {
  Task t;
  t.name = name;
  t.group = group;
  t.bytes = bytes;
  t.flops = bytes / 4;  // about one operation per fp32 element: far below any ridge point
  t.bound = Bound::kMemory;
  t.seconds = bytes / hw_.elementwise_bytes_per_s + hw_.call_overhead_seconds;
  return t;
}

// Paged attention reads K and V (bf16) of every position each sequence attends to once per
// micro-batch, and does 4 FLOPs per (query row, key position, q element): QK dot and PV axpy.
Task CpuCostModel::attention_task(const std::string& name, const MicroBatchShape& mb) const {
  Task t;
  t.name = name;
  t.group = "attention (KV reads)";
  t.bytes = mb.kv_positions * double(c_.kv_cache_values_per_token()) * 2;
  t.flops = mb.qk_pairs * c_.attention_flops_per_pair();
  const double memory = t.bytes / hw_.attention_bytes_per_s,
               compute = t.flops / hw_.attention_flops;
  t.bound = compute > memory ? Bound::kCompute : Bound::kMemory;
  t.seconds = std::max(memory, compute) + hw_.call_overhead_seconds;
  return t;
}

std::vector<std::pair<int, double>> CpuCostModel::tokens_per_expert_distribution(int T) const {
  const double p = double(c_.experts_per_token) / double(c_.num_experts);
  if (T <= 0) return {{0, 1.0}};
  const double mean = T * p, sd = std::sqrt(T * p * (1 - p));
  const int lo = std::max(0, int(std::floor(mean - 10 * sd - 2)));
  const int hi = std::min(T, int(std::ceil(mean + 10 * sd + 2)));
  std::vector<std::pair<int, double>> out;
  double total = 0;
  for (int m = lo; m <= hi; ++m) {
    const double log_pmf = std::lgamma(T + 1.0) - std::lgamma(m + 1.0) - std::lgamma(T - m + 1.0) +
                           m * std::log(p) + (T - m) * std::log1p(-p);
    const double pm = std::exp(log_pmf);
    if (pm < 1e-12) continue;
    out.push_back({m, pm});
    total += pm;
  }
  for (auto& [m, pm] : out) pm /= total;
  return out;
}

std::vector<Task> CpuCostModel::expert_tasks(int expert, int T, int min_tokens,
                                             int max_tokens) const {
  const int64_t H = c_.hidden_size, I = c_.expert_intermediate_size;
  const bool f32 = p_.precision == Precision::kF32;
  const std::string prefix = fmt::format("expert{}.", expert);
  // One chunk of m rows: the engine's sequence for it.
  auto chunk = [&](double m) {
    return std::vector<Task>{
        elementwise_task(prefix + "gather", "expert gather/scatter", m * double(H) * (f32 ? 8 : 4)),
        mlp_gemm_task(prefix + "gate", "expert GEMMs", m, I, H),
        mlp_gemm_task(prefix + "up", "expert GEMMs", m, I, H),
        elementwise_task(prefix + "silu_mul", "expert SiLU-mul", m * double(I) * 12),
        mlp_gemm_task(prefix + "down", "expert GEMMs", m, H, I),
        elementwise_task(prefix + "scatter_add", "expert gather/scatter", m * double(H) * 12)};
  };
  std::vector<Task> expected = chunk(1);
  for (Task& t : expected) t.flops = t.bytes = t.seconds = 0;
  const int be = p_.expert_batch;
  for (auto [m, pm] : tokens_per_expert_distribution(T)) {
    if (m == 0 || m < min_tokens || m > max_tokens) continue;
    std::vector<Task> full, rest;
    if (m / be > 0) full = chunk(be);
    if (m % be > 0) rest = chunk(m % be);
    for (size_t i = 0; i < expected.size(); ++i) {
      double f = 0, b = 0, s = 0;
      if (!full.empty())
        f += full[i].flops * (m / be), b += full[i].bytes * (m / be),
            s += full[i].seconds * (m / be);
      if (!rest.empty()) f += rest[i].flops, b += rest[i].bytes, s += rest[i].seconds;
      expected[i].flops += pm * f;
      expected[i].bytes += pm * b;
      expected[i].seconds += pm * s;
    }
  }
  const double ceiling =
      hw_.compute_ceiling_flops(c_.expert_quant.quantized() ? "int8" : f32 ? "f32" : "bf16");
  for (Task& t : expected)
    if (t.group == "expert GEMMs")
      t.bound =
          t.flops / ceiling > t.bytes / hw_.dram_bytes_per_s ? Bound::kCompute : Bound::kMemory;
  return expected;
}

// One micro-batch of one layer, in the engine's order (attention_phase in batch_engine.cpp):
// biases are written as the GEMMs' initial rows, q/k norms read and write q and k once more.
void CpuCostModel::add_micro_batch(TaskGraph& g, int layer, int index,
                                   const MicroBatchShape& mb) const {
  const double n = mb.tokens;
  const int64_t H = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim();
  const std::string p = fmt::format("layer{}.mb{}.", layer, index);
  g.chain(elementwise_task(p + "attn_norm", "norms, RoPE, routing", n * double(H) * 8));
  if (c_.attention == AttentionKind::kLatent) {
    add_latent_attention(g, p, mb);
    add_ffn_routing(g, layer, p, n);
    return;
  }
  if (c_.qkv_bias)
    g.chain(elementwise_task(p + "qkv_bias", "norms, RoPE, routing", n * double(qd + 2 * kvd) * 4));
  g.chain(gemm_task(p + "q_proj", "attention projections", n, qd, H));
  g.chain(gemm_task(p + "k_proj", "attention projections", n, kvd, H));
  g.chain(gemm_task(p + "v_proj", "attention projections", n, kvd, H));
  if (c_.qk_norm != QkNorm::kNone)
    g.chain(elementwise_task(p + "qk_norm", "norms, RoPE, routing", n * double(qd + kvd) * 8));
  g.chain(elementwise_task(p + "rope_kv_write", "norms, RoPE, routing",
                           n * double(qd + kvd) * 8 + n * double(kvd) * (8 + 4)));
  g.chain(attention_task(p + "attention", mb));
  g.chain(gemm_task(p + "o_proj", "attention projections", n, H, qd));
  if (c_.o_bias) g.chain(elementwise_task(p + "o_bias", "norms, RoPE, routing", n * double(H) * 8));
  add_ffn_routing(g, layer, p, n);
}

// MLA in the absorbed form: q (through q-LoRA when the model has it) and the latent with its
// RoPE key projected; each head's q_nope folded through W_UK into the latent space; attention
// over the cached latents; the weighted latent sum unfolded through W_UV; o_proj.
void CpuCostModel::add_latent_attention(TaskGraph& g, const std::string& p,
                                        const MicroBatchShape& mb) const {
  const double n = mb.tokens;
  const LatentAttentionShape& a = c_.mla;
  const int64_t H = c_.hidden_size, heads = c_.num_heads, R = a.kv_lora_rank,
                P = a.qk_rope_head_dim;
  const char* proj = "attention projections";
  if (a.q_lora_rank > 0) {
    g.chain(gemm_task(p + "q_a_proj", proj, n, a.q_lora_rank, H));
    g.chain(elementwise_task(p + "q_a_norm", "norms, RoPE, routing", n * a.q_lora_rank * 8.0));
    g.chain(gemm_task(p + "q_b_proj", proj, n, heads * c_.head_dim, a.q_lora_rank));
  } else {
    g.chain(gemm_task(p + "q_proj", proj, n, heads * c_.head_dim, H));
  }
  g.chain(gemm_task(p + "kv_a_proj", proj, n, R + P, H));
  g.chain(elementwise_task(
      p + "kv_norm_rope_write", "norms, RoPE, routing",
      n * double(R) * 8 + n * double(heads * P + P) * 8 + n * double(R + P) * (8 + 4)));
  g.chain(gemm_task(p + "q_absorb", proj, n, heads * R, a.qk_nope_head_dim));
  g.chain(attention_task(p + "attention", mb));
  g.chain(gemm_task(p + "v_unabsorb", proj, n, heads * a.v_head_dim, R));
  g.chain(gemm_task(p + "o_proj", proj, n, H, heads * a.v_head_dim));
}

void CpuCostModel::add_ffn_routing(TaskGraph& g, int layer, const std::string& p, double n) const {
  const int64_t H = c_.hidden_size, E = c_.num_experts;
  g.chain(elementwise_task(p + "ffn_norm", "norms, RoPE, routing", n * double(H) * 8));
  const bool moe = c_.is_moe_layer(layer);
  if (moe) g.chain(gemm_task(p + "router", "router", n, E, H, /*exact_f32=*/true));
  if (moe && c_.shared_expert_gate && c_.dense_mlp_size(layer) > 0)
    g.chain(gemm_task(p + "shared_expert_gate", "router", n, 1, H, /*exact_f32=*/true));
  g.chain(elementwise_task(p + "top_k_and_round", "norms, RoPE, routing",
                           n * double(moe ? E : 0) * 4 + n * double(H) * 6));
}

// dense_mlp_phase in batch_engine.cpp: every row of the step, b_e rows per GEMM.
std::vector<Task> CpuCostModel::dense_mlp_tasks(int layer, int T) const {
  const int64_t H = c_.hidden_size, I = c_.dense_mlp_size(layer);
  std::vector<Task> tasks;
  if (I == 0) return tasks;
  const std::string p = fmt::format("layer{}.dense_mlp.", layer);
  for (int begin = 0; begin < T; begin += p_.expert_batch) {
    const double m = std::min(T - begin, p_.expert_batch);
    tasks.push_back(mlp_gemm_task(p + "gate", "dense MLP GEMMs", m, I, H));
    tasks.push_back(mlp_gemm_task(p + "up", "dense MLP GEMMs", m, I, H));
    tasks.push_back(elementwise_task(p + "silu_mul", "dense MLP SiLU-mul", m * double(I) * 12));
    tasks.push_back(mlp_gemm_task(p + "down", "dense MLP GEMMs", m, H, I));
    tasks.push_back(elementwise_task(p + "scale_add", "dense MLP SiLU-mul", m * double(H) * 12));
  }
  return tasks;
}

TaskGraph CpuCostModel::step_graph(const StepShape& step) const {
  TaskGraph g;
  const int T = step.tokens(), S = step.sampled;
  const int64_t H = c_.hidden_size;
  g.chain(elementwise_task("embed", "embedding, lm_head, sampling", double(T) * double(H) * 6));
  int last_reads = -1;
  for (int l = 0; l < c_.num_layers; ++l) {
    for (size_t i = 0; i < step.micro_batches.size(); ++i)
      add_micro_batch(g, l, int(i), step.micro_batches[i]);
    // The disk reads of a layer's experts run on their own thread, one layer after another, and
    // the layer's expert GEMMs wait for them.
    std::optional<Task> reads = c_.is_moe_layer(l) ? disk_read_task(T) : std::nullopt;
    const int last_compute = int(g.tasks().size()) - 1;
    if (reads) {
      reads->name = fmt::format("layer{}.expert_reads", l);
      if (last_reads >= 0) reads->deps = {last_reads};
      last_reads = g.add(std::move(*reads));
    }
    for (int e = 0; c_.is_moe_layer(l) && e < c_.num_experts; ++e)
      for (Task& t : expert_tasks(e, T)) {
        t.name = fmt::format("layer{}.{}", l, t.name);
        if (e == 0 && reads) {
          t.deps = {last_compute, last_reads};
          g.add(std::move(t));
        } else {
          g.chain(std::move(t));
        }
      }
    for (Task& t : dense_mlp_tasks(l, T)) g.chain(std::move(t));
  }
  if (S > 0) {
    g.chain(
        elementwise_task("final_norm", "embedding, lm_head, sampling", double(S) * double(H) * 16));
    Task head = gemm_task("lm_head", "embedding, lm_head, sampling", S, c_.vocab_size, H);
    g.chain(std::move(head));
    g.chain(elementwise_task("sampling", "embedding, lm_head, sampling",
                             double(S) * double(c_.vocab_size) * 8));
  }
  return g;
}

double CpuCostModel::micro_batch_dense_seconds(int layer, int tokens) const {
  const std::pair<int64_t, int> key{layer_kind(layer), tokens};
  auto it = dense_memo_.find(key);
  if (it != dense_memo_.end()) return it->second;
  TaskGraph g;
  add_micro_batch(g, layer, 0, MicroBatchShape{tokens, 0, 0});
  double s = 0;
  for (const Task& t : g.tasks())  // attention is added per micro-batch by the caller
    if (t.group != "attention (KV reads)") s += t.seconds;
  return dense_memo_[key] = s;
}

double CpuCostModel::dense_mlp_seconds(int layer, int T) const {
  const std::pair<int64_t, int> key{layer_kind(layer), T};
  auto it = mlp_memo_.find(key);
  if (it != mlp_memo_.end()) return it->second;
  double s = 0;
  for (const Task& t : dense_mlp_tasks(layer, T)) s += t.seconds;
  return mlp_memo_[key] = s;
}

double CpuCostModel::layer_seconds(int layer, const StepShape& step) const {
  double s = dense_mlp_seconds(layer, step.tokens());
  if (c_.is_moe_layer(layer)) s += expert_phase_seconds(step.tokens());
  for (const MicroBatchShape& mb : step.micro_batches)
    s += micro_batch_dense_seconds(layer, mb.tokens) + attention_task("", mb).seconds;
  // The reads of the next layer's experts overlap this layer's compute: the slower one counts.
  if (const auto reads = c_.is_moe_layer(layer) ? disk_read_task(step.tokens()) : std::nullopt)
    s = std::max(s, reads->seconds);
  return s;
}

std::optional<Task> CpuCostModel::disk_read_task(int T, double kept_elsewhere) const {
  if (p_.pool_experts <= 0 || hw_.disk_bytes_per_s <= 0) return std::nullopt;
  const double E = c_.num_experts, k = c_.experts_per_token;
  const double used = E * (1 - std::pow(1 - k / E, double(T)));
  int moe_layers = 0;
  for (int l = 0; l < c_.num_layers; ++l) moe_layers += c_.is_moe_layer(l) ? 1 : 0;
  const double kept = std::max(0.0, double(p_.pool_experts) - 2 * used);
  const double hit = std::min(1.0, kept / (E * std::max(1, moe_layers)) + kept_elsewhere);
  Task t;
  t.name = "expert_reads";
  t.group = "expert reads from disk";
  t.resource = Resource::kDisk;
  t.bound = Bound::kLink;
  t.bytes = used * (1 - hit) * double(expert_file_bytes(c_));
  t.seconds = t.bytes / hw_.disk_bytes_per_s;
  return t;
}

double CpuCostModel::expert_phase_seconds(int T) const {
  auto it = expert_memo_.find(T);
  if (it != expert_memo_.end()) return it->second;
  double s = 0;
  for (const Task& t : expert_tasks(0, T)) s += t.seconds;
  return expert_memo_[T] = s * c_.num_experts;  // experts are interchangeable in expectation
}

double CpuCostModel::head_seconds(int T, int S) const {
  const int64_t H = c_.hidden_size;
  double s = double(T) * double(H) * 6 / hw_.elementwise_bytes_per_s + hw_.call_overhead_seconds;
  if (S > 0)
    s += (double(S) * double(H) * 16 + double(S) * double(c_.vocab_size) * 8) /
             hw_.elementwise_bytes_per_s +
         2 * hw_.call_overhead_seconds + gemm_task("lm_head", "", S, c_.vocab_size, H).seconds;
  return s;
}

double CpuCostModel::step_seconds(const StepShape& step) const {
  double s = head_seconds(step.tokens(), step.sampled);
  // Layers of one kind cost the same: each kind is costed once.
  std::map<int64_t, std::pair<int, int>> kinds;  // kind -> (a layer of it, count)
  for (int l = 0; l < c_.num_layers; ++l) {
    auto [it, fresh] = kinds.try_emplace(layer_kind(l), l, 0);
    ++it->second.second;
  }
  for (const auto& [kind, layer_count] : kinds)
    s += layer_count.second * layer_seconds(layer_count.first, step);
  return s;
}

}  // namespace sluice
