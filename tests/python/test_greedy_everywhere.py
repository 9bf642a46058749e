"""Greedy outputs are the same everywhere: Python `generate`, `sluice run` and `sluice serve`'s
/v1/completions give the same text for the same prompts under the same fixed policy."""
import json
import re
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import sluice

from conftest import FIXED_POLICY, FIXED_POLICY_FLAGS
from test_llm import PROMPTS, run_batch

MAX_TOKENS = 20


@pytest.fixture
def server(sluice_binary, moby, tmp_path):
    """`sluice serve` on a free loopback port: its base URL."""
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        process = subprocess.Popen([sluice_binary, "serve", "--model", moby, "--port", "0",
                                    *FIXED_POLICY_FLAGS], stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
            port = found and found.group(1)
        assert port, f"sluice serve did not start:\n{log.read_text()}"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0, log.read_text()


def complete(url, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_greedy_text_is_the_same_through_python_run_and_serve(sluice_binary, moby, server,
                                                               tmp_path):
    outputs = sluice.LLM(moby, **FIXED_POLICY).generate(
        PROMPTS, sluice.SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    expected = run_batch(sluice_binary, moby, [
        {"custom_id": str(i), "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0}
        for i, p in enumerate(PROMPTS)], tmp_path, FIXED_POLICY_FLAGS)
    # All at once, so that they share batches as the other two's requests do.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = list(pool.map(lambda p: complete(server, p), PROMPTS))
    for i, (out, answer) in enumerate(zip(outputs, served)):
        python_text = out.outputs[0].text
        assert python_text == expected[str(i)]["choices"][0]["text"], PROMPTS[i]
        assert python_text == answer["choices"][0]["text"], PROMPTS[i]
        assert out.outputs[0].finish_reason == answer["choices"][0]["finish_reason"]
        assert out.usage.prompt_tokens == answer["usage"]["prompt_tokens"]
        assert len(out.outputs[0].token_ids) == answer["usage"]["completion_tokens"]
    assert any(o.outputs[0].text.strip() for o in outputs), "the model wrote nothing at all"
