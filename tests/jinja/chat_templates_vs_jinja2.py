#!/usr/bin/env python3
"""Checks that `sluice chat-template` renders every chat template the way transformers does.

The reference is Debian's python3-jinja2 set up as transformers' apply_chat_template sets it up:
an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension,
a `tojson` filter that is json.dumps without ASCII escaping (its indent, separators and sort_keys
passed through), the globals raise_exception and strftime_now, and the context
{special tokens of the tokenizer, messages, tools, documents=None, add_generation_prompt}; plus
the `from_json` filter (json.loads), sluice's one addition, which llama.cpp's templates use.

Templates: every one under ../shared/data/tokenizers (tokenizer_config*.json, *.jinja files
rendered with the special tokens of their family's config, GGUF files that carry one) and the
templates of sluice's make-model presets. Conversations: system/user/assistant turns, a
conversation without a system turn, and where the template knows tools, a tool call and its
result; each with and without the generation prompt. A template that raises in Jinja2 must make
sluice fail too.

usage: chat_templates_vs_jinja2.py SLUICE_BINARY SHARED_TOKENIZERS_DIR WORK_DIR
Exits 77 (skipped) when jinja2 or the shared folder is absent.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
from datetime import datetime
from pathlib import Path

SKIP = 77
PRESETS = ["tiny-mixtral", "tiny-qwen3-moe", "tiny-olmoe", "tiny-qwen2-moe", "tiny-dbrx",
           "tiny-deepseek-v2-lite", "tiny-deepseek-v2", "tiny-deepseek-v3"]
# The family config whose special tokens go with a bare .jinja template, by folder.
JINJA_CONFIGS = {"qwen": "qwen/tokenizer_config.qwen3.json",
                 "deepseek": "deepseek/tokenizer_config.deepseek-v3.json"}
SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token"]


def reference_environment(jinja2):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    # sluice's one documented addition to transformers' environment (llama.cpp templates use it).
    env.filters["from_json"] = json.loads
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(token):
    return token["content"] if isinstance(token, dict) else token


def config_special_tokens(config):
    """special_tokens_map as transformers builds it: the named tokens that are set, and the
    additional special tokens."""
    tokens = {name: token_text(config[name]) for name in SPECIAL_TOKENS
              if config.get(name) is not None}
    if config.get("additional_special_tokens"):
        tokens["additional_special_tokens"] = [token_text(t)
                                               for t in config["additional_special_tokens"]]
    return tokens


def read_gguf_metadata(path):
    """The metadata of a GGUF file (v2/v3): key -> value (strings, numbers, arrays)."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0]

    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
               12: "d"}

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode("utf-8")

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:
            element, n = take("I"), take("Q")
            return [value(element) for _ in range(n)]
        return take(scalars[kind])

    assert data[:4] == b"GGUF", path
    pos = 8
    take("Q")  # tensor count
    metadata = {}
    for _ in range(take("Q")):
        key = string()
        metadata[key] = value(take("I"))
    return metadata


class Template:
    """One template under test: how sluice reads it (arguments) and the reference's source and
    special tokens."""

    def __init__(self, name, args, source, tokens):
        self.name, self.args, self.source, self.tokens = name, args, source, tokens


def shared_templates(shared):
    found = []
    for path in sorted(shared.rglob("*.json")):
        if "tokenizer_config" not in path.name:
            continue
        config = json.loads(path.read_text(encoding="utf-8"))
        source = config.get("chat_template")
        if isinstance(source, list):
            source = {t["name"]: t["template"] for t in source}["default"]
        if source is None and (path.parent / "chat_template.jinja").exists():
            source = (path.parent / "chat_template.jinja").read_text(encoding="utf-8")
        if source is None:
            print(f"note: {path.relative_to(shared)} has no chat template")
            continue
        found.append(Template(str(path.relative_to(shared)), ["--model", str(path)], source,
                              config_special_tokens(config)))
    for path in sorted(shared.rglob("*.jinja")):
        family = path.relative_to(shared).parts[0]
        config_path = shared / JINJA_CONFIGS[family]
        config = json.loads(config_path.read_text(encoding="utf-8"))
        found.append(Template(str(path.relative_to(shared)),
                              ["--model", str(config_path), "--chat-template", str(path)],
                              path.read_text(encoding="utf-8"), config_special_tokens(config)))
    for path in sorted(shared.rglob("*.gguf")):
        metadata = read_gguf_metadata(path)
        if "tokenizer.chat_template" not in metadata:
            continue
        vocab = metadata["tokenizer.ggml.tokens"]
        tokens = {name: vocab[metadata[key]] for name, key in
                  [("bos_token", "tokenizer.ggml.bos_token_id"),
                   ("eos_token", "tokenizer.ggml.eos_token_id"),
                   ("unk_token", "tokenizer.ggml.unknown_token_id")] if key in metadata}
        found.append(Template(str(path.relative_to(shared)), ["--model", str(path)],
                              metadata["tokenizer.chat_template"], tokens))
    return found


def preset_templates(sluice, work):
    found = []
    for preset in PRESETS:
        out = work / preset
        shutil.rmtree(out, ignore_errors=True)  # make-model writes only into a new folder
        subprocess.run([sluice, "make-model", "--preset", preset, "--out", str(out),
                        "--layers", "1"], check=True, stdout=subprocess.DEVNULL)
        config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        if config.get("chat_template") is None:
            print(f"note: preset {preset} has no chat template")
            continue
        same = [t for t in found if t.source == config["chat_template"]
                and t.tokens == config_special_tokens(config)]
        if same:  # the same template and tokens: the same renderings
            print(f"note: preset {preset} has the template of {same[0].name}")
            continue
        found.append(Template(f"preset {preset}", ["--model", str(out)], config["chat_template"],
                              config_special_tokens(config)))
    return found


# Templates written here for the environment's own settings, which the real templates above
# touch only in part: tojson's keywords, strftime_now, loop controls, whitespace control.
FEATURE_TEMPLATES = {
    "tojson-keywords": (
        "{{ messages | tojson }}\n{{ messages | tojson(indent=2) }}\n"
        "{{ tools | tojson(indent=4, sort_keys=true) }}\n"
        "{{ tools | tojson(separators=(',', ':')) }}\n{{ messages[0] | tojson(indent='  ') }}"),
    "strftime-now": "{{ strftime_now('%Y') }}|{{ messages | length }}",
    "loop-controls": (
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
        "{{ loop.index }}:{{ m.role }}\n{% if m.role == 'user' %}{% break %}{% endif %}"
        "{% endfor %}"),
    "whitespace": (
        "  {% for m in messages %}\n    {%- if m.role == 'user' %}\n  <u>{{ m.content }}\n"
        "    {% else %}\n <o>{{ m.content | trim }}\n{% endif %}\n{% endfor %}\n"
        "{%- if add_generation_prompt +%}\n  <a>\n{%- endif %}"),
}


def feature_templates(work, config_path, config):
    found = []
    for name, source in FEATURE_TEMPLATES.items():
        path = work / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
        found.append(Template(f"feature {name}",
                              ["--model", str(config_path), "--chat-template", str(path)], source,
                              config_special_tokens(config)))
    return found


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Météo d'une ville — \"now\" <b>&</b> 天气",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "City name"},
                                  "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}


def conversations(uses_tools, brief=False):
    """(name, messages, tools) to render; brief: one without tools and one with."""
    system = {"role": "system", "content": "You are terse. Réponds en français."}
    turns = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello! \"Quoted\" <b>&</b> 中文"},
             {"role": "user", "content": "  2+2?\n"}]
    cases = [("system-user-assistant", [system] + turns, None),
             ("user-assistant", turns, None),
             ("one-user-turn", turns[:1], None)]
    if not uses_tools:
        return cases
    for arguments_name, arguments in [("dict", {"city": "Paris", "unit": "c"}),
                                      ("string", "{\"city\": \"Paris\", \"unit\": \"c\"}")]:
        call = {"role": "assistant", "content": "",
                "tool_calls": [{"id": "call12345", "type": "function",
                                "function": {"name": "get_weather", "arguments": arguments}}]}
        result = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                  "content": "{\"temp\": 21}"}
        messages = [system, {"role": "user", "content": "Weather in Paris?"}, call, result,
                    {"role": "assistant", "content": "21 °C."},
                    {"role": "user", "content": "Thanks"}]
        cases.append((f"tools, arguments as {arguments_name}", messages, [WEATHER_TOOL]))
    cases.append(("tools offered, not called", [system] + turns, [WEATHER_TOOL]))
    return [cases[0], cases[-1]] if brief else cases


def reference_render(env, template, messages, tools, add_generation_prompt):
    compiled = env.from_string(template.source)
    try:
        return compiled.render(**template.tokens, messages=messages, tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt), None
    except Exception as e:  # a template that raises (raise_exception, type errors)
        return None, f"{type(e).__name__}: {e}"


def sluice_render(sluice, work, template, messages, tools, add_generation_prompt):
    messages_file, tools_file = work / "messages.json", work / "tools.json"
    messages_file.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    args = [sluice, "chat-template", *template.args, "--messages", str(messages_file)]
    if tools is not None:
        tools_file.write_text(json.dumps(tools, ensure_ascii=False), encoding="utf-8")
        args += ["--tools", str(tools_file)]
    if not add_generation_prompt:
        args.append("--no-generation-prompt")
    run = subprocess.run(args, capture_output=True)
    if run.returncode != 0:
        return None, run.stderr.decode("utf-8", "replace").strip()
    return run.stdout.decode("utf-8"), None


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sluice, shared, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    try:
        import jinja2
        import jinja2.ext
    except ImportError:
        print("SKIP: python3 cannot import jinja2 (install Debian's python3-jinja2)")
        return SKIP
    if not shared.is_dir():
        print(f"SKIP: shared tokenizer data not found at {shared}")
        return SKIP
    work.mkdir(parents=True, exist_ok=True)
    env = reference_environment(jinja2)
    templates = shared_templates(shared) + preset_templates(sluice, work)
    config_path = work / "tiny-mixtral" / "tokenizer_config.json"
    templates += feature_templates(work, config_path,
                                   json.loads(config_path.read_text(encoding="utf-8")))
    checked, failures = 0, []
    for template in templates:
        # The feature templates test the environment, not turns: two conversations are enough.
        feature = template.name.startswith("feature")
        for case, messages, tools in conversations("tools" in template.source or feature,
                                                   brief=feature):
            for generation_prompt in (True, False):
                label = f"{template.name} [{case}, generation prompt {generation_prompt}]"
                want, want_error = reference_render(env, template, messages, tools,
                                                    generation_prompt)
                got, got_error = sluice_render(sluice, work, template, messages, tools,
                                               generation_prompt)
                checked += 1
                if want_error and got_error:
                    continue
                if want_error or got_error or got != want:
                    failures.append((label, want, want_error, got, got_error))
    for label, want, want_error, got, got_error in failures:
        print(f"MISMATCH {label}\n  jinja2: {want_error or repr(want)}\n"
              f"  sluice: {got_error or repr(got)}")
    print(f"{checked - len(failures)} of {checked} renderings of {len(templates)} templates agree "
          "with jinja2")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
