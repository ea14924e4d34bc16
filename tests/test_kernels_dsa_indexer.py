"""The lightning indexer's decode scan (iosim/kernels/examples/dsa_indexer.py) counted under Triton's interpreter:
every array equal to a hand count of its two kernels written here and to iosim's own indexer scan
(``topk_sparse(..., indexer=...)``), the scores and the selection equal to a float64 indexer written here, and the
selection fed to iosim's top-k sparse schedule (the file takes about 12 s on 2 cores, both cases in one batch)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

FILE = str(Path(__file__).parents[1] / "iosim" / "kernels" / "examples" / "dsa_indexer.py")
CASES = [dict(N=100, d=32, H=16, B=2, topk=8, Bc=32), dict(N=40, d=16, H=16, B=1, topk=4, Bc=16)]


@pytest.fixture(scope="module")
def runs():
    from iosim.kernels import count_batch

    return count_batch([(FILE, None, p) for p in CASES], "triton")


def hand(N, d, H, B, topk, Bc):
    """Scoring: one program per (sequence, block of Bc keys), T = ceil(N / Bc) per sequence, each loading q_I (H d)
    and w (H), its block's keys (c d) and scales (c), storing c scores; top-k: one program per sequence reading its
    N scores and storing k indices."""
    T = math.ceil(N / Bc)
    return {"q_I": (B * T * H * d, 0), "w": (B * T * H, 0), "K_I": (B * N * d, 0), "k_scale": (B * N, 0),
            "logits": (B * N, B * N), "indices": (0, B * topk)}  # fmt: skip


def indexer(a):
    """float64 scores sum_h w[h] relu(q_I[h] . K_I[s]) k_scale[s] per sequence."""
    q, w, k, ks = (np.asarray(a[n], dtype=np.float64) for n in ("q_I", "w", "K_I", "k_scale"))
    return np.einsum("bh,bsh->bs", w, np.maximum(np.einsum("bhd,bsd->bsh", q, k), 0.0)) * ks


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_indexer_scan_equals_the_hand_count(runs, i):
    counts, _, _ = runs[i]
    assert {k: (a.reads, a.writes) for k, a in counts.per_array.items()} == hand(**CASES[i])
    assert counts.per_array["q_I"].distinct_reads == counts.per_array["q_I"].reads  # each program loads it once


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_indexer_scores_and_selection_equal_a_float64_indexer(runs, i):
    _, _, a = runs[i]
    want = indexer(a)
    assert np.abs(np.asarray(a["logits"]) - want).max() < 1e-4 * np.abs(want).max()
    top = np.argsort(-want, axis=1)[:, : CASES[i]["topk"]]
    assert np.array_equal(np.sort(np.asarray(a["indices"]), axis=1), np.sort(top, axis=1))


@pytest.mark.slow
def test_the_selection_drives_iosims_topk_schedule(runs):
    """The indexer's own words beside what the selected attention then reads (token level, one latent head)."""
    from iosim import Problem
    from iosim.masking.topk_sparse import topk_sparse

    p = CASES[0]
    _, _, a = runs[0]
    sel = np.asarray(a["indices"]).astype(np.int64).reshape(p["B"], 1, 1, p["topk"])
    r = topk_sparse(Problem(B=p["B"], H_q=16, H_kv=1, N_q=1, N_k=p["N"], d_qk=48, d_v=32, latent=True), sel,
                    policy="gqa")  # fmt: skip
    assert r.words["K"] == p["B"] * p["topk"] * 48 and r.words["indices"] == p["B"] * p["topk"]


SCAN = ("q_I", "w", "K_I", "k_scale", "logits")


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_kernel_equals_topk_sparse_with_its_indexer_array_by_array(runs, i):
    """iosim's own indexer scan (``topk_sparse(..., indexer=(H_I, d_I, B_n))``) at N_q = 1 (a decode step) over the
    kernel's own selection: q_I, w, K_I, k_scale and logits equal the kernel's, reads and writes, and its writes of
    ``indices`` are the kernel's (the schedule's reads of them are the attention's, which the kernel does not run)."""
    from iosim import Problem
    from iosim.masking.topk_sparse import topk_sparse

    c = CASES[i]
    counts, _, a = runs[i]
    sel = np.asarray(a["indices"]).astype(np.int64).reshape(c["B"], 1, 1, c["topk"])
    r = topk_sparse(Problem(B=c["B"], N_q=1, N_k=c["N"], d=8), sel, indexer=(c["H"], c["d"], c["Bc"]))
    assert r.exact
    kernel = {n: (counts.per_array[n].reads, counts.per_array[n].writes) for n in (*SCAN, "indices")}
    ours = {n: (r.stats.per_array[n].reads, r.stats.per_array[n].writes) for n in SCAN}
    assert ours == {n: kernel[n] for n in SCAN}
    assert r.stats.per_array["indices"].writes == kernel["indices"][1] == c["B"] * c["topk"]
