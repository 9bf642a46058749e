#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into OUT/<target>/: small valid inputs made here
(safetensors, GGUF, batch lines), the configs and tokenizer checked in under fuzz/seeds/, the
shipped model's files, and the tokenizer test data in ../shared/data when it is present."""
import json
import pathlib
import shutil
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "tokenizers"


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(kind, value):
    if kind == "str":
        return struct.pack("<I", 8) + gguf_string(value)
    if kind == "u32":
        return struct.pack("<II", 4, value)
    if kind == "f32":
        return struct.pack("<If", 6, value)
    if kind == "bool":
        return struct.pack("<IB", 7, value)
    element, items = kind[2:], value  # arrays: "[]str" | "[]i32" | "[]f32"
    codes = {"str": 8, "i32": 5, "f32": 6}
    out = struct.pack("<IIQ", 9, codes[element], len(items))
    for item in items:
        out += gguf_string(item) if element == "str" else struct.pack(
            "<i" if element == "i32" else "<f", item)
    return out


def gguf(kvs, tensors, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, (kind, value) in kvs.items():
        out += gguf_string(key) + gguf_value(kind, value)
    data, offsets = b"", []
    for name, (ggml_type, dims, payload) in tensors.items():
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += payload
    for (name, (ggml_type, dims, _)), offset in zip(tensors.items(), offsets):
        out += gguf_string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def gguf_seeds():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁a", "▁the", "he"]
    spm = {
        "general.architecture": ("str", "llama"),
        "general.alignment": ("u32", 32),
        "tokenizer.ggml.model": ("str", "llama"),
        "tokenizer.ggml.tokens": ("[]str", tokens),
        "tokenizer.ggml.scores": ("[]f32", [0.0] * len(tokens)),
        "tokenizer.ggml.token_type": ("[]i32", [2, 3, 3] + [6] * 256 + [1, 1, 1]),
        "tokenizer.ggml.bos_token_id": ("u32", 1),
        "tokenizer.ggml.eos_token_id": ("u32", 2),
        "tokenizer.chat_template": ("str", "{% for m in messages %}{{ m.content }}{% endfor %}"),
    }
    bpe_tokens = [chr(c) for c in range(33, 127)] + ["Ġ", "Ġt", "he", "Ġthe", "<|end|>"]
    bpe = {
        "general.architecture": ("str", "qwen2moe"),
        "tokenizer.ggml.model": ("str", "gpt2"),
        "tokenizer.ggml.pre": ("str", "qwen2"),
        "tokenizer.ggml.tokens": ("[]str", bpe_tokens),
        "tokenizer.ggml.merges": ("[]str", ["Ġ t", "h e", "Ġt he"]),
        "tokenizer.ggml.token_type": ("[]i32", [1] * (len(bpe_tokens) - 1) + [3]),
        "tokenizer.ggml.eos_token_id": ("u32", len(bpe_tokens) - 1),
        "tokenizer.ggml.add_bos_token": ("bool", 0),
    }
    tensors = {
        "token_embd.weight": (0, [4, 2], struct.pack("<8f", *range(8))),  # F32
        "blk.0.ffn_down.weight": (8, [32, 1], struct.pack("<e", 0.5) + bytes(range(32))),  # Q8_0
    }
    return {"spm.gguf": gguf(spm, tensors), "bpe.gguf": gguf(bpe, {}),
            "tensors-only.gguf": gguf({"general.architecture": ("str", "llama")}, tensors)}


BATCH_LINES = [
    {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
              "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n", "."]}},
    {"custom_id": "b", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "Call me", "max_tokens": 2, "top_k": 4}},
    {"custom_id": "c", "prompt": [1, 2, 3], "max_tokens": 1, "stop": "x"},
    {"custom_id": "d", "messages": [{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "text", "text": "t"}]}]},
    {"id": "batch_req_1", "custom_id": "e", "response": {"status_code": 200, "body": {}},
     "error": None},
    {"id": "batch_req_2", "custom_id": "f", "response": None,
     "error": {"code": "invalid_request", "message": "m"}},
]


def main(out):
    out = pathlib.Path(out)
    if out.exists():
        shutil.rmtree(out)
    seeds = {t: {} for t in ["safetensors_header", "safetensors_index", "config", "tokenizer_json",
                             "sentencepiece", "tiktoken", "gguf", "jinja", "batch_line", "server_request"]}
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    seeds["safetensors_header"] = {
        "f32.safetensors": safetensors({"a": ("F32", [2, 2], f32)}, {"format": "pt"}),
        "mixed.safetensors": safetensors({"w": ("BF16", [2, 3], bytes(12)), "i": ("I8", [4], bytes(4)),
                                          "e": ("F32", [0], b"")}),
        "empty.safetensors": safetensors({}),
    }
    seeds["safetensors_index"] = {"index.json": json.dumps({
        "metadata": {"total_size": 16},
        "weight_map": {"a": "model-00001-of-00002.safetensors",
                       "b": "model-00002-of-00002.safetensors"}}).encode()}
    for path in sorted((ROOT / "fuzz" / "seeds" / "config").glob("*.json")):
        seeds["config"][path.name] = path.read_bytes()
    seeds["config"]["moby-moe.json"] = (ROOT / "models/moby-moe/config.json").read_bytes()
    seeds["tokenizer_json"]["tiny.json"] = (ROOT / "fuzz/seeds/tiny-tokenizer.json").read_bytes()
    seeds["tokenizer_json"]["moby.json"] = (ROOT / "models/moby-moe/tokenizer.json").read_bytes()
    seeds["gguf"] = gguf_seeds()
    seeds["jinja"]["moby.jinja"] = json.loads(
        (ROOT / "models/moby-moe/tokenizer_config.json").read_text())["chat_template"].encode()
    seeds["jinja"]["language.jinja"] = (
        b"{%- set ns = namespace(n=0) -%}{% for m in messages if m.role != 'tool' %}"
        b"{% set ns.n = ns.n + 1 %}{{ m.role ~ ':' ~ m.content[:10] | trim }}{% if loop.last %}"
        b"{{ (m.tool_calls | default([]) | tojson) }}{% endif %}{% else %}{{ raise_exception('e') }}"
        b"{% endfor %}{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{{ f(ns.n) }}"
        b"{{ {'a': [1, 2.5, none, true]} | items | list }}{# c #}{{ range(3) | map('string') | join }}")
    seeds["tiktoken"]["small.tiktoken"] = b"IQ== 0\nIg== 1\nIw== 2\naGU= 3\nIHRoZQ== 4\n"
    seeds["batch_line"] = {f"line{i}.json": json.dumps(l).encode() for i, l in enumerate(BATCH_LINES)}
    # server_request: a first byte choosing the endpoint (odd: chat), then the body.
    for i, line in enumerate(BATCH_LINES[:4]):
        body = dict(line.get("body", line))
        body.pop("custom_id", None)
        chat = b"\x01" if "messages" in body else b"\x00"
        seeds["server_request"][f"body{i}.json"] = chat + json.dumps(body).encode()
    seeds["server_request"]["stream.json"] = b"\x01" + json.dumps(
        {"messages": [{"role": "user", "content": "Call me"}], "stream": True,
         "stream_options": {"include_usage": True}, "logprobs": False}).encode()
    if SHARED.exists():
        for tmpl in sorted(SHARED.glob("*/chat_templates/*.jinja")):
            seeds["jinja"][tmpl.name] = tmpl.read_bytes()
        for tk in sorted(SHARED.glob("*/*.tiktoken")):  # the first lines: whole files are MBs
            seeds["tiktoken"][tk.name] = b"".join(tk.read_bytes().splitlines(True)[:300])
        for spm in sorted(SHARED.glob("*/tokenizer.model")):
            seeds["sentencepiece"][spm.parent.name + ".model"] = spm.read_bytes()
    for target, files in seeds.items():
        (out / target).mkdir(parents=True)
        for name, data in files.items():
            (out / target / name).write_bytes(data)


if __name__ == "__main__":
    main(sys.argv[1])
