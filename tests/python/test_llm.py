"""The Python module `sluice` (vLLM's offline shape) against the command line: greedy outputs
equal `sluice run`'s, chat goes through the model's template, errors carry the CLI's messages,
and the GIL is free while the engine runs."""
import json
import subprocess
import threading

import pytest
import sluice

from conftest import POLICY, POLICY_FLAGS

PROMPTS = ["Call me Ishmael.", "The whale", "It was a dark night and the sea"]


def run_batch(binary, model, requests, tmp_path, policy_flags=POLICY_FLAGS):
    """`sluice run` over requests (dicts); the result bodies by custom_id."""
    inp, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
    subprocess.run([binary, "run", "--model", model, "--input", str(inp), "--output", str(out),
                    *policy_flags], check=True, capture_output=True)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return {line["custom_id"]: line["response"]["body"] for line in lines}


@pytest.fixture(scope="module")
def moby_llm(moby):
    return sluice.LLM(moby, **POLICY)


def test_greedy_generate_equals_sluice_run(sluice_binary, moby, moby_llm, tmp_path):
    params = sluice.SamplingParams(temperature=0, max_tokens=24)
    outputs = moby_llm.generate(PROMPTS, params)
    expected = run_batch(sluice_binary, moby, [
        {"custom_id": str(i), "prompt": p, "max_tokens": 24, "temperature": 0}
        for i, p in enumerate(PROMPTS)], tmp_path)
    assert len(outputs) == len(PROMPTS)
    for i, (prompt, out) in enumerate(zip(PROMPTS, outputs)):
        body = expected[str(i)]
        completion = out.outputs[0]
        assert out.prompt == prompt
        assert completion.text == body["choices"][0]["text"]
        assert completion.finish_reason == body["choices"][0]["finish_reason"]
        assert len(completion.token_ids) == body["usage"]["completion_tokens"]
        assert len(out.prompt_token_ids) == body["usage"]["prompt_tokens"]
        assert out.usage.prompt_tokens == body["usage"]["prompt_tokens"]
        assert out.usage.total_tokens == body["usage"]["total_tokens"]
    assert any(o.outputs[0].text.strip() for o in outputs), "the model wrote nothing at all"


def test_greedy_generate_equals_sluice_run_on_a_made_model(sluice_binary, tiny_mixtral,
                                                           tmp_path):
    params = sluice.SamplingParams(temperature=0, max_tokens=8)
    outputs = sluice.LLM(tiny_mixtral, **POLICY).generate(PROMPTS, params)
    expected = run_batch(sluice_binary, tiny_mixtral, [
        {"custom_id": str(i), "prompt": p, "max_tokens": 8, "temperature": 0}
        for i, p in enumerate(PROMPTS)], tmp_path)
    for i, out in enumerate(outputs):
        assert out.outputs[0].text == expected[str(i)]["choices"][0]["text"]
        assert out.outputs[0].finish_reason == expected[str(i)]["choices"][0]["finish_reason"]


def test_chat_equals_sluice_run(sluice_binary, moby, moby_llm, tmp_path):
    conversations = [
        [{"role": "user", "content": "Who is Ahab?"}],
        [{"role": "system", "content": "Answer as Ishmael."},
         {"role": "user", "content": "Where are we sailing?"}],
    ]
    params = sluice.SamplingParams(temperature=0, max_tokens=16)
    outputs = moby_llm.chat(conversations, params)
    expected = run_batch(sluice_binary, moby, [
        {"custom_id": str(i), "messages": c, "max_tokens": 16, "temperature": 0}
        for i, c in enumerate(conversations)], tmp_path)
    for i, out in enumerate(outputs):
        body = expected[str(i)]
        assert out.outputs[0].text == body["choices"][0]["message"]["content"]
        assert len(out.prompt_token_ids) == body["usage"]["prompt_tokens"]
    # One conversation alone (not in a list) is accepted too, as vLLM does.
    single = moby_llm.chat(conversations[0], params)
    assert single[0].outputs[0].text == outputs[0].outputs[0].text


def test_chat_prompt_is_what_chat_template_prints(sluice_binary, moby, moby_llm, tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    (tmp_path / "m.json").write_text(json.dumps(messages), encoding="utf-8")
    printed = subprocess.run([sluice_binary, "chat-template", "--model", moby, "--messages",
                              str(tmp_path / "m.json")], check=True, capture_output=True).stdout
    assert sluice.render_chat_prompt(moby, messages).encode("utf-8") == printed
    prompt_ids = moby_llm.chat(messages, sluice.SamplingParams(max_tokens=1))[0].prompt_token_ids
    ids = subprocess.run([sluice_binary, "tokenize", "--tokenizer", moby, "--no-special",
                          "--text", printed.decode("utf-8")],
                         check=True, capture_output=True, text=True).stdout.split()
    assert prompt_ids == [int(i) for i in ids]


def test_stop_string_ends_the_text(moby_llm):
    greedy = sluice.SamplingParams(temperature=0, max_tokens=24)
    full = moby_llm.generate(PROMPTS[0], greedy)[0].outputs[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = moby_llm.generate(PROMPTS[0], sluice.SamplingParams(temperature=0, max_tokens=24,
                                                              stop=[stop]))[0].outputs[0]
    assert cut.text == full[:full.index(stop)]
    assert cut.finish_reason == "stop"


def test_max_tokens_ends_with_length(moby_llm):
    out = moby_llm.generate(PROMPTS[1], sluice.SamplingParams(temperature=0, max_tokens=3))[0]
    assert len(out.outputs[0].token_ids) <= 3
    if len(out.outputs[0].token_ids) == 3:
        assert out.outputs[0].finish_reason in ("length", "stop")


def test_seeded_sampling_repeats(moby_llm):
    params = sluice.SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=7, max_tokens=12)
    first = [o.outputs[0].token_ids for o in moby_llm.generate(PROMPTS, params)]
    again = [o.outputs[0].token_ids for o in moby_llm.generate(PROMPTS, params)]
    assert first == again


def test_bad_model_path_raises_the_cli_message(sluice_binary, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(sluice.Error) as raised:
        sluice.LLM(missing)
    cli = subprocess.run([sluice_binary, "generate", "--model", missing, "--prompt", "x"],
                         capture_output=True, text=True)
    assert cli.returncode != 0
    assert str(raised.value) in cli.stderr
    assert "no-such-model" in str(raised.value)
    assert isinstance(raised.value, RuntimeError)


def test_bad_policy_keywords_raise(moby):
    with pytest.raises(sluice.Error, match="unknown keyword 'batchsize'"):
        sluice.LLM(moby, batchsize=4)
    with pytest.raises(sluice.Error, match="precision"):
        sluice.LLM(moby, precision="f16")


def test_bad_sampling_params_raise(moby_llm):
    with pytest.raises(sluice.Error, match="top_p"):
        moby_llm.generate("x", sluice.SamplingParams(top_p=0))
    with pytest.raises(sluice.Error, match="context"):
        moby_llm.generate("x", sluice.SamplingParams(max_tokens=100000))


def test_the_gil_is_released_while_the_engine_runs(moby_llm):
    params = sluice.SamplingParams(temperature=0, max_tokens=64)
    worker = threading.Thread(target=moby_llm.generate, args=(PROMPTS * 4, params))
    ticks = 0
    worker.start()
    while worker.is_alive():
        ticks += 1
    worker.join()
    # With the GIL held for the whole call this loop could not run while the engine worked.
    assert ticks > 1000
