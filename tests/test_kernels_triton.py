"""Triton kernels counted under the interpreter equal iosim's closed forms, array by array (iosim.kernels).

All cases run in one subprocess with TRITON_INTERPRET=1 (tests/_kernel_cases.py): torch and triton are imported
once. CI installs the ``triton`` extra (.ci/run), so these tests never skip there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "iosim" / "kernels" / "examples"


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_kernel_cases.py"), "triton"],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _of(results, file):
    found = [r for r in results if r["file"] == file]
    assert found, file
    return found


def test_flash2_forward_equals_the_closed_form_per_array(results):
    for r in _of(results, "triton_flash2"):
        assert r["equal"], (r["params"], r["rows"])
        assert set(r["rows"]) == {"Q", "K", "V", "O", "L"}
        assert all(n["ok"] for n in r["numerics"]), r["numerics"]
        assert {n["output"] for n in r["numerics"]} == {"O", "L"}


def test_flash2_forward_reloads_nothing(results):
    for r in _of(results, "triton_flash2"):
        for name, (reads, _, _, _, distinct) in r["rows"].items():
            assert reads == distinct, (name, r["params"])


def test_wasteful_causal_masking_reads_more_than_the_closed_form(results):
    causal, dense = (r for r in _of(results, "triton_flash2_masked") if r["params"]["causal"] is True), None
    causal = next(causal)
    dense = next(r for r in _of(results, "triton_flash2_masked") if r["params"]["causal"] is False)
    assert not causal["equal"]
    for name in ("Q", "O", "L"):
        assert causal["rows"][name][:2] == causal["rows"][name][2:4]
    for name in ("K", "V"):
        reads, _, model_reads, _, _ = causal["rows"][name]
        assert reads == dense["rows"][name][0]  # it loads every block, as the non-causal kernel does
        assert reads == 256 * 64 * 4 and model_reads == 40960 and reads / model_reads == pytest.approx(1.6)
    assert dense["equal"]
    assert all(n["ok"] for n in causal["numerics"])


def test_flash2_backward_equals_the_closed_form_per_array(results):
    for r in _of(results, "triton_flash2_bwd"):
        assert r["equal"], (r["params"], r["rows"])
        assert r["launches"] == 2
        assert {n["output"] for n in r["numerics"]} == {"dQ", "dK", "dV"}
        assert all(n["ok"] for n in r["numerics"]), r["numerics"]


def test_split_kv_decode_equals_its_closed_form(results):
    for r in _of(results, "triton_decode_splitkv"):
        assert r["equal"], (r["params"], r["rows"])
        assert r["rows"]["lengths"][0] == r["params"]["splits"] * r["params"]["H"]  # metadata under its own name
        assert all(n["ok"] for n in r["numerics"])


def test_cli_counts_a_launcher_file_beside_the_model():
    out = subprocess.run(
        [sys.executable, "-m", "iosim.cli", "kernel", str(EXAMPLES / "triton_flash2.py"), "--N", "113", "--d", "16",
         "--Br", "32", "--Bc", "16", "--causal", "--like", "flash2", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["comparison"]["equal"] is True
    assert doc["comparison"]["M"] == 2 * 16 * (32 + 16) + 2 * 32 + 32 * 16
    assert doc["counts"]["programs"] == 4
    assert all(n["ok"] for n in doc["comparison"]["numerics"])
    rows = {r["array"]: r for r in doc["comparison"]["rows"]}
    assert rows["K"]["verdict"] == "equal to flash2's closed form to the word"


@pytest.mark.slow
def test_shared_memory_from_tritons_compiler_for_sm90():
    # the second figure: Triton's real compiler for sm_90 runs without a GPU (in a process without the interpreter)
    from iosim.kernels import count_file

    counts, _, _ = count_file(str(EXAMPLES / "triton_flash2_bwd.py"), params=dict(N=64, d=32), arrays=False,
                              shared_memory=90)  # fmt: skip
    assert set(counts.shared_memory) == {"flash2_backward_prep_kernel", "flash2_backward_kernel"}
    assert all(isinstance(b, int) and b > 0 for b in counts.shared_memory.values()), counts.shared_memory
