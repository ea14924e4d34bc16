"""jax's Pallas TPU flash-attention op, counted in place under TPU interpret mode (iosim.kernels, backend pallas).

CI installs the ``pallas`` extra (.ci/run), so these tests never skip there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_kernel_cases.py"), "pallas"],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_the_op_ships_with_jax():
    from jax.experimental.pallas.ops.tpu import flash_attention

    assert callable(flash_attention.flash_attention)


def test_square_blocks_equal_flash2s_closed_form_where_it_moves_data(results):
    for r in (r for r in results if r["params"]["Br"] == r["params"]["Bc"]):
        assert r["equal_where_moved"], r["rows"]
        for name in ("Q", "K", "V", "O"):
            assert r["rows"][name][:2] == r["rows"][name][2:4], (name, r["params"])
        assert r["rows"]["L"][:2] == [0, 0]  # no residuals: the op does not write the logsumexp
        assert all(n["ok"] for n in r["numerics"])


def test_the_pipeline_keeps_an_unchanged_block_resident_across_row_blocks(results):
    # Br = 64 < Bc = 128, causal: consecutive row blocks i = 2k, 2k + 1 ask for the same last key block, whose
    # index does not change between the grid steps, so the pipeline does not copy it again: fewer reads than
    # flash2's per-program closed form, which charges every row block for its own K_j, V_j.
    r = next(r for r in results if r["params"]["Br"] == 64)
    for name in ("K", "V"):
        reads, _, model_reads, _, _ = r["rows"][name]
        assert reads == 32768 and model_reads == 49152
    assert r["rows"]["Q"][:2] == r["rows"]["Q"][2:4]
