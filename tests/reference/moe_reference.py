#!/usr/bin/python3
"""An independent PyTorch reference for the forward pass of the Hugging Face MoE families sluice
loads: MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM,
DbrxForCausalLM, DeepseekV2ForCausalLM and DeepseekV3ForCausalLM.

Written from the semantics of transformers' modeling_<family>.py, configuration_<family>.py and
masking_utils.py, with no dependency beyond torch (Debian's python3-torch): it reads config.json
and the safetensors files itself and writes its results as a safetensors file itself. Each family
is a Settings reader (its config.json fields, with its config class's defaults) and the names of
its tensors; the forward below reads the quirks off the settings.

Everything is computed in float32 (stored BF16/F16 weights are upcast), the whole sequence at once
without a KV cache, so it checks sluice's cached prefill + decode path from the other side.

The intermediates written are named as sluice's ReferenceForward dump names them:
  embed                 embed_tokens(input_ids)
  layer.{i}.attn_out    self_attn output (o_proj), before the residual add
  layer.{i}.moe_out     the FFN block's output (the sparse MoE block, or a dense layer's MLP),
                        before the residual add
  layer.{i}.out         hidden state leaving decoder layer i
  final_norm            model.norm(hidden)
  logits                lm_head(final_norm)
each as a [tokens, cols] F32 tensor.

Usage:
  moe_reference.py --model DIR --tokens 1,2,3 --out FILE.safetensors
  moe_reference.py --batch JOBS.json   # [{"model": DIR, "tokens": [..], "out": FILE}, ...]
The batch form pays the torch import once for many models.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch

# ---------------------------------------------------------------------------------------------
# config.json, with each family's config class defaults for absent fields.


class Settings:
    """What the forward needs, whatever the family; the readers below fill it."""

    qk_norm = None          # None, "head" (over each head) or "full" (over the projection)
    clip_qkv = None         # q, k, v clamped to [-clip_qkv, clip_qkv] after the norms
    shared_expert = False   # the sparse block's shared_expert and shared_expert_gate
    qkv_bias = False        # q_proj, k_proj, v_proj biases
    o_bias = False
    dense_layers = ()       # layers whose FFN is a dense MLP of intermediate_size
    norm_topk = True
    moe_prefix = "mlp."     # the MoE block's module name in the layer
    router_name = "gate"
    expert_names = ("gate_proj", "up_proj", "down_proj")  # gate, up, down
    mla = False             # DeepSeek's multi-head latent attention (the q_lora_rank ... fields)
    yarn = None             # the rope_scaling dict of a YaRN config
    rope_interleave = False  # RoPE on adjacent pairs (DeepSeek) instead of the two halves
    scoring = "softmax"     # "softmax" or "sigmoid" router scores
    topk_method = "greedy"  # "greedy", "group_limited_greedy" (V2) or "noaux_tc" (V3)
    routed_scaling_factor = 1.0
    shared_experts = False  # DeepSeek's unscaled shared_experts MLP


def _config_getter(cfg):
    def get(key, default):
        # A key that is absent takes the class default; an explicit null is kept.
        return cfg[key] if key in cfg else default
    return get


def _read_common(s, cfg, path, kv_default, eps_default, theta_default):
    get = _config_getter(cfg)
    s.vocab_size = get("vocab_size", None)
    s.hidden_size = get("hidden_size", None)
    s.num_layers = get("num_hidden_layers", None)
    s.num_heads = get("num_attention_heads", None)
    # Absent: the class default; null: as many KV heads as query heads (__post_init__).
    kv = get("num_key_value_heads", kv_default)
    s.num_kv_heads = s.num_heads if kv is None else kv
    s.head_dim = get("head_dim", None) or s.hidden_size // s.num_heads
    s.rms_norm_eps = get("rms_norm_eps", eps_default)
    s.max_position_embeddings = get("max_position_embeddings", None)
    s.tie_word_embeddings = get("tie_word_embeddings", False)
    act = get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}: field 'hidden_act': expected 'silu', got {act!r}")
    # RoPE: transformers 4.x keeps `rope_theta` at the top level (and `rope_scaling` for
    # variants); 5.x folds both into `rope_parameters`.
    s.rope_theta = get("rope_theta", theta_default)
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        if rope is None:
            continue
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "yarn":
            s.yarn = rope
        elif rope_type != "default":
            raise ValueError(f"{path}: field '{key}': rope type {rope_type!r} is not "
                             "implemented by this reference; expected 'default'")
        if "rope_theta" in rope:
            s.rope_theta = rope["rope_theta"]
    if s.num_heads % s.num_kv_heads:
        raise ValueError(f"{path}: num_attention_heads {s.num_heads} is not a multiple of "
                         f"num_key_value_heads {s.num_kv_heads}")


def mixtral_settings(cfg, path):
    # MixtralConfig: 8 KV heads, eps 1e-5, theta 1e6; MixtralSparseMoeBlock renormalises.
    s = Settings()
    _read_common(s, cfg, path, kv_default=8, eps_default=1e-5, theta_default=1e6)
    get = _config_getter(cfg)
    s.sliding_window = get("sliding_window", None)
    s.num_experts = get("num_local_experts", 8)
    s.top_k = get("num_experts_per_tok", 2)
    s.moe_intermediate_size = get("intermediate_size", 14336)
    s.moe_prefix = "block_sparse_moe."
    s.expert_names = ("w1", "w3", "w2")
    return s


def _qwen_dense_layers(get, num_layers):
    # Qwen{2,3}MoeDecoderLayer: the sparse block iff layer not in mlp_only_layers and
    # (layer + 1) % decoder_sparse_step == 0.
    only = get("mlp_only_layers", None) or []
    step = get("decoder_sparse_step", 1)
    return {i for i in range(num_layers) if i in only or (i + 1) % step != 0}


def qwen3_moe_settings(cfg, path):
    # Qwen3MoeConfig: 4 KV heads, eps 1e-6, theta 1e4; q_norm/k_norm over head_dim
    # (Qwen3MoeAttention); sliding_window only with use_sliding_window (__post_init__).
    s = Settings()
    _read_common(s, cfg, path, kv_default=4, eps_default=1e-6, theta_default=10000.0)
    get = _config_getter(cfg)
    s.sliding_window = get("sliding_window", 4096) if get("use_sliding_window", False) else None
    s.num_experts = get("num_experts", 128)
    s.top_k = get("num_experts_per_tok", 8)
    s.norm_topk = get("norm_topk_prob", False)
    s.moe_intermediate_size = get("moe_intermediate_size", 768)
    s.intermediate_size = get("intermediate_size", 6144)
    s.qk_norm = "head"
    s.qkv_bias = s.o_bias = get("attention_bias", False)
    s.dense_layers = _qwen_dense_layers(get, s.num_layers)
    return s


def olmoe_settings(cfg, path):
    # OlmoeConfig: KV heads None (one per query head), eps 1e-5, theta 1e4; OlmoeAttention:
    # head_dim = hidden_size // heads, q_norm(q_proj(x)) over the whole projection, then
    # clamp(±clip_qkv) of q, k and v when clip_qkv is set.
    s = Settings()
    _read_common(s, cfg, path, kv_default=None, eps_default=1e-5, theta_default=10000.0)
    get = _config_getter(cfg)
    s.head_dim = s.hidden_size // s.num_heads
    s.sliding_window = None
    s.num_experts = get("num_experts", 64)
    s.top_k = get("num_experts_per_tok", 8)
    s.norm_topk = get("norm_topk_prob", False)
    s.qk_norm = "full"
    s.qkv_bias = s.o_bias = get("attention_bias", False)
    s.clip_qkv = get("clip_qkv", None)
    return s


def qwen2_moe_settings(cfg, path):
    # Qwen2MoeConfig: 16 KV heads, eps 1e-6, theta 1e4; q/k/v biases (qkv_bias, default true);
    # every sparse block adds a shared expert scaled by sigmoid(shared_expert_gate(x)).
    s = Settings()
    _read_common(s, cfg, path, kv_default=16, eps_default=1e-6, theta_default=10000.0)
    get = _config_getter(cfg)
    if get("use_sliding_window", False):
        raise ValueError(f"{path}: use_sliding_window (per-layer windows) is not implemented by "
                         "this reference")
    s.sliding_window = None
    s.num_experts = get("num_experts", 60)
    s.top_k = get("num_experts_per_tok", 4)
    s.norm_topk = get("norm_topk_prob", False)
    s.qkv_bias = get("qkv_bias", True)
    s.shared_expert = True
    s.dense_layers = _qwen_dense_layers(get, s.num_layers)
    return s


def dbrx_settings(cfg, path):
    # DbrxConfig: d_model 2048, n_heads 16, n_layers 24, max_seq_len 2048, vocab 32000; nested
    # DbrxAttentionConfig (kv_n_heads 1, rope_theta 1e4, clip_qkv None) and DbrxFFNConfig
    # (ffn_hidden_size 3584, 4 experts, top 1, moe_normalize_expert_weights 1). Norms are
    # nn.LayerNorm(d_model, bias=False), eps 1e-5; head_dim = d_model // n_heads.
    s = Settings()
    get = _config_getter(cfg)
    attn = get("attn_config", None) or {}
    ffn = get("ffn_config", None) or {}
    s.dbrx = True
    s.vocab_size = get("vocab_size", 32000)
    s.hidden_size = get("d_model", 2048)
    s.num_layers = get("n_layers", 24)
    s.num_heads = get("n_heads", 16)
    s.num_kv_heads = attn.get("kv_n_heads", 1)
    s.head_dim = s.hidden_size // s.num_heads
    s.rope_theta = attn.get("rope_theta", 10000.0)
    s.clip_qkv = attn.get("clip_qkv", None)
    s.layer_norm_eps = 1e-5
    s.tie_word_embeddings = False
    s.sliding_window = None
    s.num_experts = ffn.get("moe_num_experts", 4)
    s.top_k = ffn.get("moe_top_k", 1)
    s.moe_intermediate_size = ffn.get("ffn_hidden_size", 3584)
    s.normalize_p = ffn.get("moe_normalize_expert_weights", 1.0)
    act = (ffn.get("ffn_act_fn") or {"name": "silu"}).get("name", "silu")
    if act != "silu":
        raise ValueError(f"{path}: field 'ffn_config.ffn_act_fn': expected silu, got {act!r}")
    return s


def _deepseek_common(s, cfg, path, v3):
    # DeepseekV{2,3}Config defaults; head_dim (the rotary dim) is qk_rope_head_dim.
    get = _config_getter(cfg)
    s.mla = True
    s.q_lora_rank = get("q_lora_rank", 1536)
    s.kv_lora_rank = get("kv_lora_rank", 512)
    s.qk_nope_head_dim = get("qk_nope_head_dim", 128)
    s.qk_rope_head_dim = get("qk_rope_head_dim", 64)
    s.v_head_dim = get("v_head_dim", 128)
    s.head_dim = s.qk_rope_head_dim
    s.max_position_embeddings = get("max_position_embeddings", 4096 if v3 else 2048)
    s.sliding_window = None
    s.num_experts = get("n_routed_experts", 256 if v3 else 64)
    s.top_k = get("num_experts_per_tok", 8 if v3 else None)
    s.moe_intermediate_size = get("moe_intermediate_size", 2048 if v3 else 1407)
    s.routed_scaling_factor = get("routed_scaling_factor", 2.5 if v3 else 1.0)
    s.n_group = get("n_group", 8 if v3 else None)
    s.topk_group = get("topk_group", 4 if v3 else None)
    n_shared = get("n_shared_experts", 1 if v3 else 2)
    s.shared_experts = bool(n_shared)
    # The remote code's rule (transformers reads first_k_dense_replace only; the same for
    # moe_layer_freq 1): MoE iff layer >= first_k_dense_replace and layer % moe_layer_freq == 0.
    first_k = get("first_k_dense_replace", 3 if v3 else 0)
    freq = get("moe_layer_freq", 1)
    s.dense_layers = {i for i in range(s.num_layers) if i < first_k or i % freq != 0}
    s.moe_prefix = "mlp."
    if get("attention_bias", False):
        raise ValueError(f"{path}: attention_bias is not implemented by this reference")


def deepseek_v2_settings(cfg, path):
    # DeepseekV2Config: KV heads None (one per head), eps 1e-6, theta 1e4. DeepseekV2Moe:
    # softmax, greedy or group_limited_greedy (group = its max), weights * routed_scaling_factor,
    # never renormalised. RoPE in the complex (adjacent pair) form.
    s = Settings()
    _read_common(s, cfg, path, kv_default=None, eps_default=1e-6, theta_default=10000.0)
    _deepseek_common(s, cfg, path, v3=False)
    get = _config_getter(cfg)
    s.scoring = "softmax"
    s.topk_method = get("topk_method", "greedy")
    if s.topk_method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"{path}: unknown topk_method {s.topk_method!r}")
    s.norm_topk = False
    s.rope_interleave = True
    return s


def deepseek_v3_settings(cfg, path):
    # DeepseekV3Config: 128 KV heads, eps 1e-6, theta 1e4. DeepseekV3TopkRouter: sigmoid, the
    # e_score_correction_bias for the choice only, groups scored by the sum of their top 2,
    # renormalised (+1e-20) when norm_topk_prob, times routed_scaling_factor.
    s = Settings()
    _read_common(s, cfg, path, kv_default=128, eps_default=1e-6, theta_default=10000.0)
    _deepseek_common(s, cfg, path, v3=True)
    get = _config_getter(cfg)
    s.scoring = "sigmoid"
    s.topk_method = "noaux_tc"
    s.norm_topk = get("norm_topk_prob", True)
    s.rope_interleave = get("rope_interleave", True)
    return s


FAMILIES = {
    "MixtralForCausalLM": mixtral_settings,
    "Qwen3MoeForCausalLM": qwen3_moe_settings,
    "OlmoeForCausalLM": olmoe_settings,
    "Qwen2MoeForCausalLM": qwen2_moe_settings,
    "DbrxForCausalLM": dbrx_settings,
    "DeepseekV2ForCausalLM": deepseek_v2_settings,
    "DeepseekV3ForCausalLM": deepseek_v3_settings,
}


def read_settings(path):
    with open(path) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object")
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in FAMILIES:
        raise ValueError(f"{path}: architecture {arch!r} is not one of {sorted(FAMILIES)}")
    s = FAMILIES[arch](cfg, path)
    s.dbrx = getattr(s, "dbrx", False)
    return s


# ---------------------------------------------------------------------------------------------
# safetensors, read and written by hand: u64 little-endian header length, JSON header, raw data.


def _raw_dtype(name, path, tensor):
    table = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.int16,
             "F8_E4M3": torch.uint8}
    if name not in table:
        raise ValueError(f"{path}: tensor '{tensor}': dtype {name} is not BF16, F16, F32 "
                         "or F8_E4M3")
    return table[name]


def e4m3_to_float(codes):
    """float8 e4m3fn codes (uint8) to their float32 values, exactly: 1 sign, 4 exponent bits
    (bias 7), 3 mantissa bits, exponent 0 subnormal, S.1111.111 NaN, no infinity. By hand, so
    that a torch without torch.float8_e4m3fn (Debian's 1.13) reads them too."""
    c = codes.to(torch.int32)
    exponent, mantissa = (c >> 3) & 15, (c & 7).to(torch.float32)
    normal = (1 + mantissa / 8) * torch.pow(2.0, (exponent - 7).to(torch.float32))
    value = torch.where(exponent == 0, mantissa * 2.0 ** -9, normal)
    value = torch.where((c & 0x7f) == 0x7f, torch.full_like(value, float("nan")), value)
    return torch.where((c & 0x80) != 0, -value, value)


def dequantize_fp8_blocks(codes, scale_inv, block=128):
    """DeepSeek-V3's weight_dequant (inference/kernel.py) and transformers' Fp8Dequantize:
    every 128 x 128 block of the weight times its weight_scale_inv, in fp32, stored as the
    model's bf16. The last blocks of a row or column may be partial (e.g. 576 rows)."""
    rows, cols = codes.shape
    expected = [(rows + block - 1) // block, (cols + block - 1) // block]
    if list(scale_inv.shape) != expected:
        raise ValueError(f"weight_scale_inv of shape {list(scale_inv.shape)}, expected {expected}")
    scale = scale_inv.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return (codes * scale).to(torch.bfloat16).to(torch.float32)


def read_safetensors(path, fp8):
    """The tensors of one file as float32; the names of the F8_E4M3 ones are added to `fp8`."""
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    (header_len,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data_start = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        shape = info["shape"]
        raw = _raw_dtype(info["dtype"], path, name)
        count = math.prod(shape)
        elem = torch.tensor([], dtype=raw).element_size()
        if end - begin != count * elem:
            raise ValueError(f"{path}: tensor '{name}': data_offsets hold {end - begin} bytes, "
                             f"shape {shape} {info['dtype']} needs {count * elem}")
        if count == 0:
            t = torch.zeros(shape, dtype=torch.float32)
        else:
            t = torch.frombuffer(blob, dtype=raw, count=count, offset=data_start + begin)
            if info["dtype"] == "BF16":
                t = t.view(torch.bfloat16)  # same bits, reinterpreted
            t = e4m3_to_float(t) if info["dtype"] == "F8_E4M3" else t.to(torch.float32)
            t = t.reshape(shape)
            if info["dtype"] == "F8_E4M3":
                fp8.add(name)
        tensors[name] = t
    return tensors


class Weights(dict):
    def __init__(self, model_dir):
        super().__init__()
        self.model_dir = model_dir

    def __missing__(self, name):
        raise ValueError(f"{self.model_dir}: tensor '{name}' is missing from the checkpoint")


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = Weights(model_dir)
    fp8 = set()
    for name in files:
        tensors.update(read_safetensors(os.path.join(model_dir, name), fp8))
    # FP8 checkpoints (DeepSeek-V3): each F8_E4M3 weight dequantised with its weight_scale_inv.
    for name in fp8:
        scale_name = name + "_scale_inv"
        if scale_name not in tensors:
            raise ValueError(f"{model_dir}: tensor '{name}' is F8_E4M3 without '{scale_name}'")
        tensors[name] = dequantize_fp8_blocks(tensors[name], tensors.pop(scale_name))
    return tensors


def write_safetensors(path, named):
    """Writes F32 tensors, in the given order, with the header padded to 8 bytes."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in named:
        data = _f32_bytes(t)
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def _f32_bytes(t):
    # Through a uint8 view rather than .numpy(), so numpy is not needed.
    flat = t.detach().to(torch.float32).contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).tolist())


# ---------------------------------------------------------------------------------------------
# The model.


def rms_norm(x, weight, eps):
    # {Mixtral,Qwen3Moe,Olmoe}RMSNorm: variance in fp32, x * rsqrt(variance + eps), then the weight.
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _yarn_get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(cfg):
    """inv_freq and the attention factor, as modeling_rope_utils computes them (default, yarn)."""
    d, base = cfg.head_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
    if cfg.yarn is None:
        return 1.0 / pos_freqs, 1.0
    y = cfg.yarn
    factor = float(y["factor"])
    original = y.get("original_max_position_embeddings") or cfg.max_position_embeddings
    mscale, mscale_all_dim = y.get("mscale"), y.get("mscale_all_dim")
    attention_factor = y.get("attention_factor")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor,
                                                                                  mscale_all_dim)
        else:
            attention_factor = _yarn_get_mscale(factor)
    beta_fast, beta_slow = y.get("beta_fast") or 32, y.get("beta_slow") or 1

    def correction_dim(rotations):
        return (d * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if y.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_share = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_share) + \
        (1.0 / pos_freqs) * extrapolation_share
    return inv_freq, attention_factor


def rope_cos_sin(cfg, positions):
    # inv_freq = 1 / theta^(arange(0, d, 2) / d) (or YaRN's); freqs = position * inv_freq;
    # emb = cat(freqs, freqs); cos and sin times the attention factor. All fp32, as the rotary
    # embeddings force.
    inv_freq, attention_factor = rope_inv_freq(cfg)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def apply_rope(cfg, x, cos, sin):
    """x [..., T, d]. With rope_interleave, V3's apply_rotary_pos_emb_interleave: the adjacent
    pairs (x[2i], x[2i+1]) permuted to the two halves, then rotate_half (V2's complex product
    gives the same values in the unpermuted order, hence the same dot products)."""
    if cfg.rope_interleave:
        d = x.shape[-1]
        x = x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(*x.shape[:-1], d)
    return x * cos + rotate_half(x) * sin


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_mask(cfg, seq_len):
    """True where query q may attend key k.

    masking_utils: causal_mask_function is kv_idx <= q_idx; with a sliding window it is AND-ed
    with sliding_window_overlay, kv_idx > q_idx - sliding_window. So a query sees exactly
    `sliding_window` keys, itself included. (Some older 4.x releases built the eager mask with
    tril(diagonal = past - sliding_window - 1), which kept one key more; we follow the current
    rule, which also matches the flash-attention path.)
    """
    q = torch.arange(seq_len)[:, None]
    k = torch.arange(seq_len)[None, :]
    allowed = k <= q
    if cfg.sliding_window is not None:
        allowed &= k > q - cfg.sliding_window
    return allowed


def linear(x, w, prefix, bias):
    y = x @ w[prefix + ".weight"].T
    return y + w[prefix + ".bias"] if bias else y


def project_qkv(cfg, w, prefix, h):
    """q, k, v as [heads, T, head_dim], normed as the family's attention does, before RoPE."""
    T, D = h.shape[0], cfg.head_dim
    q = linear(h, w, prefix + "q_proj", cfg.qkv_bias)
    k = linear(h, w, prefix + "k_proj", cfg.qkv_bias)
    v = linear(h, w, prefix + "v_proj", cfg.qkv_bias)
    if cfg.qk_norm == "head":  # Qwen3: q_norm(q_proj(x).view(..., -1, head_dim))
        q = rms_norm(q.view(T, -1, D), w[prefix + "q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k.view(T, -1, D), w[prefix + "k_norm.weight"], cfg.rms_norm_eps)
    elif cfg.qk_norm == "full":  # OLMoE: q_norm(q_proj(x))
        q = rms_norm(q, w[prefix + "q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, w[prefix + "k_norm.weight"], cfg.rms_norm_eps)
    if cfg.clip_qkv is not None:  # query_states.clamp_(min=-clip_qkv, max=clip_qkv), k, v alike
        q = q.clamp(min=-cfg.clip_qkv, max=cfg.clip_qkv)
        k = k.clamp(min=-cfg.clip_qkv, max=cfg.clip_qkv)
        v = v.clamp(min=-cfg.clip_qkv, max=cfg.clip_qkv)
    q = q.reshape(T, cfg.num_heads, D).transpose(0, 1)
    k = k.reshape(T, cfg.num_kv_heads, D).transpose(0, 1)
    v = v.reshape(T, cfg.num_kv_heads, D).transpose(0, 1)
    return q, k, v


def latent_attention(cfg, w, prefix, h, cos, sin, allowed):
    """DeepseekV{2,3}Attention in the plain form: q from q_proj or the q-LoRA path, k_nope and v
    from kv_b_proj(kv_a_layernorm(latent)), one RoPE key shared by all heads."""
    T, N, P, V = h.shape[0], cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if cfg.q_lora_rank is None:
        q = linear(h, w, prefix + "q_proj", False)
    else:
        qa = rms_norm(linear(h, w, prefix + "q_a_proj", False), w[prefix + "q_a_layernorm.weight"],
                      cfg.rms_norm_eps)
        q = linear(qa, w, prefix + "q_b_proj", False)
    q = q.view(T, cfg.num_heads, N + P).transpose(0, 1)
    q_nope, q_pe = torch.split(q, [N, P], dim=-1)
    compressed = linear(h, w, prefix + "kv_a_proj_with_mqa", False)
    latent, k_pe = torch.split(compressed, [cfg.kv_lora_rank, P], dim=-1)
    kv = linear(rms_norm(latent, w[prefix + "kv_a_layernorm.weight"], cfg.rms_norm_eps), w,
                prefix + "kv_b_proj", False)
    kv = kv.view(T, cfg.num_heads, N + V).transpose(0, 1)
    k_nope, v = torch.split(kv, [N, V], dim=-1)
    q_pe = apply_rope(cfg, q_pe, cos, sin)
    k_pe = apply_rope(cfg, k_pe.view(1, T, P), cos, sin).expand(cfg.num_heads, T, P)
    q = torch.cat((q_nope, q_pe), dim=-1)
    k = torch.cat((k_nope, k_pe), dim=-1)
    # scaling = qk_head_dim^-0.5, times mscale² when YaRN has an mscale_all_dim.
    scaling = (N + P) ** -0.5
    if cfg.yarn is not None and cfg.yarn.get("mscale_all_dim"):
        m = _yarn_get_mscale(float(cfg.yarn["factor"]), cfg.yarn["mscale_all_dim"])
        scaling = scaling * m * m
    scores = (q @ k.transpose(1, 2)) * scaling
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (probs @ v).transpose(0, 1).reshape(T, cfg.num_heads * V)
    return linear(out, w, prefix + "o_proj", False)


def self_attention(cfg, w, prefix, h, cos, sin, allowed):
    if cfg.mla:
        return latent_attention(cfg, w, prefix, h, cos, sin, allowed)
    T, D = h.shape[0], cfg.head_dim
    q, k, v = project_qkv(cfg, w, prefix, h)
    q = apply_rope(cfg, q, cos, sin)
    k = apply_rope(cfg, k, cos, sin)
    # repeat_kv: KV head j serves query heads [j*group, (j+1)*group).
    group = cfg.num_heads // cfg.num_kv_heads
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(1, 2)) * (D ** -0.5)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (probs @ v).transpose(0, 1).reshape(T, cfg.num_heads * D)
    return linear(out, w, prefix + "o_proj", cfg.o_bias)


def swiglu(x, w, gate, up, down):
    # down(silu(gate x) * up x)
    y = torch.nn.functional.silu(x @ w[gate + ".weight"].T) * (x @ w[up + ".weight"].T)
    return y @ w[down + ".weight"].T


def deepseek_route(cfg, w, prefix, h):
    """DeepseekV2Moe.route_tokens_to_experts / DeepseekV3TopkRouter: (indices, weights)."""
    logits = h @ w[prefix + "gate.weight"].T
    E = cfg.num_experts
    if cfg.scoring == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = logits.sigmoid()
    choice = scores
    if cfg.topk_method == "noaux_tc":
        choice = scores + w[prefix + "gate.e_score_correction_bias"][None, :]
    if cfg.topk_method in ("group_limited_greedy", "noaux_tc"):
        grouped = choice.view(-1, cfg.n_group, E // cfg.n_group)
        if cfg.topk_method == "group_limited_greedy":
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, cfg.n_group, E // cfg.n_group)
        choice = choice.masked_fill(~score_mask.reshape(-1, E).bool(), 0.0)
    experts = torch.topk(choice, k=cfg.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, experts)
    if cfg.norm_topk:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * cfg.routed_scaling_factor


def sparse_moe(cfg, w, prefix, h):
    # router_logits = gate(h); softmax in fp32; top-k; renormalise iff norm_topk_prob.
    if cfg.mla:
        experts, weights = deepseek_route(cfg, w, prefix, h)
    else:
        router_logits = h @ w[prefix + cfg.router_name + ".weight"].T
        probs = torch.softmax(router_logits, dim=1, dtype=torch.float32)
        weights, experts = torch.topk(probs, cfg.top_k, dim=-1)
        if cfg.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(cfg.num_experts):
        token, slot = torch.where(experts == e)
        if token.numel() == 0:
            continue
        ep = f"{prefix}experts.{e}."
        y = swiglu(h[token], w, *(ep + n for n in cfg.expert_names))
        out.index_add_(0, token, y * weights[token, slot, None])
    if cfg.shared_expert:  # F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        sp = prefix + "shared_expert."
        shared = swiglu(h, w, sp + "gate_proj", sp + "up_proj", sp + "down_proj")
        out = out + torch.sigmoid(h @ w[prefix + "shared_expert_gate.weight"].T) * shared
    if cfg.shared_experts:  # hidden_states + self.shared_experts(residuals)
        sp = prefix + "shared_experts."
        out = out + swiglu(h, w, sp + "gate_proj", sp + "up_proj", sp + "down_proj")
    return out


def feed_forward(cfg, w, layer, prefix, h):
    if layer in cfg.dense_layers:  # Qwen{2,3}MoeMLP / DeepseekV{2,3}MLP(intermediate_size)
        return swiglu(h, w, prefix + "gate_proj", prefix + "up_proj", prefix + "down_proj")
    return sparse_moe(cfg, w, prefix, h)


def forward(cfg, w, tokens):
    """Returns [(name, tensor)] for every intermediate, in the order sluice emits them."""
    ids = torch.tensor(tokens, dtype=torch.int64)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {tokens}")
    dumps = []
    x = w["model.embed_tokens.weight"][ids]
    dumps.append(("embed", x.clone()))
    cos, sin = rope_cos_sin(cfg, torch.arange(len(tokens)))
    allowed = attention_mask(cfg, len(tokens))
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        attn = self_attention(cfg, w, p + "self_attn.",
                              rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps),
                              cos, sin, allowed)
        dumps.append((f"layer.{i}.attn_out", attn))
        x = x + attn
        ffn = feed_forward(cfg, w, i, p + cfg.moe_prefix,
                           rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps))
        dumps.append((f"layer.{i}.moe_out", ffn))
        x = x + ffn
        dumps.append((f"layer.{i}.out", x))
    normed = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    dumps.append(("final_norm", normed))
    # Tied embeddings: lm_head shares embed_tokens' weight (a stored lm_head.weight is ignored).
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    dumps.append(("logits", normed @ head.T))
    return dumps


# ---------------------------------------------------------------------------------------------
# DBRX (modeling_dbrx.py): its own module names, LayerNorm, the fused Wqkv and the flat experts.


def layer_norm(x, weight, eps):
    # nn.LayerNorm(d, bias=False): (x - mean) / sqrt(biased var + eps) * weight.
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, None, eps)


def dbrx_attention(cfg, w, prefix, h, cos, sin, allowed):
    # qkv = Wqkv(x).clamp(min=-clip_qkv, max=clip_qkv), split into [hidden, kv, kv].
    T, D = h.shape[0], cfg.head_dim
    qkv = h @ w[prefix + "Wqkv.weight"].T
    if cfg.clip_qkv is not None:
        qkv = qkv.clamp(min=-cfg.clip_qkv, max=cfg.clip_qkv)
    kv = cfg.num_kv_heads * D
    q, k, v = qkv.split([cfg.num_heads * D, kv, kv], dim=1)
    q = q.reshape(T, cfg.num_heads, D).transpose(0, 1)
    k = k.reshape(T, cfg.num_kv_heads, D).transpose(0, 1)
    v = v.reshape(T, cfg.num_kv_heads, D).transpose(0, 1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    group = cfg.num_heads // cfg.num_kv_heads
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(D)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    out = (probs @ v).transpose(0, 1).reshape(T, cfg.num_heads * D)
    return out @ w[prefix + "out_proj.weight"].T


def dbrx_ffn(cfg, w, prefix, h):
    # DbrxRouter: softmax(layer(x)) in fp32, top-k, top_weights / norm(top_weights, p).
    probs = torch.softmax(h @ w[prefix + "router.layer.weight"].T, dim=-1, dtype=torch.float32)
    top_weights, top_experts = torch.topk(probs, cfg.top_k, dim=-1)
    if cfg.normalize_p is not None:
        top_weights = top_weights / torch.norm(top_weights, p=cfg.normalize_p, dim=-1,
                                               keepdim=True)
    # DbrxExperts: w1, v1, w2 viewed as [E, ffn, hidden]; expert e is
    # (silu(x @ w1[e].T) * (x @ v1[e].T)) @ w2[e] (w2 not transposed).
    E, I, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    mp = prefix + "experts.mlp."
    w1, v1, w2 = (w[mp + n].reshape(E, I, H) for n in ("w1", "v1", "w2"))
    out = torch.zeros_like(h)
    for e in range(E):
        token, slot = torch.where(top_experts == e)
        if token.numel() == 0:
            continue
        x = h[token]
        y = (torch.nn.functional.silu(x @ w1[e].T) * (x @ v1[e].T)) @ w2[e]
        out.index_add_(0, token, y * top_weights[token, slot, None])
    return out


def dbrx_forward(cfg, w, tokens):
    ids = torch.tensor(tokens, dtype=torch.int64)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got {tokens}")
    eps = cfg.layer_norm_eps
    dumps = []
    x = w["transformer.wte.weight"][ids]
    dumps.append(("embed", x.clone()))
    cos, sin = rope_cos_sin(cfg, torch.arange(len(tokens)))
    allowed = attention_mask(cfg, len(tokens))
    for i in range(cfg.num_layers):
        p = f"transformer.blocks.{i}."
        n = p + "norm_attn_norm."
        attn = dbrx_attention(cfg, w, n + "attn.",
                              layer_norm(x, w[n + "norm_1.weight"], eps), cos, sin, allowed)
        dumps.append((f"layer.{i}.attn_out", attn))
        x = x + attn
        ffn = dbrx_ffn(cfg, w, p + "ffn.", layer_norm(x, w[n + "norm_2.weight"], eps))
        dumps.append((f"layer.{i}.moe_out", ffn))
        x = x + ffn
        dumps.append((f"layer.{i}.out", x))
    normed = layer_norm(x, w["transformer.norm_f.weight"], eps)
    dumps.append(("final_norm", normed))
    dumps.append(("logits", normed @ w["lm_head.weight"].T))
    return dumps


def run_job(model_dir, tokens, out_path):
    cfg = read_settings(os.path.join(model_dir, "config.json"))
    weights = read_checkpoint(model_dir)
    with torch.no_grad():
        dumps = (dbrx_forward if cfg.dbrx else forward)(cfg, weights, tokens)
    write_safetensors(out_path, dumps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="Hugging Face model folder")
    parser.add_argument("--tokens", help="comma-separated token ids")
    parser.add_argument("--out", help="safetensors file to write")
    parser.add_argument("--batch", help='JSON file: [{"model": ..., "tokens": [...], "out": ...}]')
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.batch:
        with open(args.batch) as f:
            jobs = json.load(f)
        for job in jobs:
            run_job(job["model"], [int(t) for t in job["tokens"]], job["out"])
    elif args.model and args.tokens and args.out:
        run_job(args.model, [int(t) for t in args.tokens.split(",")], args.out)
    else:
        parser.error("give --model, --tokens and --out, or --batch")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, KeyError, OSError) as e:
        print(f"moe_reference.py: error: {e}", file=sys.stderr)
        sys.exit(1)
