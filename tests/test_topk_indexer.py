"""DSA's lightning indexer scan in the top-k sparse problem (``indexer=(H_I, d_I, B_n)``): its words per array and
its peak equal a model counted here program by program on ragged grids, the attention's own counts are unchanged
by it, its logits and top-k equal a float64 indexer written here, its bytes follow DeepSeek-V3.2's dtypes, and bad
input is one line (``InputError``; exit 2 on the command line). The count held against the Triton kernel
``iosim/kernels/examples/dsa_indexer.py``: tests/test_kernels_dsa_indexer.py."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from iosim import Problem
from iosim.base.errors import InputError
from iosim.masking.topk_sparse import topk_sparse

ROOT = pathlib.Path(__file__).resolve().parents[1]


def selection(B, N_q, N_k, k, seed):
    """k distinct key tokens per query token, one selection for all heads: shape (B, 1, N_q, k)."""
    rng = np.random.default_rng(seed)
    return np.array([[rng.permutation(N_k)[:k] for _ in range(N_q)] for _ in range(B)])[:, None]


def scan_model(B, N_q, N_k, H, d, Bn, k):
    """(reads, writes) per array and the peak, program by program: a scoring program per (token, block of Bn keys)
    holds q_I (H d), w (H), c keys (c d), their scales (c) and c logits; a top-k program per token holds N_k
    logits and k indices."""
    words = {n: [0, 0] for n in ("q_I", "w", "K_I", "k_scale", "logits", "indices")}
    peak = 0
    for _ in range(B * N_q):
        for c0 in range(0, N_k, Bn):
            c = min(Bn, N_k - c0)
            words["q_I"][0] += H * d
            words["w"][0] += H
            words["K_I"][0] += c * d
            words["k_scale"][0] += c
            words["logits"][1] += c
            peak = max(peak, H * d + H + c * d + c + c)
        words["logits"][0] += N_k
        words["indices"][1] += k
        peak = max(peak, N_k + k)
    return {n: tuple(v) for n, v in words.items()}, peak


GRIDS = [  # (problem, H_I, d_I, B_n, k, policy): ragged N_k against B_n, GQA, MLA's latent, causal, B > 1
    (dict(B=2, H_q=4, H_kv=2, N_q=3, N_k=37, d=8), 4, 8, 16, 5, "per-query"),
    (dict(B=1, H_q=2, H_kv=1, N_q=2, N_k=50, d_qk=12, d_v=8, latent=True), 3, 5, 64, 7, "gqa"),
    (dict(B=2, H_q=2, H_kv=1, N_q=5, N_k=23, d=4, causal=True), 2, 3, 7, 4, "group:2"),
    (dict(B=1, H_q=2, H_kv=2, N_q=1, N_k=41, d=8), 16, 4, 1, 3, "gather"),
]


@pytest.mark.parametrize("grid", GRIDS, ids=[f"{g[5]}-Nk{g[0]['N_k']}-Bn{g[3]}" for g in GRIDS])
def test_the_scan_equals_a_model_counted_here_and_leaves_the_attention_unchanged(grid):
    dims, H, d, Bn, k, policy = grid
    p = Problem(**dims)
    idx = selection(p.B, p.N_q, p.N_k, k, seed=len(policy))
    plain = topk_sparse(p, idx, policy=policy)
    r = topk_sparse(p, idx, policy=policy, indexer=(H, d, Bn))
    want, scan_peak = scan_model(p.B, p.N_q, p.N_k, H, d, Bn, k)
    got = {n: (c.reads, c.writes) for n, c in r.stats.per_array.items()}
    for name, rw in want.items():
        before = plain.stats.per_array.get(name)
        base = (before.reads, before.writes) if before else (0, 0)
        assert got[name] == (base[0] + rw[0], base[1] + rw[1]), name
    for name, c in plain.stats.per_array.items():
        if name != "indices":
            assert got[name] == (c.reads, c.writes), name  # the attention reads what it read without the scan
    assert r.stats.peak == max(plain.stats.peak, scan_peak)
    assert r.exact
    assert r.indexer == (H, d, Bn)


def test_the_indexer_is_off_by_default_and_its_block_defaults_to_64():
    p = Problem(N_q=2, N_k=100, d=8)
    idx = selection(1, 2, 100, 3, seed=0)
    assert not {"q_I", "K_I", "logits"} & set(topk_sparse(p, idx).words)
    r = topk_sparse(p, idx, indexer="2:4")
    assert r.words["q_I"] == 2 * 2 * (2 * 4)  # 2 tokens x ceil(100 / 64) scoring programs x H_I d_I


def test_the_logits_and_selection_equal_a_float64_indexer_written_here():
    p = Problem(B=2, H_q=2, H_kv=1, N_q=3, N_k=29, d=8, causal=True)
    H, d, k = 3, 6, 4
    idx = selection(2, 3, 29, k, seed=5)
    r = topk_sparse(p, idx, indexer=(H, d, 8), count_only=False, seed=7)
    rng = np.random.default_rng([7, 1])  # the draws the docstring states: q_I, w, K_I, k_scale
    q = rng.standard_normal((2 * 3, H, d))
    w = rng.random((2 * 3, H))
    K = rng.standard_normal((2, 29, d))
    ks = rng.random((2, 29)) + 0.5
    want = np.empty((6, 29))
    for row in range(6):
        b, t = divmod(row, 3)
        for s in range(29):
            score = sum(w[row, h] * max(q[row, h] @ K[b, s], 0.0) for h in range(H)) * ks[b, s]
            want[row, s] = score if s <= t + 29 - 3 else -np.inf  # bottom-right causal: token t at t + N_k - N_q
    got = r.outputs["logits"]
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    assert np.abs(got[np.isfinite(want)] - want[np.isfinite(want)]).max() < 1e-12
    assert r.errors["logits"] < 1e-12
    top = np.argsort(-want, axis=1, kind="stable")[:, :k]
    assert np.array_equal(r.outputs["selection"], top)
    assert r.errors["O"] < 1e-12  # the attention over the indices given is unchanged


def test_bytes_per_array_at_deepseek_v32_dtypes():
    """fp8 q_I and keys (1 byte), float32 weights, scales and logits, int32 indices (4 bytes)."""
    p = Problem(N_q=2, N_k=40, d=8)
    r = topk_sparse(p, selection(1, 2, 40, 3, seed=1), indexer=(2, 16, 32))
    per = {n: 1 if n in ("q_I", "K_I") else 4 for n in ("q_I", "w", "K_I", "k_scale", "logits", "indices")}
    for name, size in per.items():
        assert r.bytes[name] == r.words[name] * size, name
    from iosim.spec.kv_format import kv_format

    per_key = (r.bytes["K_I"] + r.bytes["k_scale"]) / (2 * 40)  # 2 tokens each scan 40 keys and their scales
    assert per_key == kv_format("fp8:token:separate").row_bytes(16) == 16 + 4  # the KV format of that cache


BAD = [
    (dict(indexer=(0, 8)), "indexer heads 1 to 4,096"),
    (dict(indexer=(4097, 8)), "indexer heads 1 to 4,096"),
    (dict(indexer=(4, 0)), "width 1 to 65,536"),
    (dict(indexer=(4, 8, 0)), "1 to 1,048,576"),
    (dict(indexer=(4, 8, 1 << 21)), "1 to 1,048,576"),
    (dict(indexer="4"), "H_I:d_I"),
    (dict(indexer="4:x"), "H_I:d_I"),
    (dict(indexer=(4, 8, 2, 1)), "H_I:d_I"),
    (dict(indexer=(True, 8)), "H_I:d_I"),
    (dict(indexer=(4, 8), block=2), "block 1, q_block 1"),
    (dict(indexer=(4, 8), q_block=2, indices=[[0, 1]]), "block 1, q_block 1"),
    (dict(indexer=(4, 8), invalid=-1), "no -1"),
]


@pytest.mark.parametrize("kw, words", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_indexer_is_one_line(kw, words):
    p = Problem(N_q=2, N_k=40, d=8)
    kw = dict(kw)
    idx = np.array(kw.pop("indices", [[0, 1], [2, 3]]))
    with pytest.raises(InputError, match="indexer") as e:
        topk_sparse(p, idx, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_selection_per_head_is_not_what_the_indexer_writes():
    p = Problem(H_q=2, H_kv=2, N_q=2, N_k=40, d=8)
    with pytest.raises(InputError, match=r"indexer writes one selection per query token for all heads"):
        topk_sparse(p, selection(1, 2, 40, 3, seed=0).repeat(2, axis=1), indexer=(4, 8))


@pytest.mark.parametrize("argv", [["--indexer", "4:0"], ["--indexer", "4:8", "--invalid-index", "-1"]])
def test_the_command_line_refuses_a_bad_indexer_with_exit_2(argv, capsys, monkeypatch):
    from iosim.cli import main

    monkeypatch.chdir(ROOT)
    base = ["run", "topk-sparse", "--Nq", "2", "--Nk", "100", "--d", "8", "--M", "10000", "--count-only",
            "--indices", "mod:experiments/data/topk_selections.py:dsa"]  # fmt: skip
    assert main([*base, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "indexer" in err[0]


def test_indexer_given_to_another_algorithm_exits_2(capsys):
    from iosim.cli import main

    assert main(["run", "flash2", "--N", "64", "--d", "8", "--M", "1000", "--indexer", "4:4"]) == 2
    assert "--indexer is read by topk-sparse" in capsys.readouterr().err


def test_the_command_line_counts_the_scan_in_its_json(capsys, monkeypatch):
    import json

    from iosim.cli import main

    monkeypatch.chdir(ROOT)
    argv = ["run", "topk-sparse", "--Nq", "2", "--Nk", "100", "--d", "8", "--M", "10000", "--count-only", "--json",
            "--indices", "mod:experiments/data/topk_selections.py:dsa", "--indexer", "2:4:32"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["indexer"] == [2, 4, 32] and out["exact"]
    T = 4  # ceil(100 / 32) scoring programs per token, 2 tokens, 6 indices each (the dsa selection)
    assert out["words"]["q_I"] == 2 * T * 2 * 4 and out["words"]["K_I"] == 2 * 100 * 4
    assert out["words"]["logits"] == 2 * 2 * 100 and out["bytes"]["K_I"] == 2 * 100 * 4  # fp8: a byte a word
    assert out["words"]["indices"] == 2 * 6 + 2 * 6  # written by the indexer, read by the attention
