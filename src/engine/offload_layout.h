// Where the offload executor's device memory goes: the offsets of the step buffers and of the
// resident weights inside their one allocation each, and the shapes they are sized from.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "engine/engine_device.h"
#include "kernels/cpu/gemm_fp8.h"
#include "model/config.h"
#include "model/fp8_weights.h"
#include "runtime/planner/gpu_kv_blocks.h"
#include "runtime/policy.h"

namespace sluice {

// Offsets of many buffers in one device allocation, each aligned for any kernel's loads.
class ArenaLayout {
 public:
  size_t add(size_t bytes) {
    const size_t at = (size_ + 255) / 256 * 256;
    size_ = at + bytes;
    return at;
  }
  size_t size() const { return (size_ + 255) / 256 * 256; }

 private:
  size_t size_ = 0;
};

// ω of the settings: -1 (not set) is 1, all attention on the host; outside [0, 1] is an error.
double cpu_attention_share(const OffloadSettings& s);

// The largest dense_mlp_size over the layers (0 when no layer has a dense MLP).
int widest_dense_mlp(const ModelConfig& c);

// The shapes every size below is derived from.
// With multi-head latent attention the q|k|v block holds q and kv_a_proj_with_mqa's output (kvd
// = kv_lora_rank + qk_rope_head_dim, no v: vd = 0), attention outputs are ad = heads·v_head_dim
// wide, and q may pass through a q_lora_rank bottleneck (qa).
struct BufferShape {
  int H, I, E, K, qd, kvd, vd, ad, qa, V, T, S, be;
  int dbe;    // rows per expert and dense-MLP GEMM on the device (Policy::device_expert_rows)
  int mlp_I;  // the widest dense MLP (shared expert or dense layer); 0: none
  bool f32, cpu_experts, lm_head;
  int64_t gpu_kv_blocks;  // the device KV pool (the GPU share of attention); 0: none
  int64_t fp8_tile;       // bf16 elements of the FP8 GEMMs' dequantisation scratch; 0: none
  explicit BufferShape(const ModelConfig& c, const Policy& p, const OffloadSettings& s)
      : H(c.hidden_size),
        I(c.expert_intermediate_size),
        E(c.num_experts),
        K(c.experts_per_token),
        qd(c.q_dim()),
        kvd(c.attention == AttentionKind::kLatent ? c.kv_cache_values_per_token() : c.kv_dim()),
        vd(c.attention == AttentionKind::kLatent ? 0 : c.kv_dim()),
        ad(c.attn_out_dim()),
        qa(c.attention == AttentionKind::kLatent ? c.mla.q_lora_rank : 0),
        V(c.vocab_size),
        // A step decodes at most B sequences and prefills at most one chunk.
        T(p.batch + p.prefill_chunk),
        S(p.logit_rows > 0 ? p.logit_rows : p.batch),
        be(p.expert_batch),
        dbe(p.device_expert_rows()),
        mlp_I(widest_dense_mlp(c)),
        f32(p.precision == Precision::kF32),
        cpu_experts(s.cpu_expert_max_tokens > 0),
        lm_head(s.lm_head != LmHeadPlace::kHost),
        gpu_kv_blocks(sluice::gpu_kv_blocks(p.kv_blocks, cpu_attention_share(s))),
        fp8_tile(fp8_tile_elements(c)) {}
  bool gpu_attention() const { return gpu_kv_blocks > 0; }
  int qkv_row() const { return qd + kvd + vd; }  // floats per row of a micro-batch's q|k|v block
  // The widest bf16 GEMM input of the attention block (h, the q-LoRA rows, the output).
  int xb_row() const { return std::max({H, qd, ad, qa}); }
  // Bytes per row of a micro-batch's routing block: expert ids, weights and, when experts may
  // run on the host, the row's FFN-normed hidden state (their input).
  size_t routing_row() const { return size_t(K) * 8 + (cpu_experts ? size_t(H) * 4 : 0); }
};

// The step's row indices for the GPU share of attention: kAttentionIndexArrays int32 arrays of T,
// each indexed from a micro-batch's first row r0 (rows relative to r0):
//   cpu_rows   the CPU share's rows, gathered into the q|k|v block that goes to the host
//   gpu_rows   the GPU share's rows, whose K/V are written and q gathered on the device
//   merge      per row, its output's index in the micro-batch's [GPU rows | CPU rows] outputs
//   gpu_pos, gpu_table, gpu_slot
//              per GPU row: position, offset of its block table, flat device pool slot
enum AttentionIndex : size_t { kCpuRows, kGpuRows, kMerge, kGpuPos, kGpuTable, kGpuSlot };
constexpr size_t kAttentionIndexArrays = 6;

// Device buffers of a step: offsets into one allocation.
struct BufferLayout {
  size_t x, h, xb, qkv, q_a, attn, logits, routing, positions, sample_rows, final_rows,
      expert_lists, ex, gate, up, actb, down, cpu_block, lm_logits;
  size_t mlp_scale;  // per row: sigmoid of the dense MLP's gate (when the model has one)
  size_t fp8_tile;   // FP8 weights: the device GEMM's dequantised row panels (gemm_fp8)
  // The GPU share of attention (empty without one): the CPU share's q|k|v gathered per
  // micro-batch, the GPU share's q, both shares' outputs ([GPU rows | CPU rows] per micro-batch),
  // the step's row indices (AttentionIndex) and the GPU share's block tables.
  size_t qkv_cpu, q_gpu, attn_parts, attn_index, tables;
  size_t bytes;
  explicit BufferLayout(const BufferShape& s) {
    ArenaLayout L;
    // The experts' and the dense MLP's intermediate rows share the gate/up/act buffers.
    const size_t T = size_t(s.T), H = size_t(s.H), dbe = size_t(s.dbe),
                 I = size_t(std::max(s.I, s.mlp_I));
    x = L.add(T * H * 4);
    h = L.add(T * H * 4);
    xb = L.add(s.f32 ? 0 : T * size_t(s.xb_row()) * 2);
    qkv = L.add(T * size_t(s.qkv_row()) * 4);
    q_a = L.add(T * size_t(s.qa) * 4);  // MLA's q-LoRA rows
    attn = L.add(T * size_t(s.ad) * 4);
    logits = L.add(T * size_t(s.E) * 4);
    routing = L.add(T * s.routing_row());
    positions = L.add(T * 4);
    sample_rows = L.add(size_t(s.S) * 4);
    final_rows = L.add(size_t(s.S) * H * 4);
    expert_lists = L.add(T * size_t(s.K) * 8);
    ex = L.add(dbe * H * (s.f32 ? 4 : 2));
    gate = L.add(dbe * I * 4);
    up = L.add(dbe * I * 4);
    actb = L.add(s.f32 ? 0 : dbe * I * 2);
    down = L.add(dbe * H * 4);
    cpu_block = L.add(s.cpu_experts ? T * (8 + H * 4) : 0);
    // The sampled rows' logits when the lm_head runs on the device (its bf16 input is in xb).
    lm_logits = L.add(s.lm_head ? size_t(s.S) * size_t(s.V) * 4 : 0);
    mlp_scale = L.add(s.mlp_I > 0 ? T * 4 : 0);
    fp8_tile = L.add(size_t(s.fp8_tile) * 2);
    const bool g = s.gpu_attention();
    qkv_cpu = L.add(g ? T * size_t(s.qkv_row()) * 4 : 0);
    q_gpu = L.add(g ? T * size_t(s.qd) * 4 : 0);
    attn_parts = L.add(g ? T * size_t(s.ad) * 4 : 0);
    attn_index = L.add(g ? T * kAttentionIndexArrays * 4 : 0);
    tables = L.add(size_t(s.gpu_kv_blocks) * 4);
    bytes = L.size();
  }
};

// Resident weights of one layer: offsets into one allocation.
// Every tensor is laid out in every layer; an absent one (its config feature off, or no MoE
// block in a dense layer) takes no bytes, and `has` says which are present.
// Multi-head latent attention keeps q_proj in wq (or q_a, q_a_norm and q_b with q-LoRA) and
// kv_a_proj_with_mqa in kv_a; its kv_b_proj stays on the host, where its attention runs.
// The projections (wq … kv_a, and the dense MLP unless quantized) are bf16, or with FP8 weights
// in fp8_device_matrix's form.
struct LayerResident {
  size_t attn_norm, ffn_norm, wq, wk, wv, wo;
  size_t q_a, q_a_norm, q_b, kv_a;    // MLA's
  size_t router_bias;                 // fp32 [E], a MoE layer's selection bias
  size_t router;                      // bf16 [E, H]; a MoE layer's
  size_t q_norm, k_norm;              // fp32, when the model has q/k norms
  size_t bq, bk, bv, bo;              // fp32, when the model has projection biases
  size_t mlp_gate, mlp_up, mlp_down;  // the layer's dense MLP (shared expert or dense FFN): bf16,
                                      // FP8, or packed with quantized experts
  size_t mlp_scale;                   // bf16 [1, H], the dense MLP's sigmoid gate
  bool moe = true, qkv_bias = false, o_bias = false, mlp_scaled = false;
  int mlp_I = 0;  // the dense MLP's intermediate size; 0: none
};

// Lays out every layer's resident tensors; returns the bytes, fills `layers` and the RoPE table's
// offset when given.
size_t resident_layout(const ModelConfig& c, std::vector<LayerResident>* layers, size_t* inv_freq);
// An FP8 matrix as the device holds it (a resident projection, an expert page): its block scales,
// fp32 [⌈n/128⌉, ⌈k/128⌉], then its n·k e4m3 codes: fp8_matrix_bytes in all, and the scales
// first so that they are 4-byte aligned whatever n·k is. The kernels' view of one at `base`.
cpu::Fp8Matrix fp8_device_matrix(const void* base, int64_t n, int64_t k);

// One expert matrix as the config holds it: I·H bf16, FP8 (codes and block scales), or the
// larger of the packed w1/w3 and w2 with quantized experts (a page, and the stride of the resident
// experts).
size_t expert_matrix_bytes(const ModelConfig& c);

// The resident experts of `resident_layers` layers: per layer the gate, up and down tensors of
// every expert (E matrices of expert_matrix_bytes each), one after the other. Offset of a layer's matrix m
// (0 gate, 1 up, 2 down) of expert e, for the j-th resident layer.
size_t resident_experts_bytes(const ModelConfig& c, int resident_layers);
size_t resident_expert_offset(const ModelConfig& c, int j, int m, int e);

// The lm_head on the device: its [V, H] bf16 weights, then the final norm's fp32 weights.
struct LmHeadLayout {
  size_t lm_head = 0, final_norm = 0, bytes = 0;
  explicit LmHeadLayout(const ModelConfig& c) {
    ArenaLayout L;
    lm_head = L.add(size_t(c.vocab_size) * size_t(c.hidden_size) * 2);
    final_norm = L.add(size_t(c.hidden_size) * 4);
    bytes = L.size();
  }
};

// The device KV pool of the GPU share of attention: `blocks` blocks of the host cache's layout,
// layer by layer ([layer][block][K|V][kv_head][slot][head_dim] bf16).
struct DeviceKvLayout {
  int64_t blocks = 0;
  size_t layer_bytes = 0, bytes = 0;
  DeviceKvLayout(const ModelConfig& c, const Policy& p, int64_t pool_blocks)
      : blocks(pool_blocks),
        layer_bytes(size_t(pool_blocks) * 2 * size_t(c.num_kv_heads) * size_t(p.kv_block_size) *
                    size_t(c.head_dim) * 2),
        bytes(layer_bytes * size_t(c.num_layers)) {}
};

// The executor's count of resident expert layers for its settings: -1 (not set) is none; more
// than the model's layers is an error.
int resident_expert_layers(const ModelConfig& c, const OffloadSettings& s);

}  // namespace sluice
