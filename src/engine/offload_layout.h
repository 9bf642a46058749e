// Where the offload executor's device memory goes: the offsets of the step buffers and of the
// resident weights inside their one allocation each, and the shapes they are sized from.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "engine/engine_device.h"
#include "model/config.h"
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

// The shapes every size below is derived from.
struct StepShape {
  int H, I, E, K, qd, kvd, V, T, S, be;
  bool f32, cpu_experts, lm_head;
  explicit StepShape(const ModelConfig& c, const Policy& p, const OffloadSettings& s)
      : H(c.hidden_size),
        I(c.expert_intermediate_size),
        E(c.num_experts),
        K(c.experts_per_token),
        qd(c.q_dim()),
        kvd(c.kv_dim()),
        V(c.vocab_size),
        // A step decodes at most B sequences and prefills at most one chunk.
        T(p.batch + p.prefill_chunk),
        S(p.batch),
        be(p.expert_batch),
        f32(p.precision == Precision::kF32),
        cpu_experts(s.cpu_expert_max_tokens > 0),
        lm_head(s.lm_head != LmHeadPlace::kHost) {}
  int qkv_row() const { return qd + 2 * kvd; }  // floats per row of a micro-batch's q|k|v block
  // Bytes per row of a micro-batch's routing block: expert ids, weights and, when experts may
  // run on the host, the row's FFN-normed hidden state (their input).
  size_t routing_row() const { return size_t(K) * 8 + (cpu_experts ? size_t(H) * 4 : 0); }
};

// Device buffers of a step: offsets into one allocation.
struct BufferLayout {
  size_t x, h, xb, qkv, attn, logits, routing, positions, sample_rows, final_rows, expert_lists, ex,
      gate, up, actb, down, cpu_block, lm_logits;
  size_t bytes;
  explicit BufferLayout(const StepShape& s) {
    ArenaLayout L;
    const size_t T = size_t(s.T), H = size_t(s.H), be = size_t(s.be), I = size_t(s.I);
    x = L.add(T * H * 4);
    h = L.add(T * H * 4);
    xb = L.add(s.f32 ? 0 : T * size_t(std::max(s.H, s.qd)) * 2);
    qkv = L.add(T * size_t(s.qkv_row()) * 4);
    attn = L.add(T * size_t(s.qd) * 4);
    logits = L.add(T * size_t(s.E) * 4);
    routing = L.add(T * s.routing_row());
    positions = L.add(T * 4);
    sample_rows = L.add(size_t(s.S) * 4);
    final_rows = L.add(size_t(s.S) * H * 4);
    expert_lists = L.add(T * size_t(s.K) * 8);
    ex = L.add(be * H * (s.f32 ? 4 : 2));
    gate = L.add(be * I * 4);
    up = L.add(be * I * 4);
    actb = L.add(s.f32 ? 0 : be * I * 2);
    down = L.add(be * H * 4);
    cpu_block = L.add(s.cpu_experts ? T * (8 + H * 4) : 0);
    // The sampled rows' logits when the lm_head runs on the device (its bf16 input is in xb).
    lm_logits = L.add(s.lm_head ? size_t(s.S) * size_t(s.V) * 4 : 0);
    bytes = L.size();
  }
};

// Resident weights of one layer: offsets into one allocation.
struct LayerResident {
  size_t attn_norm, ffn_norm, wq, wk, wv, wo, router;
};

// Lays out every layer's resident tensors; returns the bytes, fills `layers` and the RoPE table's
// offset when given.
size_t resident_layout(const ModelConfig& c, std::vector<LayerResident>* layers, size_t* inv_freq);
size_t expert_matrix_bytes(const ModelConfig& c);  // one expert matrix, I·H bf16

// The resident experts of `resident_layers` layers: per layer the gate, up and down tensors of
// every expert ([E, I, H] bf16 each), one after the other. Offset of a layer's matrix m
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

// The executor's count of resident expert layers for its settings: -1 (not set) is none; more
// than the model's layers is an error.
int resident_expert_layers(const ModelConfig& c, const OffloadSettings& s);

}  // namespace sluice
