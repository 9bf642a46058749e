#!/usr/bin/python3
"""An independent PyTorch reference for the forward pass of Hugging Face `MixtralForCausalLM`.

Written from the semantics of transformers' modeling_mixtral.py, configuration_mixtral.py and
masking_utils.py, with no dependency beyond torch (Debian's python3-torch): it reads config.json
and the safetensors files itself and writes its results as a safetensors file itself.

Everything is computed in float32 (stored BF16/F16 weights are upcast), the whole sequence at once
without a KV cache, so it checks sluice's cached prefill + decode path from the other side.

The intermediates written are named as sluice's ReferenceForward dump names them:
  embed                 embed_tokens(input_ids)
  layer.{i}.attn_out    self_attn output (o_proj), before the residual add
  layer.{i}.moe_out     block_sparse_moe output, before the residual add
  layer.{i}.out         hidden state leaving decoder layer i
  final_norm            model.norm(hidden)
  logits                lm_head(final_norm)
each as a [tokens, cols] F32 tensor.

Usage:
  mixtral_reference.py --model DIR --tokens 1,2,3 --out FILE.safetensors
  mixtral_reference.py --batch JOBS.json   # [{"model": DIR, "tokens": [..], "out": FILE}, ...]
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
# config.json, with MixtralConfig's defaults for absent fields.


class MixtralSettings:
    def __init__(self, path):
        with open(path) as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: expected a JSON object")

        def get(key, default):
            # A key that is absent takes the class default; MixtralConfig keeps an explicit null.
            return cfg[key] if key in cfg else default

        self.vocab_size = get("vocab_size", 32000)
        self.hidden_size = get("hidden_size", 4096)
        self.intermediate_size = get("intermediate_size", 14336)
        self.num_layers = get("num_hidden_layers", 32)
        self.num_heads = get("num_attention_heads", 32)
        # Absent: the class default 8; null: as many KV heads as query heads (__post_init__).
        kv = get("num_key_value_heads", 8)
        self.num_kv_heads = self.num_heads if kv is None else kv
        head_dim = get("head_dim", None)
        self.head_dim = head_dim or self.hidden_size // self.num_heads
        self.rms_norm_eps = get("rms_norm_eps", 1e-5)
        self.tie_word_embeddings = get("tie_word_embeddings", False)
        self.sliding_window = get("sliding_window", None)
        self.num_experts = get("num_local_experts", get("num_experts", 8))
        self.top_k = get("num_experts_per_tok", 2)
        act = get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{path}: field 'hidden_act': expected 'silu', got {act!r}")

        # RoPE: transformers 4.x keeps `rope_theta` at the top level (and `rope_scaling` for
        # variants); 5.x folds both into `rope_parameters`. Mixtral's default theta is 1e6.
        self.rope_theta = get("rope_theta", 1e6)
        for key in ("rope_scaling", "rope_parameters"):
            rope = cfg.get(key)
            if rope is None:
                continue
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise ValueError(f"{path}: field '{key}': rope type {rope_type!r} is not "
                                 "implemented by this reference; expected 'default'")
            if "rope_theta" in rope:
                self.rope_theta = rope["rope_theta"]
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{path}: num_attention_heads {self.num_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_kv_heads}")


# ---------------------------------------------------------------------------------------------
# safetensors, read and written by hand: u64 little-endian header length, JSON header, raw data.


def _raw_dtype(name, path, tensor):
    table = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.int16}
    if name not in table:
        raise ValueError(f"{path}: tensor '{tensor}': dtype {name} is not BF16, F16 or F32")
    return table[name]


def read_safetensors(path):
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
            t = t.to(torch.float32).reshape(shape)
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
    for name in files:
        tensors.update(read_safetensors(os.path.join(model_dir, name)))
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
    # MixtralRMSNorm: variance in fp32, x * rsqrt(variance + eps), then times the weight.
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rope_cos_sin(cfg, positions):
    # inv_freq = 1 / theta^(arange(0, d, 2) / d); freqs = position * inv_freq; emb = cat(freqs,
    # freqs). All fp32, as MixtralRotaryEmbedding forces.
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


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


def self_attention(cfg, w, prefix, h, cos, sin, allowed):
    T, D = h.shape[0], cfg.head_dim
    q = (h @ w[prefix + "q_proj.weight"].T).view(T, cfg.num_heads, D).transpose(0, 1)
    k = (h @ w[prefix + "k_proj.weight"].T).view(T, cfg.num_kv_heads, D).transpose(0, 1)
    v = (h @ w[prefix + "v_proj.weight"].T).view(T, cfg.num_kv_heads, D).transpose(0, 1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    # repeat_kv: KV head j serves query heads [j*group, (j+1)*group).
    group = cfg.num_heads // cfg.num_kv_heads
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(1, 2)) * (D ** -0.5)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (probs @ v).transpose(0, 1).reshape(T, cfg.num_heads * D)
    return out @ w[prefix + "o_proj.weight"].T


def sparse_moe(cfg, w, prefix, h):
    # router_logits = gate(h); softmax in fp32; top-k; renormalise the k weights to sum to one.
    router_logits = h @ w[prefix + "gate.weight"].T
    probs = torch.softmax(router_logits, dim=1, dtype=torch.float32)
    weights, experts = torch.topk(probs, cfg.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(cfg.num_experts):
        token, slot = torch.where(experts == e)
        if token.numel() == 0:
            continue
        x = h[token]
        ep = f"{prefix}experts.{e}."
        # w2(silu(w1 x) * w3 x), scaled by the token's routing weight for this expert.
        y = (torch.nn.functional.silu(x @ w[ep + "w1.weight"].T) * (x @ w[ep + "w3.weight"].T))
        y = y @ w[ep + "w2.weight"].T
        out.index_add_(0, token, y * weights[token, slot, None])
    return out


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
        moe = sparse_moe(cfg, w, p + "block_sparse_moe.",
                         rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps))
        dumps.append((f"layer.{i}.moe_out", moe))
        x = x + moe
        dumps.append((f"layer.{i}.out", x))
    normed = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    dumps.append(("final_norm", normed))
    # Tied embeddings: lm_head shares embed_tokens' weight (a stored lm_head.weight is ignored).
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    dumps.append(("logits", normed @ head.T))
    return dumps


def run_job(model_dir, tokens, out_path):
    cfg = MixtralSettings(os.path.join(model_dir, "config.json"))
    weights = read_checkpoint(model_dir)
    with torch.no_grad():
        dumps = forward(cfg, weights, tokens)
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
        print(f"mixtral_reference.py: error: {e}", file=sys.stderr)
        sys.exit(1)
