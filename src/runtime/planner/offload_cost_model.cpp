#include "runtime/planner/offload_cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"

namespace sluice {

std::string describe(const OffloadPlan& o) {
  if (!o.gpu) return "cpu-only";
  std::string page = human_bytes(double(o.page_bytes));
  page.erase(std::remove(page.begin(), page.end(), ' '), page.end());
  return fmt::format("omega={:.2f} resident={} page={} depth={} cpu_experts<={}{}",
                     o.cpu_attention_share, o.resident_expert_layers, page, o.prefetch_depth,
                     o.cpu_expert_max_tokens,
                     o.cache_pages > 0 ? fmt::format(" cache={}", o.cache_pages) : "");
}

int streamed_expert_layers(const ModelConfig& c, int resident_expert_layers) {
  int streamed = 0;
  for (int l = 0; l < c.num_layers; ++l)
    streamed += c.is_moe_layer(l) && !layer_resident(l, c.num_layers, resident_expert_layers);
  return streamed;
}

int default_cache_pages(size_t free, size_t used, size_t page_bytes, int64_t streamed,
                        int64_t window) {
  const size_t margin = std::max(size_t(256) << 20, free / 10);
  if (used + margin >= free || streamed <= window) return 0;
  return int(std::min<int64_t>(streamed - window, int64_t((free - used - margin) / page_bytes)));
}

size_t expert_weight_bytes(const ModelConfig& c) {
  // Each matrix is one page of the largest one's size (engine/offload_layout.h); with bf16 all
  // three are I·H·2, with quantized experts the packed size (rows padded to 16) of each.
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  return 3 * std::max(expert_matrix_bytes(c, I, H), expert_matrix_bytes(c, H, I));
}

int pages_per_expert(const ModelConfig& c, size_t page_bytes) {
  if (page_bytes == 0) fail("offload plan: field 'page_bytes': expected > 0, got 0");
  return int((expert_weight_bytes(c) + page_bytes - 1) / page_bytes);
}

bool layer_resident(int layer, int layers, int resident) {
  if (resident < 0 || resident >= layers) return true;
  // Evenly spaced: layer l is resident when the count floor(l·R/L) steps up at it, so the copy
  // engine can run ahead while the GPU computes a resident layer.
  return (int64_t(layer) + 1) * resident / layers > int64_t(layer) * resident / layers;
}

int64_t gpu_kv_blocks(int64_t kv_blocks, double cpu_attention_share) {
  // The tolerance keeps a share such as 0.3 from rounding 7.000000000000001 blocks up to 8.
  return std::max<int64_t>(
      0, int64_t(std::ceil((1 - cpu_attention_share) * double(kv_blocks) - 1e-9)));
}

namespace {

// Multi-head latent attention: q and kv_a_proj_with_mqa on the GPU, kv_b_proj on the host with
// the attention; its q|k|v rows are q and the latent with the RoPE key (no v), its outputs
// heads·v_head_dim wide, its q-LoRA rows q_lora_rank.
size_t q_lora_rank(const ModelConfig& c) {
  return c.attention == AttentionKind::kLatent ? size_t(c.mla.q_lora_rank) : 0;
}

size_t qkv_row_values(const ModelConfig& c) {
  return c.attention == AttentionKind::kLatent
             ? size_t(c.q_dim()) + size_t(c.kv_cache_values_per_token())
             : size_t(c.q_dim()) + 2 * size_t(c.kv_dim());
}

// Q, K, V and O of every layer, each projection in bf16, or with FP8 weights its codes and block
// scales.
size_t attention_weight_bytes(const ModelConfig& c) {
  const size_t L = size_t(c.num_layers), H = size_t(c.hidden_size), qd = size_t(c.q_dim());
  const size_t kvd = size_t(c.kv_dim()), qa = q_lora_rank(c), ad = size_t(c.attn_out_dim());
  auto projection = [&](size_t rows, size_t cols) {
    return projection_bytes(c, int64_t(rows), int64_t(cols));
  };
  const size_t ckv = size_t(c.kv_cache_values_per_token());
  return L * (c.attention == AttentionKind::kLatent
                  ? (qa > 0 ? projection(qa, H) + projection(qd, qa) : projection(qd, H)) +
                        projection(ckv, H) + projection(H, ad)
                  : projection(qd, H) + 2 * projection(kvd, H) + projection(H, qd));
}

// The dense MLPs (shared experts, dense layers) with their gates, and what the executor places
// for them beside the weights.
struct DenseMlps {
  size_t bytes = 0;
  size_t widest = 0;   // intermediate size of the widest
  size_t tensors = 0;  // each aligned on its own
};

DenseMlps dense_mlps(const ModelConfig& c) {
  const size_t H = size_t(c.hidden_size);
  DenseMlps d;
  for (int l = 0; l < c.num_layers; ++l) {
    const size_t mlp = size_t(c.dense_mlp_size(l));
    const bool gated = c.is_moe_layer(l) && c.shared_expert_gate && mlp > 0;
    d.widest = std::max(d.widest, mlp);
    d.bytes += (mlp > 0 ? 2 * expert_matrix_bytes(c, int64_t(mlp), int64_t(H)) +
                              expert_matrix_bytes(c, int64_t(H), int64_t(mlp))
                        : 0) +
               (gated ? H * 2 : 0);
    d.tensors += (mlp > 0 ? 3 : 0) + (gated ? 1 : 0);
  }
  return d;
}

// Routers, norms, q/k norms, biases, q-LoRA norms, the final norm and the lm_head.
size_t router_norm_head_bytes(const ModelConfig& c) {
  const size_t L = size_t(c.num_layers), H = size_t(c.hidden_size), qd = size_t(c.q_dim());
  const size_t kvd = size_t(c.kv_dim()), E = size_t(c.num_experts), V = size_t(c.vocab_size);
  size_t moe_layers = 0;
  for (int l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l);
  const size_t biases = (c.qkv_bias ? qd + 2 * kvd : 0) + (c.o_bias ? H : 0);
  return moe_layers * E * H * 2 + L * 2 * H * 4 + H * 4 + V * H * 2 +
         L * size_t(c.q_norm_size() + c.k_norm_size()) * 4 + L * biases * 4 +
         L * q_lora_rank(c) * 4 + (c.router_selection_bias ? moe_layers * E * 4 : 0);
}

// The offload executor's step buffers (engine/offload_layout.h, BufferLayout) for the largest
// step: a prefill chunk plus a decode token of every other sequence. Per token: residual and
// normed rows, q/k/v and attention output (fp32), their bf16 copy, router logits, routing and
// per-expert row lists, and with CPU experts the rows' states to the host and their sums back.
// Per row of an expert GEMM on the device (Policy::device_expert_rows): its input, gate and up
// (fp32), activation (bf16), down (fp32).
// With a GPU share of attention, per token the CPU share's gathered q/k/v, the GPU share's
// gathered q, both shares' outputs and six row indices.
// Per sampled row: its final state and logits (the lm_head runs on the GPU). Plus cuBLASLt's
// 32 MiB workspace, which the CUDA math takes from the same budget, and with FP8 weights the
// bf16 tile the FP8 GEMMs dequantise row panels into (fp8_tile_elements).
size_t step_buffer_bytes(const ModelConfig& c, const Policy& p, const OffloadPlan& o,
                         const DenseMlps& mlps, bool gpu_attention) {
  const size_t L = size_t(c.num_layers), H = size_t(c.hidden_size), qd = size_t(c.q_dim());
  const size_t E = size_t(c.num_experts), V = size_t(c.vocab_size);
  const size_t I = size_t(c.expert_intermediate_size), k = size_t(c.experts_per_token);
  const size_t qa = q_lora_rank(c), ad = size_t(c.attn_out_dim()), qkv_row = qkv_row_values(c);
  const bool f32 = p.precision == Precision::kF32, cpu_experts = o.cpu_expert_max_tokens > 0;
  const size_t T = size_t(p.prefill_chunk + p.batch), be = size_t(p.device_expert_rows());
  // The experts' and the dense MLPs' GEMMs share the intermediate rows; a dense MLP's gate adds
  // one scale per token.
  const size_t per_token =
      H * 4 * 2 + (f32 ? 0 : std::max({H, qd, ad, qa}) * 2) + qkv_row * 4 + qa * 4 + ad * 4 +
      E * 4 + k * 8 * 2 + 4 + (cpu_experts ? H * 4 * 2 + 8 : 0) +
      (gpu_attention ? qkv_row * 4 + qd * 4 + ad * 4 + 6 * 4 : 0) + (mlps.widest > 0 ? 4 : 0);
  const size_t wide = std::max(I, mlps.widest);
  const size_t per_expert_row = H * (f32 ? 4 : 2) + wide * 4 * 2 + (f32 ? 0 : wide * 2) + H * 4;
  // The executor aligns each tensor and buffer to 256 bytes: 7 per layer (9 with q/k norms, and
  // one per bias, dense MLP matrix and gate) and some 30 others.
  const size_t per_layer = (c.qk_norm == QkNorm::kNone ? 7 : 9) + (c.qkv_bias ? 3 : 0) +
                           (c.o_bias ? 1 : 0) + (qa > 0 ? 3 : 0) +
                           (c.attention == AttentionKind::kLatent ? 1 : 0);
  const size_t alignment = (per_layer * L + mlps.tensors + 32 + (gpu_attention ? 6 : 0)) * 256;
  return T * per_token + be * per_expert_row + size_t(p.batch) * (H + V) * 4 + (size_t(32) << 20) +
         size_t(fp8_tile_elements(c)) * 2 + alignment;
}

}  // namespace

GpuMemoryUse gpu_memory_use(const ModelConfig& c, const Policy& p, const OffloadPlan& o) {
  GpuMemoryUse m;
  m.attention_weights = attention_weight_bytes(c);
  const DenseMlps mlps = dense_mlps(c);
  m.dense_mlps = mlps.bytes;
  m.router_norms_head = router_norm_head_bytes(c);
  const int resident = o.resident_expert_layers < 0 ? c.num_layers : o.resident_expert_layers;
  m.resident_experts = size_t(resident) * size_t(c.num_experts) * expert_weight_bytes(c);
  // The GPU share's KV pool (whole blocks, as the executor pages it) and its block tables.
  const size_t gpu_blocks = size_t(gpu_kv_blocks(p.kv_blocks, o.cpu_attention_share));
  m.kv_cache = gpu_blocks * (size_t(p.kv_block_size) * kv_bytes_per_token(c) + 4);
  if (resident < c.num_layers)
    m.page_slots =
        size_t(o.prefetch_depth) * size_t(pages_per_expert(c, o.page_bytes)) * o.page_bytes;
  m.step_buffers = step_buffer_bytes(c, p, o, mlps, gpu_blocks > 0);
  return m;
}

double pipeline_step_seconds(const TaskGraph& g) {
  double h2d = 0, d2h = 0;
  for (const Task& t : g.tasks()) {
    if (t.resource == Resource::kHostToDevice) h2d += t.seconds;
    if (t.resource == Resource::kDeviceToHost) d2h += t.seconds;
  }
  return std::max({g.critical_path_seconds(), h2d, d2h});
}

ResourceUse resource_use(const TaskGraph& g) {
  ResourceUse u;
  u.step_seconds = pipeline_step_seconds(g);
  for (const Task& t : g.tasks()) {
    switch (t.resource) {
      case Resource::kGpu:
        u.gpu_busy += t.seconds;
        break;
      case Resource::kCpu:
        u.cpu_busy += t.seconds;
        break;
      case Resource::kHostToDevice:
        u.h2d_busy += t.seconds, u.h2d_bytes += t.bytes;
        break;
      case Resource::kDeviceToHost:
        u.d2h_busy += t.seconds, u.d2h_bytes += t.bytes;
        break;
      case Resource::kDisk:
        break;
    }
  }
  if (u.step_seconds > 0)
    for (double* f : {&u.gpu_busy, &u.cpu_busy, &u.h2d_busy, &u.d2h_busy}) *f /= u.step_seconds;
  return u;
}

OffloadCostModel::OffloadCostModel(const HardwareProfile& profile, const ModelConfig& config,
                                   const Policy& policy, const OffloadPlan& plan)
    : cpu_(profile, config, policy), o_(plan) {
  if (!profile.gpu)
    fail("offload cost model: hardware profile: field 'gpu': expected a GPU section, got none");
  const GpuProfile& g = *profile.gpu;
  if (g.h2d_pinned_bytes_per_s <= 0 || g.d2h_pinned_bytes_per_s <= 0 || g.gemm.empty())
    fail(
        "offload cost model: hardware profile: field 'gpu': expected positive pinned H2D and D2H "
        "bandwidths and GEMM curves, got H2D {} B/s, D2H {} B/s, {} curves",
        g.h2d_pinned_bytes_per_s, g.d2h_pinned_bytes_per_s, g.gemm.size());
  if (!o_.gpu) fail("offload cost model: offload plan field 'gpu': expected true");
  if (o_.cpu_attention_share < 0 || o_.cpu_attention_share > 1)
    fail("offload plan: field 'cpu_attention_share': expected in [0, 1], got {}",
         o_.cpu_attention_share);
  if (o_.resident_expert_layers > config.num_layers)
    fail("offload plan: field 'resident_expert_layers': expected at most {} layers, got {}",
         config.num_layers, o_.resident_expert_layers);
  if (o_.page_bytes == 0 || o_.prefetch_depth < 1)
    fail("offload plan: fields 'page_bytes', 'prefetch_depth': expected > 0, got {} and {}",
         o_.page_bytes, o_.prefetch_depth);
}

double OffloadCostModel::gpu_memory_bytes_per_s() const {
  return gpu().memory_bytes_per_s > 0 ? gpu().memory_bytes_per_s : kAssumedGpuMemoryBytesPerS;
}

double OffloadCostModel::gpu_gemm_seconds(double m, int64_t n, int64_t k) const {
  return gpu().gemm_seconds(m, n, k);
}

double OffloadCostModel::gpu_weight_gemm_seconds(double m, int64_t n, int64_t k) const {
  const double gemm = gpu_gemm_seconds(m, n, k);
  if (!config().fp8_weights) return gemm;
  return gemm + 3.0 * double(n) * double(k) / gpu_memory_bytes_per_s() + kLaunchSeconds;
}

double OffloadCostModel::h2d_seconds(double bytes, double copies) const {
  return bytes / gpu().h2d_pinned_bytes_per_s + copies * kLaunchSeconds;
}

double OffloadCostModel::gpu_expert_probability(int T) const {
  double p = 0;
  for (auto [m, pm] : cpu_.tokens_per_expert_distribution(T))
    if (m > o_.cpu_expert_max_tokens && m > 0) p += pm;
  return p;
}

double OffloadCostModel::device_cache_hit() const {
  const ModelConfig& c = config();
  const int streamed = streamed_expert_layers(c, o_.resident_expert_layers);
  if (o_.cache_pages <= 0 || streamed == 0) return 0;
  const double kept = double(o_.cache_pages / pages_per_expert(c, o_.page_bytes));
  return std::min(1.0, kept / (double(c.num_experts) * streamed));
}

double OffloadCostModel::gpu_expert_seconds(int T) const {
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  const double bw = gpu_memory_bytes_per_s();
  double s = 0;
  for (auto [m, pm] : cpu_.tokens_per_expert_distribution(T)) {
    if (m == 0 || m <= o_.cpu_expert_max_tokens) continue;
    const double md = m;
    // gate and up, down; gather, SiLU·mul and scatter-add as three kernels.
    s += pm * (2 * gpu_weight_gemm_seconds(md, I, H) + gpu_weight_gemm_seconds(md, H, I) +
               (md * double(H) * 4 + md * double(I) * 12 + md * double(H) * 12) / bw +
               3 * kLaunchSeconds);
  }
  return s;
}

namespace {

// Adds tasks with their dependencies (-1: none). Named, it builds the TaskGraph; otherwise it
// only keeps finish times, the same dp as TaskGraph::finish_times without the tasks themselves
// (the planner's search evaluates thousands of steps).
class Builder {
 public:
  explicit Builder(bool named) : named_(named) {}
  int add(const Task& t, std::initializer_list<int> deps, const std::vector<int>& more = {},
          std::string name = {}) {
    if (!named_) {
      double start = 0;
      for (int d : deps)
        if (d >= 0) start = std::max(start, finish_[size_t(d)]);
      for (int d : more) start = std::max(start, finish_[size_t(d)]);
      finish_.push_back(start + t.seconds);
      if (t.resource == Resource::kHostToDevice) h2d_ += t.seconds;
      if (t.resource == Resource::kDeviceToHost) d2h_ += t.seconds;
      return int(finish_.size()) - 1;
    }
    Task named_task = t;
    named_task.name = std::move(name);
    for (int d : deps)
      if (d >= 0) named_task.deps.push_back(d);
    for (int d : more) named_task.deps.push_back(d);
    return graph_.add(std::move(named_task));
  }
  bool named() const { return named_; }
  TaskGraph take_graph() { return std::move(graph_); }
  // pipeline_step_seconds of what was added, without names.
  double step_seconds() const {
    const double path = finish_.empty() ? 0 : *std::max_element(finish_.begin(), finish_.end());
    return std::max({path, h2d_, d2h_});
  }

 private:
  bool named_;
  TaskGraph graph_;
  std::vector<double> finish_;
  double h2d_ = 0, d2h_ = 0;
};

Task make_task(Resource r, const char* group, double seconds, double bytes, double flops,
               Bound bound) {
  Task t;
  t.resource = r;
  t.group = group;
  t.seconds = seconds;
  t.bytes = bytes;
  t.flops = flops;
  t.bound = bound;
  return t;
}

// The costs of a step's tasks on this machine: GPU kernels over memory, GEMMs, and copies over
// the link.
class StepTaskCosts {
 public:
  explicit StepTaskCosts(const OffloadCostModel& m)
      : m_(m),
        bw(m.gpu_memory_bytes_per_s()),
        gpu_peak(std::max(m.gpu().gemm_peak_flops(), 1.0)),
        h2d_bw_(m.gpu().h2d_pinned_bytes_per_s),
        d2h_bw_(m.gpu().d2h_pinned_bytes_per_s) {}

  Task elementwise(const char* group, double bytes) const {
    return make_task(Resource::kGpu, group, bytes / bw + kLaunchSeconds, bytes, bytes / 4,
                     Bound::kMemory);
  }
  // A GEMM on bf16 weights (router, lm_head).
  Task gemm(const char* group, double m, int64_t n, int64_t k) const {
    return gemm_task(group, m, n, k, false);
  }
  // A GEMM on a projection of the checkpoint, which with FP8 weights first reads 1 byte and
  // writes 2 a weight into the bf16 tile.
  Task projection(const char* group, double m, int64_t n, int64_t k) const {
    return gemm_task(group, m, n, k, true);
  }
  Task copy(Resource r, const char* group, double bytes) const {
    return make_task(r, group,
                     bytes / (r == Resource::kHostToDevice ? h2d_bw_ : d2h_bw_) + kLaunchSeconds,
                     bytes, 0, Bound::kLink);
  }
  // Compute bound where the FLOPs take longer at the GEMM peak than the bytes at memory speed.
  Bound bound(double flops, double bytes) const {
    return flops / gpu_peak > bytes / bw ? Bound::kCompute : Bound::kMemory;
  }

 private:
  Task gemm_task(const char* group, double m, int64_t n, int64_t k, bool projection) const {
    const bool fp8 = projection && m_.config().fp8_weights;
    const double flops = 2.0 * m * double(n) * double(k);
    const double bytes =
        (fp8 ? 5.0 : 2.0) * double(n) * double(k) + m * double(k) * 2 + m * double(n) * 4;
    const double seconds =
        projection ? m_.gpu_weight_gemm_seconds(m, n, k) : m_.gpu_gemm_seconds(m, n, k);
    return make_task(Resource::kGpu, group, seconds, bytes, flops, bound(flops, bytes));
  }

  const OffloadCostModel& m_;

 public:
  const double bw, gpu_peak;  // device memory bytes/s, GEMM FLOP/s

 private:
  const double h2d_bw_, d2h_bw_;
};

// The tasks of one micro-batch, the same in every layer (the names are added per layer).
struct MicroBatchTasks {
  // GPU, in stream order: `route` in MoE layers only, `mlp_gate` where a shared expert is gated.
  std::vector<std::pair<const char*, Task>> in, out, route, mlp_gate;
  bool cpu_share = false;
  Task qkv_d2h, cpu_attention, out_h2d, routing_d2h;
};

constexpr const char* kNormsGroup = "GPU norms, RoPE, routing";
constexpr const char* kProjectionsGroup = "GPU attention projections";

// o_proj (its input `width` wide), the FFN norm, the router and top-k, the dense MLP's gate.
void add_outputs(const ModelConfig& c, const StepTaskCosts& k, MicroBatchTasks& t, double n,
                 int64_t width) {
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.experts_per_token;
  t.out.push_back({"o_proj", k.projection(kProjectionsGroup, n, H, width)});
  if (c.o_bias) t.out.push_back({"o_bias", k.elementwise(kNormsGroup, n * double(H) * 8)});
  t.out.push_back({"ffn_norm", k.elementwise(kNormsGroup, n * double(H) * 8)});
  t.route.push_back({"router", k.gemm(kNormsGroup, n, E, H)});
  t.route.push_back({"top_k", k.elementwise(kNormsGroup, n * double(E) * 4 + n * double(K) * 8)});
  // sigmoid(shared_expert_gate · h): a one-column GEMM and the sigmoid
  t.mlp_gate.push_back({"shared_expert_gate", k.gemm(kNormsGroup, n, 1, H)});
  t.mlp_gate.push_back({"sigmoid", k.elementwise(kNormsGroup, n * 8)});
  t.routing_d2h = k.copy(Resource::kDeviceToHost, "activation copies", n * double(K) * 8);
}

// Multi-head latent attention: q (through q-LoRA when the model has it) and the latent with its
// RoPE key projected on the GPU; everything else of the attention on the CPU (the latent norm,
// RoPE and cache write, the W_UK fold, the attention over the latent cache, the W_UV unfold);
// o_proj on the GPU.
void add_latent_attention(const OffloadCostModel& m, const StepTaskCosts& k, MicroBatchTasks& t,
                          const MicroBatchShape& mb) {
  const ModelConfig& c = m.config();
  const int64_t H = c.hidden_size, qd = c.q_dim(), ckv = c.kv_cache_values_per_token();
  const double n = mb.tokens;
  const LatentAttentionShape& a = c.mla;
  if (a.q_lora_rank > 0) {
    t.in.push_back({"q_a_proj", k.projection(kProjectionsGroup, n, a.q_lora_rank, H)});
    t.in.push_back({"q_a_norm", k.elementwise(kNormsGroup, n * double(a.q_lora_rank) * 8)});
    t.in.push_back({"q_b_proj", k.projection(kProjectionsGroup, n, qd, a.q_lora_rank)});
  } else {
    t.in.push_back({"q_proj", k.projection(kProjectionsGroup, n, qd, H)});
  }
  t.in.push_back({"kv_a_proj", k.projection(kProjectionsGroup, n, ckv, H)});
  t.cpu_share = true;  // all of it: MLA runs no GPU share
  t.qkv_d2h = k.copy(Resource::kDeviceToHost, "activation copies", n * double(qd + ckv) * 2);
  t.cpu_attention = m.cpu().attention_task("", mb);
  t.cpu_attention.group = "CPU attention (KV reads)";
  for (const Task& f :
       {m.cpu().gemm_task("", "", n, c.num_heads * a.kv_lora_rank, a.qk_nope_head_dim),
        m.cpu().gemm_task("", "", n, c.num_heads * a.v_head_dim, a.kv_lora_rank)}) {
    t.cpu_attention.seconds += f.seconds;
    t.cpu_attention.flops += f.flops;
    t.cpu_attention.bytes += f.bytes;
  }
  t.out_h2d =
      k.copy(Resource::kHostToDevice, "activation copies", n * double(c.attn_out_dim()) * 2);
  add_outputs(c, k, t, n, c.attn_out_dim());
}

// One micro-batch's attention tasks: the projections, norms and RoPE on the GPU, the GPU's share
// (1 − ω) of the attention over its KV pool, and the CPU's share with its copies.
MicroBatchTasks micro_batch_tasks(const OffloadCostModel& m, const StepTaskCosts& k,
                                  const MicroBatchShape& mb) {
  const ModelConfig& c = m.config();
  const int64_t H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  const double w = m.plan().cpu_attention_share, n = mb.tokens;
  MicroBatchTasks t;
  t.in.push_back({"attn_norm", k.elementwise(kNormsGroup, n * double(H) * 8)});
  if (c.attention == AttentionKind::kLatent) {
    add_latent_attention(m, k, t, mb);
    return t;
  }
  t.in.push_back({"q_proj", k.projection(kProjectionsGroup, n, qd, H)});
  t.in.push_back({"k_proj", k.projection(kProjectionsGroup, n, kvd, H)});
  t.in.push_back({"v_proj", k.projection(kProjectionsGroup, n, kvd, H)});
  const double qkv_bytes = n * double(qd + 2 * kvd) * 8;  // read and written once
  if (c.qkv_bias) t.in.push_back({"qkv_bias", k.elementwise(kNormsGroup, qkv_bytes)});
  if (c.qk_norm != QkNorm::kNone)
    t.in.push_back({"qk_norm", k.elementwise(kNormsGroup, n * double(qd + kvd) * 8)});
  if (c.clip_qkv > 0) t.in.push_back({"clip_qkv", k.elementwise(kNormsGroup, qkv_bytes)});
  t.in.push_back({"rope_kv_write", k.elementwise(kNormsGroup, n * double(qd + kvd) * 8 +
                                                                  n * double(kvd) * (8 + 4))});
  if (w < 1) {
    const double bytes = (1 - w) * mb.kv_positions * double(kvd) * 4;
    const double flops = (1 - w) * 4.0 * mb.qk_pairs * double(qd);
    const double memory = bytes / k.bw, compute = flops / (kGpuAttentionPeakFraction * k.gpu_peak);
    t.in.push_back(
        {"gpu_attention", make_task(Resource::kGpu, "GPU attention (KV reads)",
                                    std::max(memory, compute) + kLaunchSeconds, bytes, flops,
                                    compute > memory ? Bound::kCompute : Bound::kMemory)});
  }
  t.cpu_share = w > 0;
  if (t.cpu_share) {
    t.qkv_d2h =
        k.copy(Resource::kDeviceToHost, "activation copies", w * n * double(qd + 2 * kvd) * 2);
    t.cpu_attention = m.cpu().attention_task(
        "", MicroBatchShape{int(std::lround(w * n)), w * mb.kv_positions, w * mb.qk_pairs});
    t.cpu_attention.group = "CPU attention (KV reads)";
    t.out_h2d = k.copy(Resource::kHostToDevice, "activation copies", w * n * double(qd) * 2);
  }
  add_outputs(c, k, t, n, qd);
  return t;
}

// An expert's tasks over a step of T tokens, the same for every expert and layer in
// expectation: its pages' copy and GPU GEMMs when it has more than cpu_expert_max_tokens tokens
// (probability q_gpu), its CPU run otherwise, and the copy and add of the CPU experts' rows.
struct ExpertTasks {
  double q_gpu = 0, cpu_rows = 0;
  Task copy, gpu, cpu, cpu_rows_h2d, add_cpu_rows;
};

ExpertTasks expert_tasks(const OffloadCostModel& m, const StepTaskCosts& k, int T) {
  const ModelConfig& c = m.config();
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  const OffloadPlan& o = m.plan();
  ExpertTasks x;
  x.q_gpu = m.gpu_expert_probability(T);
  double flops = 0, weight_reads = 0;
  for (auto [tokens, pm] : m.cpu().tokens_per_expert_distribution(T)) {
    if (tokens == 0) continue;
    if (tokens > o.cpu_expert_max_tokens)
      flops += pm * 6.0 * tokens * double(H) * double(I),
          weight_reads += pm * double(expert_weight_bytes(c));
    else
      x.cpu_rows += pm * tokens;
  }
  const int pages = pages_per_expert(c, o.page_bytes);
  const double copied = x.q_gpu * (1 - m.device_cache_hit());
  const double copied_bytes = copied * double(expert_weight_bytes(c));
  x.copy = make_task(Resource::kHostToDevice, "expert weights",
                     m.h2d_seconds(copied_bytes, copied * pages), copied_bytes, 0, Bound::kLink);
  x.gpu = make_task(Resource::kGpu, "GPU expert GEMMs", m.gpu_expert_seconds(T), weight_reads,
                    flops, k.bound(flops, weight_reads));
  x.cpu = make_task(Resource::kCpu, "CPU experts", 0, 0, 0, Bound::kMemory);
  if (o.cpu_expert_max_tokens > 0)
    for (const Task& t : m.cpu().expert_tasks(0, T, 1, o.cpu_expert_max_tokens))
      x.cpu.seconds += t.seconds, x.cpu.bytes += t.bytes, x.cpu.flops += t.flops;
  const double rows = x.cpu_rows * double(c.num_experts);
  x.cpu_rows_h2d = k.copy(Resource::kHostToDevice, "activation copies", rows * double(H) * 4);
  x.add_cpu_rows = k.elementwise(kNormsGroup, rows * double(H) * 12);
  return x;
}

// A layer's dense MLP (shared expert or dense FFN, resident, mlp_I wide) over the step's T rows,
// as many rows per GEMM as the executor (Policy::device_expert_rows): gate and up, down,
// SiLU·mul and the scaled add into the residual.
Task dense_mlp_task(const OffloadCostModel& m, const StepTaskCosts& k, int T, int64_t mlp_I) {
  const int64_t H = m.config().hidden_size;
  const int be = m.policy().device_expert_rows();
  double seconds = 0, flops = 0, bytes = 0;
  for (int begin = 0; begin < T; begin += be) {
    const double rows = std::min(T - begin, be);
    seconds += 2 * m.gpu_weight_gemm_seconds(rows, mlp_I, H) +
               m.gpu_weight_gemm_seconds(rows, H, mlp_I) +
               (rows * double(mlp_I) * 12 + rows * double(H) * 12) / k.bw + 2 * kLaunchSeconds;
    flops += 6.0 * rows * double(mlp_I) * double(H);
    bytes += 3.0 * double(mlp_I) * double(H) * (m.config().fp8_weights ? 5 : 2);
  }
  return make_task(Resource::kGpu, "GPU dense MLP GEMMs", seconds, bytes, flops,
                   k.bound(flops, bytes));
}

// The step's task graph as it is built: the last task on each chain (the host's compute, the
// GPU's compute queue, the weight copy engine, the disk's reads) that the next task waits for.
class StepChains {
 public:
  StepChains(Builder& b, const StepTaskCosts& k) : b_(b), k_(k) {}

  // Embedding rows gathered on the host, copied to the device as the fp32 residual stream.
  void embed(const CpuCostModel& cpu, int T, int64_t H) {
    cpu_ =
        b_.add(cpu.elementwise_task("", "embedding, lm_head, sampling", double(T) * double(H) * 6),
               {}, {}, name("", "embed"));
    gpu_ = b_.add(k_.copy(Resource::kHostToDevice, "activation copies", double(T) * double(H) * 4),
                  {cpu_}, {}, name("", "embed_h2d"));
  }

  // Layer l's attention over its micro-batches: the GPU runs attention_in(i + 1) before
  // attention_out(i), so the CPU's share of micro-batch i overlaps the GPU's work on the next.
  // Returns, for an MoE layer, the tasks that bring each micro-batch's routing to the host.
  std::vector<int> attention(int l, const std::vector<MicroBatchTasks>& mbs, bool moe, bool gated) {
    const int M = int(mbs.size());
    std::vector<int> in_end(static_cast<size_t>(M)), routing;
    auto prefix = [&](int i) {
      return b_.named() ? fmt::format("layer{}.mb{}.", l, i) : std::string();
    };
    auto attention_in = [&](int i) {
      const std::string p = prefix(i);
      for (const auto& [what, t] : mbs[size_t(i)].in) gpu_ = b_.add(t, {gpu_}, {}, name(p, what));
      in_end[size_t(i)] = gpu_;
    };
    auto attention_out = [&](int i) {
      const MicroBatchTasks& t = mbs[size_t(i)];
      const std::string p = prefix(i);
      int cpu_out = -1;
      if (t.cpu_share) {
        const int down = b_.add(t.qkv_d2h, {in_end[size_t(i)]}, {}, name(p, "qkv_d2h"));
        cpu_ = b_.add(t.cpu_attention, {cpu_, down}, {}, name(p, "cpu_attention"));
        cpu_out = b_.add(t.out_h2d, {cpu_}, {}, name(p, "attn_out_h2d"));
      }
      bool first = true;
      for (const auto& [what, task] : t.out) {
        gpu_ = b_.add(task, {gpu_, first ? cpu_out : -1}, {}, name(p, what));
        first = false;
      }
      for (const auto& [what, task] : t.mlp_gate)
        if (gated) gpu_ = b_.add(task, {gpu_}, {}, name(p, what));
      if (!moe) return;  // a dense layer: no routing
      for (const auto& [what, task] : t.route) gpu_ = b_.add(task, {gpu_}, {}, name(p, what));
      routing.push_back(b_.add(t.routing_d2h, {gpu_}, {}, name(p, "routing_d2h")));
    };
    if (M > 0) attention_in(0);
    for (int i = 0; i < M; ++i) {
      if (i + 1 < M) attention_in(i + 1);
      attention_out(i);
    }
    return routing;
  }

  // Layer l's experts, once every micro-batch's routing is on the host. A streamed layer's reads
  // from disk (`reads`, none when the experts are in host memory) follow the previous layer's;
  // its first expert copy waits for them, and the copy of the j-th streamed expert for a free
  // slot: the GPU task of the (j − depth)-th.
  void experts(int l, int E, const ExpertTasks& x, std::vector<int> routing,
               const std::optional<Task>& reads, bool streamed, int depth, bool cpu_experts) {
    if (streamed && reads) {
      reads_ = b_.add(*reads, {reads_}, {}, name(layer_prefix(l), "expert_reads"));
      routing.push_back(reads_);
    }
    for (int e = 0; e < E; ++e) {
      const std::string p = b_.named() ? fmt::format("layer{}.expert{}.", l, e) : std::string();
      const std::vector<int>& after_routing = e == 0 ? routing : std::vector<int>{};
      if (x.q_gpu > 0) {
        int copied = -1;
        if (streamed) {
          const size_t j = streamed_gpu_expert_.size();
          const int slot_free = j >= size_t(depth) ? streamed_gpu_expert_[j - size_t(depth)] : -1;
          weights_ =
              b_.add(x.copy, {weights_, slot_free, e == 0 ? reads_ : -1}, {}, name(p, "pages_h2d"));
          copied = weights_;
        }
        gpu_ = b_.add(x.gpu, {gpu_, copied}, after_routing, name(p, "gpu"));
        if (streamed) streamed_gpu_expert_.push_back(gpu_);
      }
      if (cpu_experts) cpu_ = b_.add(x.cpu, {cpu_}, after_routing, name(p, "cpu"));
    }
    if (cpu_experts && x.cpu_rows > 0) {  // the CPU experts' rows go back and are added
      const std::string lp = layer_prefix(l);
      const int up = b_.add(x.cpu_rows_h2d, {cpu_}, {}, name(lp, "cpu_experts_h2d"));
      gpu_ = b_.add(x.add_cpu_rows, {gpu_, up}, {}, name(lp, "add_cpu_experts"));
    }
  }

  void dense_mlp(int l, const Task& mlp) {
    gpu_ = b_.add(mlp, {gpu_}, {}, name(layer_prefix(l), "dense_mlp"));
  }

  // The final norm and lm_head on the GPU over the S sampled rows, their logits to the host,
  // sampling there.
  void sample(const CpuCostModel& cpu, int S, int64_t H, int64_t V) {
    gpu_ = b_.add(k_.elementwise("embedding, lm_head, sampling", double(S) * double(H) * 16),
                  {gpu_}, {}, name("", "final_norm"));
    gpu_ =
        b_.add(k_.gemm("embedding, lm_head, sampling", S, V, H), {gpu_}, {}, name("", "lm_head"));
    const int logits =
        b_.add(k_.copy(Resource::kDeviceToHost, "activation copies", double(S) * double(V) * 4),
               {gpu_}, {}, name("", "logits_d2h"));
    b_.add(cpu.elementwise_task("", "embedding, lm_head, sampling", double(S) * double(V) * 8),
           {cpu_, logits}, {}, name("", "sampling"));
  }

 private:
  std::string name(const std::string& prefix, const char* what) const {
    return b_.named() ? prefix + what : std::string();
  }
  std::string layer_prefix(int l) const {
    return b_.named() ? fmt::format("layer{}.", l) : std::string();
  }

  Builder& b_;
  const StepTaskCosts& k_;
  int cpu_ = -1, gpu_ = -1, weights_ = -1, reads_ = -1;
  std::vector<int> streamed_gpu_expert_;  // GPU task of each streamed expert, in order
};

// Every task of the step, as the executor runs it (the header says how).
void build_step(const OffloadCostModel& m, const StepShape& step, Builder& b) {
  const ModelConfig& c = m.config();
  const OffloadPlan& o = m.plan();
  const StepTaskCosts k(m);
  std::vector<MicroBatchTasks> mbs;  // computed once for all layers
  for (const MicroBatchShape& mb : step.micro_batches) mbs.push_back(micro_batch_tasks(m, k, mb));
  const int T = step.tokens();
  const ExpertTasks x = expert_tasks(m, k, T);
  // With the experts on disk: a streamed layer's reads into the host page pool, on the pool's
  // own thread, one layer after another (the CPU engine's model of them). A resident layer's
  // experts were read at start-up.
  const std::optional<Task> reads = m.cpu().disk_read_task(T, m.device_cache_hit());
  StepChains chains(b, k);
  chains.embed(m.cpu(), T, c.hidden_size);
  for (int l = 0; l < c.num_layers; ++l) {
    const bool moe = c.is_moe_layer(l);
    const int64_t mlp_I = c.dense_mlp_size(l);
    const std::vector<int> routing =
        chains.attention(l, mbs, moe, moe && mlp_I > 0 && c.shared_expert_gate);
    if (moe)
      chains.experts(l, c.num_experts, x, routing, reads,
                     !layer_resident(l, c.num_layers, o.resident_expert_layers), o.prefetch_depth,
                     o.cpu_expert_max_tokens > 0);
    if (mlp_I > 0) chains.dense_mlp(l, dense_mlp_task(m, k, T, mlp_I));
  }
  if (step.sampled > 0) chains.sample(m.cpu(), step.sampled, c.hidden_size, c.vocab_size);
}

}  // namespace

TaskGraph OffloadCostModel::build(const StepShape& step, bool named) const {
  Builder b(named);
  build_step(*this, step, b);
  return b.take_graph();
}

double OffloadCostModel::step_seconds(const StepShape& step) const {
  Builder b(false);
  build_step(*this, step, b);
  return b.step_seconds();
}

TaskGraph OffloadCostModel::step_graph(const StepShape& step) const {
  return build(step, true);
}

}  // namespace sluice
