#include "engine/offload_executor.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>

#include "core/clock.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/disk_expert_pages.h"
#include "engine/host_attention.h"
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
#include "runtime/offload/host_array.h"
#include "runtime/offload/step_pipeline.h"
#include "runtime/planner/layer_resident.h"
#include "runtime/planner/offload_cost_model.h"

namespace sluice {

namespace {

size_t free_bytes(const offload::Device& d) {
  const offload::MemoryBudget& b = d.budget();
  return b.budget() - std::min(b.used(), b.budget());
}

// LmHeadPlace::kAuto decided: on the device when the budget holds it beside the rest at the
// fewest slots (or the slots asked for), else on the host.
OffloadSettings place_lm_head(const ModelConfig& c, const Policy& p, OffloadSettings s,
                              size_t free) {
  if (s.lm_head != LmHeadPlace::kAuto) return s;
  s.lm_head = LmHeadPlace::kDevice;
  const OffloadFootprint f = offload_footprint(c, p, s);
  const int slots = f.min_slots == 0 ? 0 : std::max(f.min_slots, s.page_slots);
  if (f.with_slots(slots) > free) {
    spdlog::info(
        "offload executor: the lm_head ({}) does not fit the device budget beside the rest; it "
        "runs on the host",
        human_bytes(double(f.lm_head)));
    s.lm_head = LmHeadPlace::kHost;
  }
  return s;
}

}  // namespace

struct OffloadExecutor::Impl final : offload::StepOps {
  const ModelConfig& c;
  const ModelWeights& w;
  PagedKvCache& kv;
  offload::Device& dev;
  offload::DeviceMath& math;
  OffloadSettings settings;
  BufferShape sh;
  BufferLayout buf;
  std::vector<LayerResident> res;
  std::vector<float> latent_inv_freq;  // MLA's RoPE table (rope_inv_freq), used on the host
  size_t inv_freq_at = 0, resident_bytes = 0;
  char* resident = nullptr;  // device
  char* buffers = nullptr;   // device
  // The GPU share of attention: the device KV pool's memory, and its books (block tables by
  // scheduler slot), kept by the scheduler: a sequence in `device_kv` is in the GPU share.
  DeviceKvLayout kv_layout;
  char* kv_pool = nullptr;                  // device
  const PagedKvCache* device_kv = nullptr;  // null without a GPU share
  // The step's rows of each share per micro-batch, and the CPU share's items.
  std::vector<int> mb_gpu, mb_cpu;
  std::vector<std::vector<HostAttentionItem>> cpu_items;
  offload::HostArray<int32_t> h_index;  // AttentionIndex arrays, then the block tables
  // Experts of the resident layers (device); expert_layer_index[l]: the layer's index among the
  // resident ones, -1 when its experts stream.
  int resident_layers = 0;
  std::vector<int> expert_layer_index;
  size_t resident_experts_size = 0;
  char* resident_experts = nullptr;
  // The lm_head and final norm on the device (null: on the host).
  LmHeadLayout lm_layout;
  char* lm_head = nullptr;
  offload::HostArray<float> h_logits;  // the sampled rows' logits, back from the device
  std::unique_ptr<offload::PageSlots> slots;
  int copy_window = 0;  // slots copies run ahead into; the others keep pages (0: every slot)
  std::vector<offload::WeightPage> pages;
  std::vector<offload::LayerPages> layer_pages;
  // The streamed experts' matrices in host memory (empty with the experts on disk), checked once
  // in build_pages: the CPU experts read them. Index: layer · E + expert.
  std::vector<ExpertMatrices> host_matrices;
  // The disk tier (null: the experts are in host memory): its pool lends the streamed experts'
  // pages and the CPU experts' weights, and filled the resident layers' experts at start-up.
  DiskExperts* disk = nullptr;
  std::unique_ptr<DiskExpertPages> disk_pages;

  // The step being run (valid during run_layers).
  const StepPlan* plan = nullptr;
  std::vector<int> mb_row;  // micro-batch m covers rows [mb_row[m], mb_row[m + 1])
  std::span<const int> item_row;
  EngineStats* stats = nullptr;
  double to_device_bytes = 0, to_host_bytes = 0;

  // Host mirrors of the transferred blocks (same layout as on the device), in memory the device
  // copies at full speed (pinned on CUDA): h_x and h_final stage the engine's own buffers.
  offload::HostArray<float> h_x, h_final, h_qkv, h_attn;
  offload::HostArray<char> h_routing, h_lists, h_cpu_block;
  offload::HostArray<int32_t> h_positions, h_sample_rows;
  // Host ranges of the streamed weights page-locked in place (registered), for teardown.
  std::vector<const void*> registered;
  size_t registered_bytes = 0;
  // Expert lists of the layer being run: rows and weights concatenated by expert. Read by the
  // expert work on the compute queue; the host rewrites them only for the next layer, after the
  // routing of that layer arrived, which the compute queue produced after this layer's experts.
  std::vector<int> list_begin, list_count;
  std::vector<const float*> row_hidden;  // host: each row's FFN-normed state (CPU experts)
  int cpu_rows = 0;                      // rows in the CPU experts' block of this layer
  // Host scratch of the CPU experts.
  std::vector<float> c_exf, c_gate, c_up, c_act, c_down, c_out;
  std::vector<uint16_t> c_exb;
  std::vector<int> c_slot;  // row -> index in c_out, -1 when untouched

  template <typename T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(buffers + offset);
  }
  template <typename T>
  const T* weight(size_t offset) const {
    return reinterpret_cast<const T*>(resident + offset);
  }
  int micro_batches() const override { return int(mb_row.size()) - 1; }

  Impl(const ModelConfig& config, const ModelWeights& weights, const Policy& p, PagedKvCache& cache,
       const PagedKvCache* device_cache, const EngineDevice& d, DiskExperts* disk_experts)
      : c(config),
        w(weights),
        kv(cache),
        dev(*d.device),
        math(*d.math),
        settings(place_lm_head(config, p, d.settings, free_bytes(*d.device))),
        sh(config, p, settings),
        buf(sh),
        kv_layout(config, p, sh.gpu_kv_blocks),
        device_kv(device_cache),
        lm_layout(config),
        disk(disk_experts) {
    if (c.expert_quant.quantized() && !math.supports_quantized_experts())
      fail(
          "offload executor: the {} device math has no kernel for quantized expert weights "
          "(--expert-dtype {}); run them with --device cpu or --device standin, or use "
          "--expert-dtype bf16",
          math.name(), expert_dtype_name(c.expert_quant.dtype));
    if (c.attention == AttentionKind::kLatent && sh.gpu_attention())
      fail(
          "offload executor: field 'cpu_attention_share': multi-head latent attention runs on the "
          "host only (its latent cache and absorbed-form kernel are the CPU's); expected 1 or not "
          "set, got {}",
          d.settings.cpu_attention_share);
    if (c.attention == AttentionKind::kLatent) latent_inv_freq = rope_inv_freq(c);
    const int64_t books = device_kv ? device_kv->total_blocks() : 0;
    if (books != sh.gpu_kv_blocks ||
        (device_kv && device_kv->config().block_size != kv.config().block_size))
      fail(
          "offload executor: field 'device_kv': expected the books of a device KV pool of {} "
          "blocks of {} tokens (device_kv_config), got {} blocks",
          sh.gpu_kv_blocks, kv.config().block_size, books);
    const OffloadFootprint f = offload_footprint(c, p, settings);
    const offload::MemoryBudget& b = dev.budget();
    const size_t free = free_bytes(dev);
    if (free < f.minimum())
      fail(
          "--gpu-mem: the offload executor needs at least {} ({} bytes) of device memory: {} "
          "resident attention, router and dense MLP weights, {} resident experts of {} layers, {} "
          "lm_head, "
          "{} step buffers for {} tokens, {} KV pool of {} blocks (the GPU share of attention), "
          "and {} expert page slots of {}; the device budget has "
          "{} ({} bytes) free. Raise --gpu-mem to at least {}, or lower --batch, "
          "--prefill-chunk, --expert-batch or --resident-expert-layers",
          human_bytes(double(f.minimum())), f.minimum(), human_bytes(double(f.resident)),
          human_bytes(double(f.resident_experts)), f.resident_layers,
          human_bytes(double(f.lm_head)), human_bytes(double(f.buffers)), sh.T,
          human_bytes(double(f.kv_pool)), sh.gpu_kv_blocks, f.min_slots,
          human_bytes(double(f.page_bytes)), human_bytes(double(free)), free,
          human_bytes(double(f.minimum() + b.used())));
    resident_layers = f.resident_layers;
    for (int l = 0, j = 0; l < c.num_layers; ++l)
      expert_layer_index.push_back(layer_resident(l, c.num_layers, resident_layers) ? j++ : -1);
    int n_slots = settings.page_slots;
    if (f.min_slots == 0) {
      n_slots = 0;  // every layer's experts are resident: nothing streams
    } else if (n_slots == 0) {
      // Up to two layers' experts: the next layer's pages keep streaming while this layer waits
      // for its attention and routing (the CPU's share of the step), so the link does not idle.
      const size_t room = (free - f.fixed()) / f.page_bytes;
      n_slots = int(std::min<size_t>(room, size_t(6) * sh.E));
    }
    if (n_slots < f.min_slots || f.with_slots(n_slots) > free)
      fail(
          "offload executor: field 'page_slots': {} slots of {} do not fit: expected {} to {} "
          "slots in the {} of device memory free",
          n_slots, human_bytes(double(f.page_bytes)), f.min_slots,
          (free - f.fixed()) / f.page_bytes, human_bytes(double(free)));
    resident_bytes = resident_layout(c, &res, &inv_freq_at);
    resident_experts_size = f.resident_experts;
    try {
      resident = static_cast<char*>(dev.allocate(resident_bytes, "resident weights"));
      if (resident_experts_size > 0)
        resident_experts =
            static_cast<char*>(dev.allocate(resident_experts_size, "resident experts"));
      if (sh.lm_head) lm_head = static_cast<char*>(dev.allocate(lm_layout.bytes, "lm_head"));
      buffers = static_cast<char*>(dev.allocate(buf.bytes, "step buffers"));
      if (kv_layout.bytes > 0)
        kv_pool = static_cast<char*>(dev.allocate(kv_layout.bytes, "KV pool"));
      const int cache_slots = cache_slot_count(f, n_slots, free);
      copy_window = cache_slots > 0 ? n_slots : 0;
      slots = std::make_unique<offload::PageSlots>(dev, f.page_bytes, n_slots + cache_slots);
      if (disk) {
        disk_pages = std::make_unique<DiskExpertPages>(dev, *disk, sh.E);
        std::vector<bool> on_device;
        for (int j : expert_layer_index) on_device.push_back(j >= 0);
        disk->set_device_resident(std::move(on_device));
      }
      upload_resident();
      build_pages();
      if (disk) disk->set_kept_on_device([this](int l, int e) { return kept_on_device(l, e); });
      register_streamed_weights();
      allocate_host_buffers();
    } catch (...) {
      settle_and_release();
      throw;
    }
  }

  // Whether the device slots hold every page of expert e of layer l from an earlier step (it will
  // likely be taken from them: the slot to overwrite is the one whose page is needed again last).
  bool kept_on_device(int l, int e) const {
    const std::vector<int>& ids = layer_pages[size_t(l)].experts[size_t(e)];
    if (ids.empty()) return false;
    for (int id : ids)
      if (!slots->holds(uint64_t(id) + 1)) return false;
    return true;
  }

  // Slots beyond the `window` copies run ahead into, which only keep pages from step to step
  // (the device half of the expert cache): as many as asked (OffloadSettings::cache_pages), or
  // default_cache_pages (runtime/planner/offload_cost_model.h), as the planner counts them. None
  // on a device whose memory is the host's (the stand-in) unless asked.
  int cache_slot_count(const OffloadFootprint& f, int window, size_t free) const {
    const int asked = settings.cache_pages;
    if (window == 0 || asked == 0 || (asked < 0 && dev.memory_is_host())) return 0;
    if (asked > 0) {
      if (f.with_slots(window + asked) > free)
        fail(
            "--device-cache-pages: {} cached pages of {} do not fit beside {} slots and the rest "
            "({} in all) in the {} of device memory free",
            asked, human_bytes(double(f.page_bytes)), window,
            human_bytes(double(f.with_slots(window + asked))), human_bytes(double(free)));
      return asked;
    }
    const int64_t streamed = 3 * int64_t(sh.E) * streamed_expert_layers(c, resident_layers);
    return default_cache_pages(free, f.with_slots(window), f.page_bytes, streamed, window);
  }

  // Host buffers of every block that crosses the link, and the CPU experts' scratch.
  void allocate_host_buffers() {
    offload::Device& D = dev;
    const size_t T = size_t(sh.T), H = size_t(sh.H);
    h_x = {D, T * H, "staged embeddings"};
    h_final = {D, size_t(sh.S) * H, "staged final rows"};
    h_qkv = {D, T * size_t(sh.qkv_row()), "q/k/v to the host"};
    h_attn = {D, T * size_t(sh.ad), "attention output to the device"};
    h_routing = {D, T * sh.routing_row(), "routing to the host"};
    h_lists = {D, T * size_t(sh.K) * 8, "expert lists to the device"};
    h_positions = {D, T, "positions to the device"};
    h_sample_rows = {D, size_t(sh.S), "sample rows to the device"};
    if (sh.lm_head) h_logits = {D, size_t(sh.S) * size_t(sh.V), "logits to the host"};
    if (sh.gpu_attention())
      h_index = {D, T * kAttentionIndexArrays + size_t(sh.gpu_kv_blocks),
                 "attention row indices to the device"};
    list_begin.resize(size_t(sh.E));
    list_count.resize(size_t(sh.E));
    if (sh.cpu_experts) {
      h_cpu_block = {D, T * (8 + H * 4), "CPU experts' rows to the device"};
      c_out.resize(size_t(sh.T) * sh.H);
      c_slot.assign(size_t(sh.T), -1);
      c_exf.resize(sh.f32 ? size_t(sh.be) * sh.H : 0);
      c_exb.resize(sh.f32 ? 0 : size_t(sh.be) * sh.H);
      c_act.resize(size_t(sh.be) * sh.I);
      c_gate.resize(size_t(sh.be) * sh.I);
      c_up.resize(size_t(sh.be) * sh.I);
      c_down.resize(size_t(sh.be) * sh.H);
    }
  }

  ~Impl() override { settle_and_release(); }

  // Waits for every queue (no queued copy or work may still use the memory released below: a
  // failed upload leaves copies in flight), then releases.
  void settle_and_release() {
    try {
      dev.synchronize_all();
    } catch (const std::exception&) {
      // A failed step has already reported its error; the memory goes back all the same.
    }
    release();
  }

  void release() {
    for (const void* p : registered) dev.unregister_host(p);
    registered.clear();
    if (disk) disk->set_kept_on_device({});  // it reads the slots, and this executor
    slots.reset();
    if (kv_pool) dev.deallocate(kv_pool, kv_layout.bytes);
    if (buffers) dev.deallocate(buffers, buf.bytes);
    if (lm_head) dev.deallocate(lm_head, lm_layout.bytes);
    if (resident_experts) dev.deallocate(resident_experts, resident_experts_size);
    if (resident) dev.deallocate(resident, resident_bytes);
    buffers = resident = resident_experts = lm_head = kv_pool = nullptr;
  }

  // Resident weights go up once, on the weights queue; the host waits for them here. The
  // resident experts and the lm_head are copied from pageable memory (staged, once).
  void upload_resident() {
    const size_t H = size_t(c.hidden_size);
    auto up_to = [&](char* base, size_t offset, const Tensor& t, size_t bytes, const char* what) {
      if (t.nbytes() != bytes)
        fail("offload executor: tensor '{}': expected {} bytes, got {}", what, bytes, t.nbytes());
      dev.copy_to_device(offload::Queue::kWeights, base + offset, t.data, bytes, what);
    };
    auto up = [&](size_t offset, const Tensor& t, size_t bytes, const char* what) {
      up_to(resident, offset, t, bytes, what);
    };
    upload_resident_experts();
    if (lm_head) {
      up_to(lm_head, lm_layout.lm_head, w.lm_head, size_t(sh.V) * H * 2, "lm_head");
      up_to(lm_head, lm_layout.final_norm, w.final_norm, H * 4, "final_norm");
    }
    for (int l = 0; l < c.num_layers; ++l) {
      const LayerWeights& L = w.layers[size_t(l)];
      const LayerResident& r = res[size_t(l)];
      up(r.attn_norm, L.attn_norm, H * 4, "attn_norm");
      up(r.ffn_norm, L.ffn_norm, H * 4, "ffn_norm");
      auto matrix = [&](size_t offset, const Tensor& t, int64_t n, int64_t k, const char* what) {
        upload_projection(resident + offset, t, n, k, fmt::format("layer {} {}", l, what));
      };
      if (c.attention == AttentionKind::kLatent) {
        upload_latent_projections(L, r, matrix);
        if (sh.qa > 0) up(r.q_a_norm, L.q_a_norm, size_t(sh.qa) * 4, "q_a_layernorm");
      } else {
        matrix(r.wq, L.wq, sh.qd, sh.H, "q_proj");
        matrix(r.wk, L.wk, sh.kvd, sh.H, "k_proj");
        matrix(r.wv, L.wv, sh.kvd, sh.H, "v_proj");
      }
      matrix(r.wo, L.wo, sh.H, sh.ad, "o_proj");
      if (r.moe) up(r.router, L.router, size_t(sh.E) * H * 2, "router");
      if (r.moe && c.router_selection_bias)
        up(r.router_bias, L.router_bias, size_t(sh.E) * 4, "e_score_correction_bias");
      if (!L.q_norm.empty()) up(r.q_norm, L.q_norm, size_t(c.q_norm_size()) * 4, "q_norm");
      if (!L.k_norm.empty()) up(r.k_norm, L.k_norm, size_t(c.k_norm_size()) * 4, "k_norm");
      if (r.qkv_bias) {
        up(r.bq, L.bq, size_t(sh.qd) * 4, "q_proj.bias");
        up(r.bk, L.bk, size_t(sh.kvd) * 4, "k_proj.bias");
        up(r.bv, L.bv, size_t(sh.kvd) * 4, "v_proj.bias");
      }
      if (r.o_bias) up(r.bo, L.bo, H * 4, "o_proj.bias");
      if (r.mlp_I > 0 && fp8_experts()) {
        matrix(r.mlp_gate, L.mlp_gate, r.mlp_I, sh.H, "mlp gate_proj");
        matrix(r.mlp_up, L.mlp_up, r.mlp_I, sh.H, "mlp up_proj");
        matrix(r.mlp_down, L.mlp_down, sh.H, r.mlp_I, "mlp down_proj");
      } else if (r.mlp_I > 0) {
        const int64_t I = r.mlp_I, Hs = int64_t(H);
        up(r.mlp_gate, L.mlp_gate, expert_matrix_bytes(c, I, Hs), "mlp gate_proj");
        up(r.mlp_up, L.mlp_up, expert_matrix_bytes(c, I, Hs), "mlp up_proj");
        up(r.mlp_down, L.mlp_down, expert_matrix_bytes(c, Hs, I), "mlp down_proj");
      }
      if (r.mlp_scaled) up(r.mlp_scale, L.mlp_scale, H * 2, "shared_expert_gate");
    }
    const std::vector<float> inv_freq = cpu::rope_inv_freq(c.head_dim, c.rope_theta);
    dev.copy_to_device(offload::Queue::kWeights, resident + inv_freq_at, inv_freq.data(),
                       inv_freq.size() * 4, "rope inv_freq");
    dev.synchronize(dev.record(offload::Queue::kWeights));
  }

  // The resident layers' experts, from host memory or read from disk through the pool (one
  // expert at a time, each released once its copies are done).
  void upload_resident_experts() {
    for (int l = 0; l < c.num_layers; ++l) {
      const int j = expert_layer_index[size_t(l)];
      if (j < 0 || !res[size_t(l)].moe) continue;  // streamed, or a dense layer (no experts)
      for (int e = 0; e < sh.E; ++e) {
        const ExpertMatrices x = disk ? disk->acquire_one(l, e) : host_expert(l, e);
        for (int m = 0; m < 3; ++m) {
          char* dst = resident_experts + resident_expert_offset(c, j, m, e);
          const std::string what = fmt::format("layer {} expert {} matrix {}", l, e, m);
          if (fp8_experts()) {
            const size_t scale_bytes = fp8_scale_bytes(m);
            dev.copy_to_device(offload::Queue::kWeights, dst, x.block_scales[size_t(m)],
                               scale_bytes, what);
            dst += scale_bytes;
          }
          dev.copy_to_device(offload::Queue::kWeights, dst, x.weights[size_t(m)], value_bytes(m),
                             what);
        }
        if (!disk) continue;
        dev.synchronize(dev.record(offload::Queue::kWeights));
        disk->release_one(l, e);
      }
    }
  }

  // Expert e of layer l as the host holds it: its gate, up and down (bf16, packed quantized, or
  // FP8 codes with their block scales), checked against the sizes the device expects.
  ExpertMatrices host_expert(int l, int e) const {
    const LayerWeights& L = w.layers[size_t(l)];
    const Tensor* slots3[] = {&L.expert_gate, &L.expert_up, &L.expert_down};
    ExpertMatrices x;
    for (int m = 0; m < 3; ++m) {
      const auto [n, k] = expert_matrix_shape(m);
      const std::string what = fmt::format("layer {} expert {} matrix {}", l, e, m);
      if (c.expert_quant.quantized()) {
        x.weights[size_t(m)] = quant_matrix(c, *slots3[m], n, k, e).data;
        continue;
      }
      const Tensor matrix = slots3[m]->slice0(e);
      if (fp8_experts()) {
        x.block_scales[size_t(m)] = static_cast<const float*>(fp8_parts(matrix, n, k, what).first);
      } else if (matrix.nbytes() != matrix_bytes(m)) {
        fail("offload executor: tensor '{}': expected {} bytes, got {}", what, matrix_bytes(m),
             matrix.nbytes());
      }
      x.weights[size_t(m)] = matrix.data;
    }
    return x;
  }

  // Bytes of an expert's matrix m without FP8 block scales: an FP8 matrix's codes, else
  // matrix_bytes(m).
  size_t value_bytes(int m) const {
    const auto [n, k] = expert_matrix_shape(m);
    return fp8_experts() ? size_t(n * k) : matrix_bytes(m);
  }

  // Bytes of the block scales of an FP8 expert's matrix m.
  size_t fp8_scale_bytes(int m) const {
    const auto [n, k] = expert_matrix_shape(m);
    return size_t(shape_numel(fp8_scale_shape(n, k))) * 4;
  }

  // MLA's projections: q_proj, or q_a_proj and q_b_proj; kv_a_proj_with_mqa. `matrix` uploads
  // a projection (upload_projection).
  template <typename Matrix>
  void upload_latent_projections(const LayerWeights& L, const LayerResident& r, Matrix matrix) {
    if (sh.qa > 0) {
      matrix(r.q_a, L.q_a, sh.qa, sh.H, "q_a_proj");
      matrix(r.q_b, L.q_b, sh.qd, sh.qa, "q_b_proj");
    } else {
      matrix(r.wq, L.wq, sh.qd, sh.H, "q_proj");
    }
    matrix(r.kv_a, L.kv_a, sh.kvd, sh.H, "kv_a_proj_with_mqa");
  }

  // Whether the device holds the attention projections in FP8, and the experts and dense MLPs
  // (unless they are quantized, which the CPU does from the dequantised weights at load).
  bool fp8_projections() const { return c.fp8_weights; }
  bool fp8_experts() const { return c.fp8_weights && !c.expert_quant.quantized(); }

  // A projection n × k to `dst`: bf16 as it is, or with FP8 weights in fp8_device_matrix's form.
  void upload_projection(char* dst, const Tensor& t, int64_t n, int64_t k,
                         const std::string& what) {
    if (fp8_projections()) return upload_fp8(dst, t, n, k, what);
    const size_t bytes = size_t(n) * size_t(k) * 2;
    if (t.dtype != DType::BF16 || t.nbytes() != bytes)
      fail("offload executor: tensor '{}': expected BF16 [{}, {}] ({} bytes), got {} {}", what, n,
           k, bytes, dtype_name(t.dtype), shape_str(t.shape));
    dev.copy_to_device(offload::Queue::kWeights, dst, t.data, bytes, what);
  }

  // An FP8 matrix n × k to `dst` as fp8_device_matrix reads it: its block scales, then its
  // codes, both as the host holds them (1 byte per weight).
  void upload_fp8(char* dst, const Tensor& t, int64_t n, int64_t k, const std::string& what) {
    const auto [scales, scale_bytes] = fp8_parts(t, n, k, what);
    dev.copy_to_device(offload::Queue::kWeights, dst, scales, scale_bytes, what);
    dev.copy_to_device(offload::Queue::kWeights, dst + scale_bytes, t.data, size_t(n * k), what);
  }

  // The block scales of FP8 matrix `t` and their bytes, checked: config.json declares FP8
  // weights, so the device holds this projection in FP8 and expects it so.
  std::pair<const void*, size_t> fp8_parts(const Tensor& t, int64_t n, int64_t k,
                                           const std::string& what) const {
    const size_t scale_bytes = size_t(shape_numel(fp8_scale_shape(n, k))) * 4;
    if (t.dtype != DType::F8_E4M3 || t.numel() != n * k || !t.block_scales ||
        t.block_scales->nbytes() != scale_bytes)
      fail(
          "offload executor: tensor '{}': expected F8_E4M3 [{}, {}] with {} F32 block scales "
          "(config.json's quantization_config declares FP8 weights, which the device holds as "
          "they are), got {} {}{}",
          what, n, k, shape_str(fp8_scale_shape(n, k)), dtype_name(t.dtype), shape_str(t.shape),
          t.block_scales ? " with scales " + shape_str(t.block_scales->shape) : " without scales");
    return {t.block_scales->data, scale_bytes};
  }

  // Page-locks the host memory of every streamed expert matrix, so each page's copy is a direct
  // DMA at full link speed that overlaps with compute (a copy from pageable memory is staged
  // through a driver buffer and blocks the host). The tensors' ranges are widened to whole OS
  // pages and merged, since a page can be registered once. If the device cannot pin them, the
  // run goes on with slower, staged copies.
  void register_streamed_weights() {
    const size_t os_page = size_t(sysconf(_SC_PAGESIZE));
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    auto add_range = [&](const void* data, size_t bytes) {
      const auto begin = reinterpret_cast<uintptr_t>(data);
      ranges.push_back(
          {begin / os_page * os_page, (begin + bytes + os_page - 1) / os_page * os_page});
    };
    if (disk) add_range(disk->memory(), disk->memory_bytes());  // the pool lends the pages
    for (int l = 0; l < c.num_layers && !disk; ++l) {
      if (expert_layer_index[size_t(l)] >= 0) continue;  // copied once, never streamed
      const LayerWeights& L = w.layers[size_t(l)];
      for (const Tensor* t : {&L.expert_gate, &L.expert_up, &L.expert_down}) {
        if (t->empty()) continue;  // a dense layer
        // FP8 experts stream their block scales with their codes.
        for (const Tensor* part : {t, t->block_scales.get()})
          if (part) add_range(part->data, part->nbytes());
      }
    }
    if (ranges.empty()) return;
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uintptr_t, uintptr_t>> merged;
    for (auto r : ranges)
      if (!merged.empty() && r.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    size_t total = 0;
    for (auto [b, e] : merged) total += e - b;
    const auto t0 = Clock::now();
    for (auto [b, e] : merged) {
      const auto* p = reinterpret_cast<const void*>(b);
      if (!dev.register_host(p, e - b)) {
        spdlog::warn(
            "{}: could not page-lock the {} of streamed expert weights ({} of them pinned): "
            "their copies will be staged and slower, and will not overlap with compute",
            dev.name(), human_bytes(double(total)), human_bytes(double(registered_bytes)));
        return;
      }
      registered.push_back(p);
      registered_bytes += e - b;
    }
    spdlog::info("{}: page-locked {} of streamed expert weights in {} ranges in {:.1f} s",
                 dev.name(), human_bytes(double(registered_bytes)), merged.size(),
                 seconds_since(t0));
  }

  // Every expert matrix is one page (an FP8 one: its block scales, then its codes, in
  // fp8_device_matrix's form); a step streams the streamed layers' experts in order.
  // A resident layer's experts have no pages (gpu_expert finds their weights itself), so the
  // copies of the next streamed layer run ahead while it computes.
  void build_pages() {
    for (int l = 0; l < c.num_layers; ++l) {
      offload::LayerPages lp;
      if (!res[size_t(l)].moe) {  // a dense layer: no experts
        layer_pages.push_back(std::move(lp));
        continue;
      }
      if (expert_layer_index[size_t(l)] >= 0) {
        lp.experts.resize(size_t(sh.E));
        layer_pages.push_back(std::move(lp));
        continue;
      }
      for (int e = 0; e < sh.E; ++e) {
        std::vector<int> ids;
        // In host memory the pages point at the weights; from disk the pool lends them.
        const ExpertMatrices x = disk ? ExpertMatrices{} : host_expert(l, e);
        if (!disk) {
          host_matrices.resize(size_t(c.num_layers) * size_t(sh.E));
          host_matrices[size_t(l) * size_t(sh.E) + size_t(e)] = x;
        }
        const char* names[] = {"w1", "w3", "w2"};
        for (int m = 0; m < 3; ++m) {
          ids.push_back(int(pages.size()));
          offload::WeightPage page{.host = x.weights[size_t(m)],
                                   .bytes = matrix_bytes(m),
                                   .name = fmt::format("L{}.e{}.{}", l, e, names[m])};
          if (fp8_experts()) {  // its block scales, then its codes
            page.then_host = page.host;
            page.then_bytes = value_bytes(m);
            page.host = x.block_scales[size_t(m)];
            page.bytes = fp8_scale_bytes(m);
          }
          if (disk) {
            page.source_group = disk_pages->group(l, e);
            page.source_part = m;
          }
          page.key = pages.size() + 1;  // the same bytes every step: the slots may keep them
          pages.push_back(std::move(page));
        }
        lp.experts.push_back(std::move(ids));
      }
      layer_pages.push_back(std::move(lp));
    }
  }

  // A weight matrix n × k at a device address, in the form the device holds it: bf16, FP8
  // (fp8_device_matrix) or packed quantized (cpu::QuantView).
  enum class Form { kBf16, kFp8, kQuant };
  struct DeviceMatrix {
    const void* data;
    int64_t n, k;
    Form form;
  };
  // A resident projection, and an expert's or dense MLP's matrix.
  DeviceMatrix projection(size_t offset, int64_t n, int64_t k) const {
    return {resident + offset, n, k, fp8_projections() ? Form::kFp8 : Form::kBf16};
  }
  DeviceMatrix expert_matrix(const void* data, int64_t n, int64_t k) const {
    return {data, n, k,
            c.expert_quant.quantized() ? Form::kQuant
            : fp8_experts()            ? Form::kFp8
                                       : Form::kBf16};
  }
  // Expert matrix m's shape (0 gate, 1 up: I × H; 2 down: H × I).
  std::pair<int64_t, int64_t> expert_matrix_shape(int m) const {
    return m == 2 ? std::pair<int64_t, int64_t>{sh.H, sh.I}
                  : std::pair<int64_t, int64_t>{sh.I, sh.H};
  }

  // y = x · Wᵀ + beta · y with x the GEMM input as the step holds it: bf16 rows, or fp32 in f32
  // precision. Quantized weights quantize it to int8 on the fly (the CPU engine's gemm_int8).
  void linear(void* s, const DeviceMatrix& matrix, int m, const void* x, float* y, float beta) {
    switch (matrix.form) {
      case Form::kQuant:
        math.gemm_quant(s, quant_view(matrix), m, x, !sh.f32, y, beta);
        return;
      case Form::kFp8:
        math.gemm_fp8(s, {.w = fp8_device_matrix(matrix.data, matrix.n, matrix.k),
                          .m = m,
                          .x = x,
                          .x_bf16 = !sh.f32,
                          .y = y,
                          .beta = beta,
                          .tile = at<uint16_t>(buf.fp8_tile),
                          .tile_elements = sh.fp8_tile});
        return;
      case Form::kBf16:
        if (sh.f32)
          math.gemm_f32(s, {m, matrix.n, matrix.k}, static_cast<const float*>(x),
                        static_cast<const uint16_t*>(matrix.data), y, beta);
        else
          math.gemm_bf16(s, {m, matrix.n, matrix.k}, static_cast<const uint16_t*>(x),
                         static_cast<const uint16_t*>(matrix.data), y, beta);
        return;
    }
  }

  // y = x · Wᵀ + beta · y for fp32 rows x, rounded to bf16 into `scratch` first unless the policy
  // keeps fp32 (as the CPU engine's gemm()); quantized weights take the fp32 rows as they are.
  void gemm(void* s, int m, const DeviceMatrix& matrix, const float* x, float* y, float beta,
            uint16_t* scratch) {
    if (m == 0) return;
    if (matrix.form == Form::kQuant) {
      math.gemm_quant(s, quant_view(matrix), m, x, false, y, beta);
      return;
    }
    if (sh.f32) return linear(s, matrix, m, x, y, beta);
    math.to_bf16(s, x, scratch, int64_t(m) * matrix.k);
    linear(s, matrix, m, scratch, y, beta);
  }

  // A packed matrix as the quantized GEMM reads it (cpu::QuantView's layout).
  cpu::QuantView quant_view(const DeviceMatrix& matrix) const {
    return {.format = quant_format(c.expert_quant.dtype),
            .n = matrix.n,
            .k = matrix.k,
            .group_size = c.expert_quant.group_size,
            .data = static_cast<const uint8_t*>(matrix.data)};
  }

  // The model's norm (RMSNorm or LayerNorm, config `norm`) over n rows of H with fp32 weights
  // `wt` (device), or those at resident offset `weight_at`.
  void norm(void* s, const float* x, float* y, int64_t n, const float* wt) {
    if (c.norm == NormKind::kLayerNorm)
      math.layer_norm(s, x, y, n, sh.H, wt, c.rms_norm_eps);
    else
      math.rms_norm(s, x, y, n, sh.H, wt, c.rms_norm_eps);
  }
  void norm(void* s, const float* x, float* y, int64_t n, size_t weight_at) {
    norm(s, x, y, n, weight<float>(weight_at));
  }

  // The layer's dense MLP over every row of the step (a shared expert, or a dense layer's FFN),
  // after its experts, up to BufferShape::dbe rows per GEMM:
  // x[row] += scale[row] · down(silu(gate h) * up h), scale = sigmoid(shared_expert_gate · h).
  void dense_mlp(void* s, int l) override {
    const LayerResident& r = res[size_t(l)];
    if (r.mlp_I == 0) return;
    const int T = mb_row.back(), H = sh.H, I = r.mlp_I;
    const DeviceMatrix wg = expert_matrix(weight<char>(r.mlp_gate), I, H),
                       wu = expert_matrix(weight<char>(r.mlp_up), I, H),
                       wd = expert_matrix(weight<char>(r.mlp_down), H, I);
    float *gate = at<float>(buf.gate), *up = at<float>(buf.up), *down = at<float>(buf.down);
    for (int begin = 0; begin < T; begin += sh.dbe) {
      const int m = std::min(T - begin, sh.dbe);
      const float* h = at<float>(buf.h) + size_t(begin) * H;
      const void* xin = h;  // rounded to bf16 once for gate and up, unless the policy keeps fp32
      if (!sh.f32) {
        math.to_bf16(s, h, at<uint16_t>(buf.ex), int64_t(m) * H);
        xin = at<uint16_t>(buf.ex);
      }
      linear(s, wg, m, xin, gate, 0);
      linear(s, wu, m, xin, up, 0);
      math.silu_mul(s, gate, up, gate, int64_t(m) * I);
      gemm(s, m, wd, gate, down, 0, at<uint16_t>(buf.actb));
      math.add_scaled_rows(s, down, H, r.mlp_scaled ? at<float>(buf.mlp_scale) + begin : nullptr, m,
                           at<float>(buf.x) + size_t(begin) * H);
    }
  }

  // Bytes of a layer's attention projections on the device (bf16 or FP8 with their scales).
  double attention_projection_bytes() const {
    const int64_t H = sh.H;
    auto bytes = [&](int64_t n, int64_t k) { return double(projection_bytes(c, n, k)); };
    if (c.attention != AttentionKind::kLatent)
      return bytes(sh.qd, H) + 2 * bytes(sh.kvd, H) + bytes(H, sh.ad);
    return (sh.qa > 0 ? bytes(sh.qa, H) + bytes(sh.qd, sh.qa) : bytes(sh.qd, H)) +
           bytes(sh.kvd, H) + bytes(H, sh.ad);
  }

  // The resident GEMMs of a step of T rows in M micro-batches, as the CPU engine's gemm()
  // counts them (per call: the weight's bytes and 2·m·n·k FLOPs; experts: account_expert).
  void account_resident_gemms(int T, int M) const {
    // The attention projections on the device (MLA's kv_b_proj runs with its attention, on the
    // host, counted there).
    const double H = sh.H, attention = c.attention == AttentionKind::kLatent
                                           ? double(c.attention_weight_elements()) / H -
                                                 double(c.num_heads) *
                                                     (c.mla.qk_nope_head_dim + c.mla.v_head_dim) *
                                                     c.mla.kv_lora_rank / H
                                           : double(sh.qd) * 2 + double(sh.kvd) * 2;
    const double attention_bytes = attention_projection_bytes();
    for (const LayerResident& r : res) {
      const double columns = attention + (r.moe ? sh.E : 0) + (r.mlp_scaled ? 1 : 0);
      stats->flops += 2.0 * T * H * columns;
      // The router and the dense MLP's gate are bf16 whatever the projections are.
      stats->weight_bytes += (attention_bytes + H * (columns - attention) * 2) * M;
      for (int begin = 0; begin < T && r.mlp_I > 0; begin += sh.be) {
        stats->flops += 6.0 * std::min(T - begin, sh.be) * r.mlp_I * H;
        stats->weight_bytes += 2.0 * double(expert_matrix_bytes(c, r.mlp_I, sh.H)) +
                               double(expert_matrix_bytes(c, sh.H, r.mlp_I));
      }
    }
  }

  // The q|k|v block of micro-batch mb: [n, qd] q, then [n, kvd] k, then [n, kvd] v.
  size_t qkv_offset(int mb) const { return size_t(mb_row[size_t(mb)]) * sh.qkv_row(); }
  int rows_of(int mb) const { return mb_row[size_t(mb) + 1] - mb_row[size_t(mb)]; }

  // The step's rows of each share per micro-batch: the CPU share's items (their q|k|v and outputs
  // packed in the host blocks), and for the GPU share the row indices (AttentionIndex) and block
  // tables, staged in h_index; returns the table entries written.
  int index_rows() {
    const std::vector<StepItem>& items = plan->items;
    const int M = micro_batches();
    const size_t T = size_t(sh.T);
    mb_gpu.assign(size_t(M), 0);
    mb_cpu.assign(size_t(M), 0);
    cpu_items.assign(size_t(M), {});
    int32_t* ix = h_index.data();
    int32_t* tables = ix ? ix + kAttentionIndexArrays * T : nullptr;
    int table_end = 0;
    const int bs = kv.config().block_size, qd = sh.qd, kvd = sh.kvd, vd = sh.vd, ad = sh.ad;
    size_t i = 0;
    for (int mb = 0; mb < M; ++mb) {
      const size_t end = size_t(plan->micro_batch_end[size_t(mb)]);
      const int r0 = mb_row[size_t(mb)];
      auto on_gpu = [&](size_t j) { return device_kv && device_kv->contains(items[j].slot); };
      int ng = 0, nc = 0;
      for (size_t j = i; j < end; ++j) (on_gpu(j) ? ng : nc) += items[j].count;
      const float* qkv = h_qkv.data() + qkv_offset(mb);
      int g = 0, cc = 0;
      for (; i < end; ++i) {
        const StepItem& it = items[i];
        const int row0 = item_row[i] - r0;
        if (!on_gpu(i)) {
          cpu_items[size_t(mb)].push_back({it.slot, it.first_pos, it.count, qkv + size_t(cc) * qd,
                                           qkv + size_t(nc) * qd + size_t(cc) * kvd,
                                           qkv + size_t(nc) * (qd + kvd) + size_t(cc) * vd,
                                           h_attn.data() + size_t(r0 + cc) * ad});
          for (int t = 0; t < it.count; ++t, ++cc) {
            if (!ix) continue;  // no GPU share: nothing is gathered
            ix[kCpuRows * T + size_t(r0 + cc)] = row0 + t;
            ix[kMerge * T + size_t(r0 + row0 + t)] = ng + cc;
          }
          continue;
        }
        const std::span<const int32_t> blocks = device_kv->block_table(it.slot);
        std::copy(blocks.begin(), blocks.end(), tables + table_end);
        for (int t = 0; t < it.count; ++t, ++g) {
          const int pos = it.first_pos + t;
          const size_t r = size_t(r0 + g);
          ix[kGpuRows * T + r] = row0 + t;
          ix[kGpuPos * T + r] = pos;
          ix[kGpuTable * T + r] = table_end;
          ix[kGpuSlot * T + r] = blocks[size_t(pos / bs)] * bs + pos % bs;
          ix[kMerge * T + size_t(r0 + row0 + t)] = g;
        }
        table_end += int(blocks.size());
        for (int l = 0; l < c.num_layers; ++l) account_attention(c, it.first_pos, it.count, *stats);
        stats->device_gpu_attention_rows += int64_t(it.count) * c.num_layers;
      }
      mb_gpu[size_t(mb)] = ng;
      mb_cpu[size_t(mb)] = nc;
    }
    return table_end;
  }

  // MLA's projections on the device: hidden_states = input_layernorm(x); q = q_proj(h) or
  // q_b_proj(q_a_layernorm(q_a_proj(h))); compressed_kv = kv_a_proj_with_mqa(h). Their block
  // goes to the host as it is, where the rest of the attention runs (host_latent_attention).
  void latent_attention_in(void* s, int l, int mb) {
    const LayerResident& r = res[size_t(l)];
    const int H = sh.H, r0 = mb_row[size_t(mb)], n = rows_of(mb);
    float* h = at<float>(buf.h) + size_t(r0) * H;
    uint16_t* xb = at<uint16_t>(buf.xb) + size_t(r0) * sh.xb_row();
    float* q = at<float>(buf.qkv) + qkv_offset(mb);
    float* ckv = q + size_t(n) * sh.qd;
    norm(s, at<float>(buf.x) + size_t(r0) * H, h, n, r.attn_norm);
    if (sh.qa > 0) {
      float* qa = at<float>(buf.q_a) + size_t(r0) * sh.qa;
      gemm(s, n, projection(r.q_a, sh.qa, H), h, qa, 0, xb);
      math.rms_norm(s, qa, qa, n, sh.qa, weight<float>(r.q_a_norm), c.rms_norm_eps);
      gemm(s, n, projection(r.q_b, sh.qd, sh.qa), qa, q, 0, xb);
    } else {
      gemm(s, n, projection(r.wq, sh.qd, H), h, q, 0, xb);
    }
    gemm(s, n, projection(r.kv_a, sh.kvd, H), h, ckv, 0, xb);
  }

  void attention_in(void* s, int l, int mb, std::span<void* const>) override {
    if (c.attention == AttentionKind::kLatent) return latent_attention_in(s, l, mb);
    const LayerResident& r = res[size_t(l)];
    const int H = sh.H, r0 = mb_row[size_t(mb)], n = rows_of(mb);
    float* x = at<float>(buf.x) + size_t(r0) * H;
    float* h = at<float>(buf.h) + size_t(r0) * H;
    uint16_t* xb = at<uint16_t>(buf.xb) + size_t(r0) * sh.xb_row();
    float* q = at<float>(buf.qkv) + qkv_offset(mb);
    float* k = q + size_t(n) * sh.qd;
    float* v = k + size_t(n) * sh.kvd;
    // hidden_states = input_layernorm(x); q, k, v = q_proj(h), k_proj(h), v_proj(h) (+ biases)
    norm(s, x, h, n, r.attn_norm);
    if (!sh.f32) math.to_bf16(s, h, xb, int64_t(n) * H);  // once for the three projections
    const void* xin = sh.f32 ? static_cast<const void*>(h) : xb;
    for (auto [wt, bias, y, out] :
         {std::tuple{r.wq, r.bq, q, sh.qd}, {r.wk, r.bk, k, sh.kvd}, {r.wv, r.bv, v, sh.kvd}}) {
      linear(s, projection(wt, out, H), n, xin, y, 0);
      if (r.qkv_bias) math.add_bias(s, y, weight<float>(bias), n, out);
    }
    // q = q_norm(q); k = k_norm(k) (per head, or over the row), as the CPU engine's qk_norm
    if (c.qk_norm != QkNorm::kNone) {
      const bool per_head = c.qk_norm == QkNorm::kPerHead;
      math.rms_norm(s, q, q, per_head ? int64_t(n) * c.num_heads : n, per_head ? c.head_dim : sh.qd,
                    weight<float>(r.q_norm), c.rms_norm_eps);
      math.rms_norm(s, k, k, per_head ? int64_t(n) * c.num_kv_heads : n,
                    per_head ? c.head_dim : sh.kvd, weight<float>(r.k_norm), c.rms_norm_eps);
    }
    // q, k, v = q.clamp(±clip_qkv), ...
    if (c.clip_qkv > 0)
      for (auto [y, width] : {std::pair{q, sh.qd}, {k, sh.kvd}, {v, sh.kvd}})
        math.clamp(s, y, int64_t(n) * width, c.clip_qkv);
    const int32_t* pos = at<int32_t>(buf.positions) + r0;
    const float* inv_freq = weight<float>(inv_freq_at);
    math.rope(s, q, n, c.num_heads, c.head_dim, pos, inv_freq);
    math.rope(s, k, n, c.num_kv_heads, c.head_dim, pos, inv_freq);
    if (mb_gpu[size_t(mb)] == 0) return;  // all on the host: the q|k|v block goes as it is
    // The GPU share: its K/V into the device pool, its q gathered and attended there; the CPU
    // share's q|k|v gathered into the block that goes to the host.
    const int ng = mb_gpu[size_t(mb)], nc = mb_cpu[size_t(mb)], qd = sh.qd, kvd = sh.kvd;
    if (nc > 0) {
      float* cq = at<float>(buf.qkv_cpu) + qkv_offset(mb);
      const int32_t* rows = index(kCpuRows, r0);
      math.gather_rows_f32(s, q, qd, rows, nc, cq);
      math.gather_rows_f32(s, k, kvd, rows, nc, cq + size_t(nc) * qd);
      math.gather_rows_f32(s, v, kvd, rows, nc, cq + size_t(nc) * (qd + kvd));
    }
    const offload::DeviceKvLayer layer = kv_layer(l);
    math.write_kv(s, layer, k, v, index(kGpuRows, r0), index(kGpuSlot, r0), ng);
    float* gq = at<float>(buf.q_gpu) + size_t(r0) * qd;
    math.gather_rows_f32(s, q, qd, index(kGpuRows, r0), ng, gq);
    offload::PagedAttentionRows a;
    a.heads = c.num_heads;
    a.sliding_window = c.sliding_window;
    a.rows = ng;
    a.q = gq;
    a.out = at<float>(buf.attn_parts) + size_t(r0) * qd;
    a.row_pos = index(kGpuPos, r0);
    a.row_table = index(kGpuTable, r0);
    a.tables = at<int32_t>(buf.tables);
    math.paged_attention(s, layer, a);
  }

  // Array `a` of the step's row indices (device), from micro-batch row r0.
  const int32_t* index(AttentionIndex a, int r0) const {
    return at<int32_t>(buf.attn_index) + size_t(a) * size_t(sh.T) + size_t(r0);
  }
  offload::DeviceKvLayer kv_layer(int l) const {
    return {reinterpret_cast<uint16_t*>(kv_pool + size_t(l) * kv_layout.layer_bytes),
            c.num_kv_heads, c.head_dim, kv.config().block_size};
  }

  // The CPU share's q|k|v of micro-batch mb ([nc q | nc k | nc v]); as computed when the GPU
  // share has no row in it, else gathered in attention_in.
  offload::Transfer qkv_to_host(int, int mb) override {
    const size_t bytes = size_t(mb_cpu[size_t(mb)]) * sh.qkv_row() * 4;
    if (bytes == 0) return {};
    to_host_bytes += double(bytes);
    const size_t qkv = mb_gpu[size_t(mb)] > 0 ? buf.qkv_cpu : buf.qkv;
    return {h_qkv.data() + qkv_offset(mb), at<float>(qkv) + qkv_offset(mb), bytes};
  }

  // Writes the CPU share's K/V into the host cache and attends over it (the CPU engine's code).
  void cpu_attention(int l, int mb) override {
    const auto t0 = Clock::now();
    if (c.attention == AttentionKind::kLatent)
      host_latent_attention(c, w.layers[size_t(l)], latent_inv_freq, kv, l, cpu_items[size_t(mb)],
                            *stats);
    else
      host_attention(c, kv, l, cpu_items[size_t(mb)], *stats);
    stats->attention_seconds += seconds_since(t0);
  }

  // The CPU share's outputs: into the attention rows when it has the whole micro-batch, else
  // after the GPU share's outputs, merged in attention_out.
  offload::Transfer attention_to_device(int, int mb) override {
    const int ng = mb_gpu[size_t(mb)];
    const size_t r0 = size_t(mb_row[size_t(mb)]), bytes = size_t(mb_cpu[size_t(mb)]) * sh.ad * 4;
    to_device_bytes += double(bytes);
    float* dst = ng > 0 ? at<float>(buf.attn_parts) + (r0 + size_t(ng)) * sh.ad
                        : at<float>(buf.attn) + r0 * sh.ad;
    return {dst, h_attn.data() + r0 * sh.ad, bytes};
  }

  size_t routing_offset(int mb) const { return size_t(mb_row[size_t(mb)]) * sh.routing_row(); }

  void attention_out(void* s, int l, int mb, std::span<void* const>) override {
    const LayerResident& r = res[size_t(l)];
    const int H = sh.H, r0 = mb_row[size_t(mb)], n = rows_of(mb);
    float* x = at<float>(buf.x) + size_t(r0) * H;
    float* h = at<float>(buf.h) + size_t(r0) * H;
    uint16_t* xb = at<uint16_t>(buf.xb) + size_t(r0) * sh.xb_row();
    if (mb_gpu[size_t(mb)] > 0)  // both shares' outputs into the rows' order
      math.gather_rows_f32(s, at<float>(buf.attn_parts) + size_t(r0) * sh.ad, sh.ad,
                           index(kMerge, r0), n, at<float>(buf.attn) + size_t(r0) * sh.ad);
    // x = x + o_proj(attn) (+ bias); h = post_attention_layernorm(x); router_logits = gate(h)
    gemm(s, n, projection(r.wo, H, sh.ad), at<float>(buf.attn) + size_t(r0) * sh.ad, x, 1.0f, xb);
    if (r.o_bias) math.add_bias(s, x, weight<float>(r.bo), n, H);
    norm(s, x, h, n, r.ffn_norm);
    // scale = sigmoid(shared_expert_gate(h)), fp32 input as the router
    if (r.mlp_scaled) {
      float* scale = at<float>(buf.mlp_scale) + r0;
      math.gemm_f32(s, {n, 1, H}, h, weight<uint16_t>(r.mlp_scale), scale, 0);
      math.sigmoid(s, scale, n);
    }
    if (!r.moe) return;  // a dense layer: no routing
    float* logits = at<float>(buf.logits) + size_t(r0) * sh.E;
    math.gemm_f32(s, {n, sh.E, H}, h, weight<uint16_t>(r.router), logits, 0);
    char* block = at<char>(buf.routing) + routing_offset(mb);
    auto* ids = reinterpret_cast<int32_t*>(block);
    auto* wts = reinterpret_cast<float*>(block + size_t(n) * sh.K * 4);
    cpu::RoutingArgs route = routing_rule(c);
    route.logits = logits;
    route.tokens = n;
    route.selection_bias = c.router_selection_bias ? weight<float>(r.router_bias) : nullptr;
    route.expert_ids = ids;
    route.weights = wts;
    math.route_top_k(s, route);
    if (hidden_to_host(l)) math.copy(s, block + size_t(n) * sh.K * 8, h, size_t(n) * H * 4);
  }

  // Whether the routing block carries the rows' FFN-normed states, the CPU experts' input: not
  // for a resident layer, whose experts all run on the device.
  bool hidden_to_host(int l) const { return sh.cpu_experts && expert_layer_index[size_t(l)] < 0; }

  offload::Transfer routing_to_host(int l, int mb) override {
    if (!res[size_t(l)].moe) return {h_routing.data(), at<char>(buf.routing), 0};
    const size_t n = size_t(rows_of(mb));
    const size_t bytes = hidden_to_host(l) ? n * sh.routing_row() : n * size_t(sh.K) * 8;
    to_host_bytes += double(bytes);
    return {h_routing.data() + routing_offset(mb), at<char>(buf.routing) + routing_offset(mb),
            bytes};
  }

  // Groups the step's rows per expert in the CPU engine's order (micro-batch, row, rank), into
  // the [rows | weights] block uploaded for the expert kernels.
  std::vector<int> expert_tokens(int l) override {
    if (!res[size_t(l)].moe) return {};  // a dense layer: no experts
    const int T = mb_row.back(), K = sh.K;
    std::vector<std::vector<std::pair<int, float>>> lists(size_t(sh.E));
    row_hidden.assign(size_t(T), nullptr);
    cpu_rows = 0;  // add_cpu_experts of the previous layer has run: its routing arrived after
    for (int mb = 0; mb < micro_batches(); ++mb) {
      const char* block = h_routing.data() + routing_offset(mb);
      const int r0 = mb_row[size_t(mb)], n = rows_of(mb);
      const auto* ids = reinterpret_cast<const int32_t*>(block);
      const auto* wts = reinterpret_cast<const float*>(block + size_t(n) * K * 4);
      const auto* hid = reinterpret_cast<const float*>(block + size_t(n) * K * 8);
      for (int j = 0; j < n; ++j) {
        if (sh.cpu_experts) row_hidden[size_t(r0 + j)] = hid + size_t(j) * sh.H;
        for (int t = 0; t < K; ++t) {
          const int e = ids[size_t(j) * K + t];
          if (e < 0 || e >= sh.E)
            fail("offload executor: routing of row {}: expert {} is outside [0, {})", r0 + j, e,
                 sh.E);
          lists[size_t(e)].push_back({r0 + j, wts[size_t(j) * K + t]});
        }
      }
    }
    auto* rows = reinterpret_cast<int32_t*>(h_lists.data());
    auto* weights = reinterpret_cast<float*>(h_lists.data() + size_t(T) * K * 4);
    std::vector<int> counts;
    int next = 0;
    for (int e = 0; e < sh.E; ++e) {
      list_begin[size_t(e)] = next;
      list_count[size_t(e)] = int(lists[size_t(e)].size());
      for (auto [row, wt] : lists[size_t(e)]) {
        rows[next] = row;
        weights[next++] = wt;
      }
      counts.push_back(list_count[size_t(e)]);
      account_expert(list_count[size_t(e)]);
    }
    return counts;
  }

  // The CPU engine's accounting of an expert's GEMMs, wherever they run.
  void account_expert(int tokens) {
    const double matrices = double(matrix_bytes(0) + matrix_bytes(1) + matrix_bytes(2));
    for (int begin = 0; begin < tokens; begin += sh.be) {
      const int m = std::min(tokens - begin, sh.be);
      stats->weight_bytes += matrices;
      stats->flops += 6.0 * m * sh.I * sh.H;
      stats->expert_flops += 6.0 * m * sh.I * sh.H;
      ++stats->expert_gemm_calls;
      stats->expert_tokens += m;
    }
  }

  offload::Transfer expert_rows_to_device(int l) override {
    if (!res[size_t(l)].moe) return {};
    const size_t bytes = size_t(mb_row.back()) * sh.K * 8;
    to_device_bytes += double(bytes);
    return {at<char>(buf.expert_lists), h_lists.data(), bytes};
  }

  // From disk, the pool is asked for the experts the router chose, and lends their pages; a
  // resident layer's GPU experts are on the device already, so only its CPU experts are read.
  void experts_placed(int l, const std::vector<int>& gpu, const std::vector<int>& cpu) override {
    if (!disk_pages) return;
    const bool on_device = expert_layer_index[size_t(l)] >= 0;
    disk_pages->begin_layer(l, on_device ? std::vector<int>{} : gpu, cpu, mb_row.back());
  }

  // x[row] += weight · w2(silu(w1 h) * w3 h) over the expert's rows, up to BufferShape::dbe rows
  // per GEMM.
  // `p`: the expert's gate, up and down pages; empty for a resident layer's expert.
  void gpu_expert(void* s, int l, int e, std::span<void* const> p) override {
    const int T = mb_row.back(), H = sh.H, I = sh.I;
    DeviceMatrix mats[3];
    const int j = expert_layer_index[size_t(l)];
    for (int m = 0; m < 3; ++m) {
      const auto [n, k] = expert_matrix_shape(m);
      mats[m] = expert_matrix(
          j >= 0 ? resident_experts + resident_expert_offset(c, j, m, e) : p[size_t(m)], n, k);
    }
    const int32_t* rows = at<int32_t>(buf.expert_lists) + list_begin[size_t(e)];
    const float* weights =
        at<float>(buf.expert_lists) + size_t(T) * sh.K + size_t(list_begin[size_t(e)]);
    float *gate = at<float>(buf.gate), *up = at<float>(buf.up), *down = at<float>(buf.down);
    const float* h = at<float>(buf.h);
    for (int begin = 0; begin < list_count[size_t(e)]; begin += sh.dbe) {
      const int m = std::min(list_count[size_t(e)] - begin, sh.dbe);
      if (sh.f32)
        math.gather_rows_f32(s, h, H, rows + begin, m, at<float>(buf.ex));
      else
        math.gather_rows_bf16(s, h, H, rows + begin, m, at<uint16_t>(buf.ex));
      linear(s, mats[0], m, at<char>(buf.ex), gate, 0);
      linear(s, mats[1], m, at<char>(buf.ex), up, 0);
      math.silu_mul(s, gate, up, gate, int64_t(m) * I);
      gemm(s, m, mats[2], gate, down, 0, at<uint16_t>(buf.actb));
      math.scatter_add_rows(s, down, H, rows + begin, weights + begin, m, at<float>(buf.x));
    }
  }

  // Bytes of an expert's matrix m (0 gate, 1 up, 2 down): 2·I·H in bf16, else packed.
  size_t matrix_bytes(int m) const {
    const int64_t H = sh.H, I = sh.I;
    return m == 2 ? expert_matrix_bytes(c, H, I) : expert_matrix_bytes(c, I, H);
  }

  // The same expert on the host's kernels and weights, into the host block added on the device.
  void cpu_expert(int l, int e) override {
    const auto t0 = Clock::now();
    const int T = mb_row.back(), H = sh.H, I = sh.I;
    const auto* rows = reinterpret_cast<const int32_t*>(h_lists.data());
    const auto* weights = reinterpret_cast<const float*>(h_lists.data() + size_t(T) * sh.K * 4);
    const int first = list_begin[size_t(e)], count = list_count[size_t(e)];
    const ExpertMatrices x = disk_pages ? disk_pages->acquire_for_host(e)
                                        : host_matrices[size_t(l) * size_t(sh.E) + size_t(e)];
    // The CPU engine's expert GEMM: bf16 (or fp32) weights, FP8 ones dequantised tile by tile,
    // or the packed quantized ones. `mat`: 0 gate, 1 up, 2 down.
    auto host_gemm = [&](int m, int mat, const void* xin, DType xt, float* y) {
      const auto [n, k] = expert_matrix_shape(mat);
      const void* wm = x.weights[size_t(mat)];
      if (c.expert_quant.quantized()) {
        const cpu::QuantView wq = sluice::quant_view(c, wm, n, k);
        cpu::gemm_int8({.m = m, .x = xin, .x_dtype = xt, .w = &wq, .y = y});
        return;
      }
      if (const float* scales = x.block_scales[size_t(mat)]) {
        const cpu::Fp8Matrix fp8{
            .q = static_cast<const uint8_t*>(wm), .scale = scales, .n = n, .k = k};
        cpu::gemm_fp8(
            {.m = m, .x = xin, .x_dtype = xt, .w = &fp8, .y = y, .round_x_to_bf16 = !sh.f32});
        return;
      }
      const auto* wt = static_cast<const uint16_t*>(wm);
      if (xt == DType::F32 && sh.f32) {
        cpu::gemm_f32({m, int(n), int(k), static_cast<const float*>(xin), wt, y, 0});
        return;
      }
      cpu::GemmArgs a;
      a.m = m, a.n = int(n), a.k = int(k), a.x = xin, a.x_dtype = xt, a.w = wt, a.y = y;
      cpu::gemm(a);
    };
    for (int begin = 0; begin < count; begin += sh.be) {
      const int m = std::min(count - begin, sh.be);
      const void* xe;
      DType xt;
      for (int j = 0; j < m; ++j) {
        const float* src = row_hidden[size_t(rows[first + begin + j])];
        if (sh.f32)
          std::copy_n(src, H, &c_exf[size_t(j) * H]);
        else
          cpu::f32_to_bf16_row(src, &c_exb[size_t(j) * H], size_t(H));
      }
      if (sh.f32)
        xe = c_exf.data(), xt = DType::F32;
      else
        xe = c_exb.data(), xt = DType::BF16;
      host_gemm(m, 0, xe, xt, c_gate.data());
      host_gemm(m, 1, xe, xt, c_up.data());
      cpu::silu_mul(c_gate.data(), c_up.data(), c_act.data(), int64_t(m) * I);
      host_gemm(m, 2, c_act.data(), DType::F32, c_down.data());
      for (int j = 0; j < m; ++j) {
        const int row = rows[first + begin + j];
        int& slot = c_slot[size_t(row)];
        if (slot < 0) {
          slot = cpu_rows++;
          std::fill_n(&c_out[size_t(slot) * H], H, 0.0f);
          reinterpret_cast<int32_t*>(h_cpu_block.data())[slot] = row;
        }
        float* o = &c_out[size_t(slot) * H];
        const float* d = &c_down[size_t(j) * H];
        const float wt = weights[first + begin + j];
        for (int i = 0; i < H; ++i) o[i] += wt * d[i];
      }
    }
    if (disk_pages) disk_pages->release_for_host(e);
    stats->expert_seconds += seconds_since(t0);
  }

  // [R rows | R ones | R × H sums]: added with scatter_add_rows at weight 1 (exact).
  offload::Transfer cpu_experts_to_device(int) override {
    const size_t R = size_t(cpu_rows), H = size_t(sh.H);
    auto* rows = reinterpret_cast<int32_t*>(h_cpu_block.data());
    // The rows' list was written at [0, R) as they were met; the sums go after the ones.
    std::fill_n(reinterpret_cast<float*>(h_cpu_block.data() + R * 4), R, 1.0f);
    std::memcpy(h_cpu_block.data() + R * 8, c_out.data(), R * H * 4);
    for (size_t j = 0; j < R; ++j) c_slot[size_t(rows[j])] = -1;
    const size_t bytes = R * (8 + H * 4);
    to_device_bytes += double(bytes);
    return {at<char>(buf.cpu_block), h_cpu_block.data(), bytes};
  }

  void add_cpu_experts(void* s, int) override {
    const size_t R = size_t(cpu_rows);
    char* block = at<char>(buf.cpu_block);
    math.scatter_add_rows(s, reinterpret_cast<const float*>(block + R * 8), sh.H,
                          reinterpret_cast<const int32_t*>(block),
                          reinterpret_cast<const float*>(block + R * 4), int64_t(R),
                          at<float>(buf.x));
  }

  // The step's embeddings, positions, sample rows and (with a GPU attention share) row indices
  // and block tables go up, staged through pinned buffers (the previous step's copies from them
  // have completed: the host synchronised on its last transfer); the compute queue starts once
  // they are there.
  void upload_step_inputs(const OffloadStepInput& in, int table_entries) {
    using offload::Queue;
    const int T = plan->tokens, H = sh.H, S = int(in.sample_rows.size());
    std::copy(in.positions.begin(), in.positions.begin() + T, h_positions.begin());
    std::copy(in.sample_rows.begin(), in.sample_rows.end(), h_sample_rows.begin());
    std::copy_n(in.embeddings, size_t(T) * H, h_x.data());
    dev.copy_to_device(Queue::kTransfer, at<float>(buf.x), h_x.data(), size_t(T) * H * 4,
                       "embeddings>d");
    dev.copy_to_device(Queue::kTransfer, at<int32_t>(buf.positions), h_positions.data(),
                       size_t(T) * 4, "positions>d");
    dev.copy_to_device(Queue::kTransfer, at<int32_t>(buf.sample_rows), h_sample_rows.data(),
                       size_t(S) * 4, "sample_rows>d");
    to_device_bytes += double(T) * (H + 1) * 4 + double(S) * 4;
    if (sh.gpu_attention()) {
      const size_t index_bytes = kAttentionIndexArrays * size_t(sh.T) * 4;
      dev.copy_to_device(Queue::kTransfer, at<int32_t>(buf.attn_index), h_index.data(), index_bytes,
                         "attention_index>d");
      dev.copy_to_device(Queue::kTransfer, at<int32_t>(buf.tables),
                         h_index.data() + kAttentionIndexArrays * size_t(sh.T),
                         size_t(table_entries) * 4, "kv_tables>d");
      to_device_bytes += double(index_bytes) + double(table_entries) * 4;
    }
    dev.wait(Queue::kCompute, dev.record(Queue::kTransfer));
  }

  // The sampled rows' final hidden states; with the lm_head on the device, their logits as the
  // CPU engine computes them (final norm, then the lm_head GEMM at the policy's precision), and
  // with greedy sampling their argmax, which take the place of the sample rows.
  void enqueue_final_rows(int S, bool greedy) {
    using offload::Queue;
    Impl* mp = this;
    const bool lm = lm_head != nullptr;
    const int H = sh.H, V = sh.V;
    dev.enqueue(
        Queue::kCompute,
        [mp, S, H, V, lm, greedy](void* s) {
          float* rows = mp->at<float>(mp->buf.final_rows);
          mp->math.gather_rows_f32(s, mp->at<float>(mp->buf.x), H,
                                   mp->at<int32_t>(mp->buf.sample_rows), S, rows);
          if (!lm || S == 0) return;
          float* normed = mp->at<float>(mp->buf.h);  // the layers are done with it
          mp->norm(s, rows, normed, S,
                   reinterpret_cast<const float*>(mp->lm_head + mp->lm_layout.final_norm));
          mp->gemm(s, S, {mp->lm_head + mp->lm_layout.lm_head, V, H, Impl::Form::kBf16}, normed,
                   mp->at<float>(mp->buf.lm_logits), 0, mp->at<uint16_t>(mp->buf.xb));
          // The tokens take the place of the sample rows, which the gather above has consumed.
          if (greedy)
            mp->math.argmax_rows(s, mp->at<float>(mp->buf.lm_logits), S, V,
                                 mp->at<int32_t>(mp->buf.sample_rows));
        },
        lm ? "final_norm+lm_head" : "final_rows");
    dev.wait(Queue::kTransfer, dev.record(Queue::kCompute));
  }

  // What the step hands back, copied down: the greedy tokens, or the logits, or (with the
  // lm_head on the host) the final rows into `final_rows`.
  OffloadStepOutput take_outputs(int S, bool greedy, float* final_rows, EngineStats& st) {
    using offload::Queue;
    const int H = sh.H, V = sh.V;
    OffloadStepOutput out;
    if (greedy) {
      dev.copy_to_host(Queue::kTransfer, h_sample_rows.data(), at<int32_t>(buf.sample_rows),
                       size_t(S) * 4, "greedy_tokens>h");
      dev.synchronize(dev.record(Queue::kTransfer));
      out.greedy_tokens = {h_sample_rows.data(), size_t(S)};
      to_host_bytes += double(S) * 4;
    } else if (lm_head) {
      const size_t n = size_t(S) * size_t(V);
      dev.copy_to_host(Queue::kTransfer, h_logits.data(), at<float>(buf.lm_logits), n * 4,
                       "logits>h");
      dev.synchronize(dev.record(Queue::kTransfer));
      out.logits = {h_logits.data(), n};
      to_host_bytes += double(n) * 4;
    }
    if (lm_head) {
      // As the CPU engine's gemm() accounts the lm_head (which it skips without sampled rows).
      if (S > 0) {
        st.flops += 2.0 * S * V * H;
        st.weight_bytes += double(w.lm_head.nbytes());
      }
    } else {
      dev.copy_to_host(Queue::kTransfer, h_final.data(), at<float>(buf.final_rows),
                       size_t(S) * H * 4, "final_rows>h");
      dev.synchronize(dev.record(Queue::kTransfer));
      std::copy_n(h_final.data(), size_t(S) * H, final_rows);
      to_host_bytes += double(S) * H * 4;
    }
    return out;
  }

  // The step's device counters into the engine's stats.
  void account_step(const offload::StepPipelineStats& ps, int T, int M, EngineStats& st) {
    using offload::Queue;
    account_resident_gemms(T, M);
    st.device_pages_copied += ps.pages_copied;
    st.device_pages_reused += ps.pages_reused;
    st.device_bytes_reused += double(ps.bytes_reused);
    st.device_bytes_to_device += double(ps.bytes_copied) + to_device_bytes;
    st.device_bytes_to_host += to_host_bytes;
    st.device_gpu_experts += ps.gpu_experts;
    st.device_cpu_experts += ps.cpu_experts;
    st.device_peak_bytes = dev.budget().peak();
    st.device_weight_bytes += double(ps.bytes_copied);
    st.device_pinned_weight_bytes = registered_bytes;
    // Copies and work that completed by now; a prefetched page still in flight counts next step.
    const offload::QueueSeconds busy = dev.take_busy_seconds();
    st.device_weights_busy_seconds += busy[Queue::kWeights];
    st.device_transfer_busy_seconds += busy[Queue::kTransfer];
    st.device_compute_busy_seconds += busy[Queue::kCompute];
  }
};

KvCacheConfig kv_pool_config(const ModelConfig& c, const Policy& p, int64_t blocks,
                             bool with_storage) {
  KvCacheConfig k;
  k.n_layers = c.num_layers;
  k.kv_heads = c.num_kv_heads;
  k.head_dim = c.head_dim;
  if (c.attention == AttentionKind::kLatent) {  // one row per token: the latent, the RoPE key
    k.planes = 1;
    k.kv_heads = 1;
    k.head_dim = c.kv_cache_values_per_token();
  }
  k.block_size = p.kv_block_size;
  k.total_blocks = blocks;
  k.with_storage = with_storage;
  return k;
}

KvCacheConfig device_kv_config(const ModelConfig& c, const Policy& p, const OffloadSettings& s) {
  return kv_pool_config(c, p, gpu_kv_blocks(p.kv_blocks, cpu_attention_share(s)), false);
}

OffloadExecutor::OffloadExecutor(const ModelConfig& c, const ModelWeights& weights, const Policy& p,
                                 PagedKvCache& kv, const PagedKvCache* device_kv,
                                 const EngineDevice& device, DiskExperts* disk)
    : impl_(std::make_unique<Impl>(c, weights, p, kv, device_kv, device, disk)) {}
OffloadExecutor::~OffloadExecutor() = default;

int OffloadExecutor::page_slots() const {
  return impl_->slots->count();
}
int OffloadExecutor::resident_expert_layers() const {
  return impl_->resident_layers;
}
bool OffloadExecutor::lm_head_on_device() const {
  return impl_->lm_head != nullptr;
}

OffloadStepOutput OffloadExecutor::run_layers(const OffloadStepInput& in, float* final_rows,
                                              EngineStats& stats) {
  Impl& m = *impl_;
  const StepPlan& plan = *in.plan;
  const int T = plan.tokens, S = int(in.sample_rows.size());
  if (T > m.sh.T || S > m.sh.S)
    fail("offload executor: a step of {} tokens and {} samples exceeds its buffers ({} and {})", T,
         S, m.sh.T, m.sh.S);
  m.plan = &plan;
  m.item_row = in.item_row;
  m.stats = &stats;
  m.to_device_bytes = m.to_host_bytes = 0;
  m.mb_row.assign(1, 0);
  for (int end : plan.micro_batch_end) m.mb_row.push_back(in.item_row[size_t(end)]);
  m.upload_step_inputs(in, m.index_rows());
  offload::StepPipelineOptions options;
  options.cpu_expert_max_tokens = m.settings.cpu_expert_max_tokens;
  options.copy_window = m.copy_window;
  const offload::StepPipelineStats ps =
      offload::run_step(m.dev, *m.slots, m.pages, m.layer_pages, m, options, m.disk_pages.get());
  const bool greedy = m.lm_head != nullptr && in.greedy;
  m.enqueue_final_rows(S, greedy);
  OffloadStepOutput out = m.take_outputs(S, greedy, final_rows, stats);
  if (m.disk_pages) {  // the step is done on the device: its copies too
    m.disk_pages->finish_step();
    stats.disk = m.disk->stats();
  }
  m.account_step(ps, T, int(plan.micro_batch_end.size()), stats);
  m.plan = nullptr;
  m.stats = nullptr;
  return out;
}

}  // namespace sluice
