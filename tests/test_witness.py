"""The honesty witness (tests/witness.py) in the default suite.

One subprocess (NUMBA_DISABLE_JIT=1 must be set before numba is imported, so the witness cannot run in the test
process) runs every algorithm's forward and backward, causal and not, at tiny odd sizes with several ragged tiles,
plus the deliberately broken copies of flash2's forward, and returns JSON. The tests below then assert:
the correct drivers touch slow memory only through the model, read no fast word before it was loaded or computed
or after its tile was freed, compute only inside live tiles, match the model's own counts and the float64
reference; and every broken copy is caught with a clear message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("iosim_witness", HERE / "witness.py")
witness = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = witness  # dataclasses look their module up
_spec.loader.exec_module(witness)  # imports NumPy only; the drivers run in the subprocess


@pytest.fixture(scope="module")
def report() -> dict:
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run(
        [sys.executable, str(HERE / "witness.py"), "--compact"],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"the witness failed to run:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout)


def _describe(violations: list[dict]) -> str:
    return "\n".join(f"  [{v['kind']}] {v['where']}: {v['message']} (x{v['count']})" for v in violations[:12])


def test_every_driver_module_runs_on_witnessed_ops(report):
    patched = set(report["patched"])
    for module in ("flash", "standard", "square_tiling"):
        for name in ("buffer", "load", "alloc", "store", "free"):
            assert f"iosim.algorithms.{module}.{name}" in patched


def test_cases_cover_every_algorithm_pass_and_mask(report):
    seen = {(c["algorithm"], c["causal"], p) for c in report["cases"] for p in c["passes"]}
    assert seen == {(a, c, p) for a in witness.ALGORITHMS for c in (False, True) for p in ("forward", "backward")}
    assert [dict(c, passes=None) for c in report["cases"]] == [dict(c, passes=None) for c in witness.case_list()]


@pytest.mark.parametrize("algorithm", witness.ALGORITHMS)
def test_driver_is_honest(report, algorithm):
    cases = [c for c in report["cases"] if c["algorithm"] == algorithm]
    assert cases
    for c in cases:
        for name, p in c["passes"].items():
            label = f"{algorithm} {name} N={c['N']} d={c['d']} M={c['M']} causal={c['causal']} ({p.get('tiling')})"
            assert p["error"] is None, f"{label}: {p['error']}"
            assert not p["violations"], f"{label} broke the model's rules:\n{_describe(p['violations'])}"
            assert p["max_rel_err"] <= witness.TOLERANCE, f"{label}: outputs differ from the reference"
            # not vacuous: the witness saw tiles, slow-memory traffic and checked fast-memory words
            assert p["tiles"] > 0 and p["slow_words"] > 0, label
            assert p["checked_reads"] > 0 and p["checked_writes"] > 0, label


@pytest.mark.parametrize("name", list(witness.BROKEN))
def test_broken_copy_is_caught(report, name):
    (result,) = [b for b in report["broken"] if b["name"] == name]
    kind, phrase = result["expected"], result["phrase"]
    hits = [v for v in result["violations"] if v["kind"] == kind and phrase in v["message"]]
    assert hits, f"broken copy {name!r} not caught as {kind} ({phrase!r}); the witness said:\n" + _describe(
        result["violations"]
    )
