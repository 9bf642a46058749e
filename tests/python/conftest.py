"""Fixtures for the Python module's tests: the sluice binary (SLUICE_BINARY, set by ctest), the
shipped model, and policy keywords that keep both the module and `sluice run` on one plan."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sluice_binary():
    binary = os.environ.get("SLUICE_BINARY", str(ROOT / "build" / "sluice"))
    if not Path(binary).exists():
        pytest.fail(f"sluice binary not found at {binary} (set SLUICE_BINARY or build first)")
    return binary


@pytest.fixture(scope="session")
def moby():
    """The trained model that ships with sluice: real words, so text comparisons mean something."""
    return str(ROOT / "models" / "moby-moe")


@pytest.fixture(scope="session")
def tiny_mixtral(sluice_binary, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-mixtral")
    subprocess.run([sluice_binary, "make-model", "--preset", "tiny-mixtral", "--out", str(out),
                    "--layers", "2"], check=True, stdout=subprocess.DEVNULL)
    return str(out)


# The same policy on both sides: 2 threads (CI has 2 cores), and bf16 as the engine's default.
POLICY = {"threads": 2}
POLICY_FLAGS = ["--threads", "2"]

# A policy fixed in every field the planner would otherwise choose, for comparisons with
# `sluice serve`, whose planner plans for a workload rather than for the requests at hand.
FIXED_POLICY = {"batch": 8, "attn_micro_batch": 64, "prefill_chunk": 64, "expert_batch": 64,
                "kv_block_size": 16, "kv_blocks": 64, "threads": 2}
FIXED_POLICY_FLAGS = [arg for key, value in FIXED_POLICY.items()
                      for arg in ("--" + key.replace("_", "-"), str(value))]
