"""Sparse attention by top-k indices (iosim.masking.topk_sparse): the simulated counts equal the closed form and an
independent model written here (per array and peak) on ragged problems for every policy; the floor equals a union
counted here; the outputs equal a float64 reference written here (a dense softmax under the selection's mask); the
index sources (array, file:, mod:, function) and bad input in one line."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

from iosim import Problem
from iosim.base.errors import InputError
from iosim.masking.topk_sparse import topk_sparse


def selection(p, Bm, Hm, Tq, k, nblk, seed):
    """k distinct blocks of nblk per row, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return np.array([rng.permutation(nblk)[:k] for _ in range(Bm * Hm * Tq)]).reshape(Bm, Hm, Tq, k)


def pos(p, r):
    """Query row r's position: r + N_k - N_q under causal (bottom-right), else past every key."""
    return r + p.N_k - p.N_q if p.causal else p.N_k


def model(p, idx, policy, block, q_block, Bc=64):
    """Words per array and the peak, counted program by program from the policy's description: a program loads
    the union of its rows' selected blocks, leaving out -1 entries and, under causal, a block that starts after the
    position of every one of its rows."""
    G = p.H_q // p.H_kv
    if policy == "per-query":
        progs = [[(b, h, r)] for b in range(p.B) for h in range(p.H_q) for r in range(p.N_q)]
    elif policy.startswith("group:"):
        g = int(policy[6:])
        progs = [[(b, h, r) for r in range(r0, min(r0 + g, p.N_q))] for b in range(p.B) for h in range(p.H_q)
                 for r0 in range(0, p.N_q, g)]  # fmt: skip
    else:
        progs = [[(b, hk * G + t, r) for t in range(G)] for b in range(p.B) for hk in range(p.H_kv)
                 for r in range(p.N_q)]  # fmt: skip
    Bm, Hm = idx.shape[:2]
    k = idx.shape[3]
    dv_load = 0 if p.latent else p.d_v
    words = dict(Q=0, K=0, V=0, O=0, L=0, indices=0, Kws=0, Vws=0)
    peak = 0
    for prog in progs:
        R = len(prog)
        rows_read = set()
        union = set()
        for b, h, r in prog:
            hh = h if Hm == p.H_q else (h // G if Hm == p.H_kv else 0)
            key = (b if Bm == p.B else 0, hh, r // q_block)
            rows_read.add(key)
            union |= {int(j) for j in idx[key]}
        last = max(pos(p, r) for _, _, r in prog)
        union = {j for j in union if j >= 0 and j * block <= last}
        widths = [min(block, p.N_k - j * block) for j in union] or [0]
        words["Q"] += R * p.d_qk
        words["O"] += R * p.d_v
        words["L"] += R
        words["indices"] += len(rows_read) * k
        words["K"] += sum(widths) * p.d_qk
        words["V"] += sum(widths) * dv_load
        base = R * (p.d_qk + p.d_v + 2)
        if policy == "gather":
            words["Kws"] += 2 * sum(widths) * p.d_qk
            words["Vws"] += 2 * sum(widths) * dv_load
            peak = max(peak, len(rows_read) * k + max(widths) * max(p.d_qk, dv_load))
            peak = max(peak, base + min(Bc, sum(widths)) * (p.d_qk + dv_load + R))
        else:
            peak = max(peak, base + len(rows_read) * k + max(widths) * (p.d_qk + dv_load + R))
    return {a: w for a, w in words.items() if w}, peak


def floor(p, idx, block, q_block):
    """The union of the keys each key/value head's rows attend to (selected, not -1, causal: at or before the
    row's position), + Q + O."""
    G = p.H_q // p.H_kv
    Bm, Hm = idx.shape[:2]
    keys = 0
    for b in range(p.B):
        for hk in range(p.H_kv):
            sel = set()
            for h in range(hk * G, hk * G + G):
                for r in range(p.N_q):
                    hh = h if Hm == p.H_q else (h // G if Hm == p.H_kv else 0)
                    for j in idx[b if Bm == p.B else 0, hh, r // q_block]:
                        if j >= 0:
                            sel |= set(range(j * block, min((j + 1) * block, p.N_k, pos(p, r) + 1)))
            keys += len(sel)
    out = {"Q": p.B * p.H_q * p.N_q * p.d_qk, "K": keys * p.d_qk, "O": p.B * p.H_q * p.N_q * p.d_v}
    if not p.latent:
        out["V"] = keys * p.d_v
    return out


PROBLEMS = [dict(B=1, H_q=1, N_q=7, N_k=53, d_qk=5, d_v=3), dict(B=2, H_q=4, H_kv=2, N_q=5, N_k=37, d_qk=4, d_v=6),
            dict(B=1, H_q=3, N_q=1, N_k=29, d_qk=6, d_v=4, latent=True)]  # fmt: skip


@pytest.mark.parametrize(
    "kw, block, q_block, heads", list(itertools.product(PROBLEMS, [1, 8], [1, 2], ["1", "kv", "q"]))
)
def test_counts_equal_closed_form_and_model(kw, block, q_block, heads):
    p = Problem(**kw)
    q_block = min(q_block, p.N_q)
    nblk = -(-p.N_k // block)
    Hm = {"1": 1, "kv": p.H_kv, "q": p.H_q}[heads]
    Tq = -(-p.N_q // q_block)
    idx = selection(p, p.B, Hm, Tq, min(3, nblk), nblk, seed=block + 7 * q_block + Hm)
    for policy in ("per-query", "group:2", "group:3", "gqa", "gather"):
        if policy == "gather" and Hm > p.H_kv:
            continue
        r = topk_sparse(p, idx, policy=policy, block=block, q_block=q_block, Bc=4)
        assert r.exact, (policy, r.stats.per_array, r.predicted.per_array)
        words, peak = model(p, idx, policy, block, q_block, Bc=4)
        assert r.words == words, (policy, r.words, words)
        assert r.stats.peak == peak and not r.stats.overflowed
        assert r.floor == floor(p, idx, block, q_block)
        assert r.kv_words >= r.floor["K"] + r.floor.get("V", 0)


def test_group_union_hand_count():
    """Four rows, blocks of 16 over N_k = 60 (the last block 12 keys): rows pick {0,2}, {2,3}, {1,3}, {0,1}. Per
    query: 32 + 28 + 28 + 32 = 120 keys; one group of 4: the union {0,1,2,3} = 60 keys; groups of 3 then 1:
    {0,1,2,3} (60) + {0,1} (32) = 92."""
    idx = np.array([[0, 2], [2, 3], [1, 3], [0, 1]])
    p = Problem(N_q=4, N_k=60, d=8)
    got = {pol: topk_sparse(p, idx, block=16, policy=pol).words["K"] for pol in ("per-query", "group:4", "group:3")}
    assert got == {"per-query": 120 * 8, "group:4": 60 * 8, "group:3": 92 * 8}


def reference(p, Q, K, V, idx, block, q_block, scale):
    """Dense float64 softmax with every unselected key (and, causal, every key after the row's position) masked to
    -inf; a row with no key left: O = 0."""
    G = p.H_q // p.H_kv
    Bm, Hm = idx.shape[:2]
    O = np.zeros((p.B, p.H_q, p.N_q, p.d_v))
    for b, h, r in itertools.product(range(p.B), range(p.H_q), range(p.N_q)):
        hh = h if Hm == p.H_q else (h // G if Hm == p.H_kv else 0)
        allowed = np.zeros(p.N_k, bool)
        for j in idx[b if Bm == p.B else 0, hh, r // q_block]:
            if j >= 0:
                allowed[j * block : (j + 1) * block] = True
        allowed &= np.arange(p.N_k) <= pos(p, r)
        if not allowed.any():
            continue
        Kh = K.reshape(p.B, p.H_kv, p.N_k, -1)[b, h // G]
        Vh = Kh[:, : p.d_v] if p.latent else V.reshape(p.B, p.H_kv, p.N_k, -1)[b, h // G]
        s = np.where(allowed, scale * Kh @ Q.reshape(p.B, p.H_q, p.N_q, -1)[b, h, r], -np.inf)
        w = np.exp(s - s.max())
        O[b, h, r] = w @ Vh / w.sum()
    return O.reshape(-1, p.d_v)


@pytest.mark.parametrize("kw, policy, per_query_head", [
    (PROBLEMS[1], "per-query", False), (PROBLEMS[1], "group:2", False), (PROBLEMS[1], "gqa", False),
    (PROBLEMS[1], "gqa", True), (PROBLEMS[2], "gather", False), (PROBLEMS[2], "group:3", False),
])  # fmt: skip
def test_outputs_equal_reference(kw, policy, per_query_head):
    """Rows of one program that selected different blocks (group:2; gqa with a selection per query head) are masked
    where they did not select the block loaded for another."""
    p = Problem(**kw)
    nblk = -(-p.N_k // 8)
    idx = selection(p, p.B, p.H_q if per_query_head else p.H_kv, p.N_q, 2, nblk, seed=3)
    r = topk_sparse(p, idx, policy=policy, block=8, count_only=False, seed=5, Bc=3)
    assert r.exact and r.errors["O"] < 1e-12 and r.errors["L"] < 1e-12
    rng = np.random.default_rng(5)  # the inputs as the docstring says they are drawn
    Q = rng.standard_normal((p.B * p.H_q * p.N_q, p.d_qk))
    K = rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_qk))
    V = None if p.latent else rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_v))
    O_ref = reference(p, Q, K, V, idx, 8, 1, 1 / np.sqrt(p.d_qk))
    assert np.abs(r.outputs["O"] - O_ref).max() < 1e-12


CAUSAL = [dict(B=1, H_q=2, H_kv=1, N_q=7, N_k=53, d_qk=5, d_v=3, causal=True),
          dict(B=2, H_q=4, H_kv=2, N_q=9, N_k=6, d_qk=4, d_v=6, causal=True),  # N_q > N_k: rows 0..2 see no key
          dict(B=1, H_q=3, N_q=5, N_k=29, d_qk=6, d_v=4, latent=True, causal=True)]  # fmt: skip


def with_invalid(idx, seed):
    """About a third of the entries set to -1 (no block), a row possibly all -1."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(idx.shape) < 0.35, -1, idx)


@pytest.mark.parametrize("kw, block, q_block", list(itertools.product(CAUSAL, [1, 4], [1, 2])))
def test_causal_and_invalid_counts_equal_closed_form_and_model(kw, block, q_block):
    p = Problem(**kw)
    nblk = -(-p.N_k // block)
    Tq = -(-p.N_q // q_block)
    for Hm, empty in ((p.H_kv, False), (p.H_kv, True), (p.H_q, True)):
        idx = selection(p, p.B, Hm, Tq, min(4, nblk), nblk, seed=block + 3 * q_block + Hm)
        idx = with_invalid(idx, seed=Hm) if empty else idx
        for policy in ("per-query", "group:3", "gqa", "gather"):
            if policy == "gather" and Hm > p.H_kv:
                continue
            r = topk_sparse(p, idx, policy=policy, block=block, q_block=q_block, Bc=3, invalid=-1 if empty else None)
            assert r.exact, (policy, r.stats.per_array, r.predicted.per_array)
            words, peak = model(p, idx, policy, block, q_block, Bc=3)
            assert r.words == words and r.stats.peak == peak, (policy, r.words, words, r.stats.peak, peak)
            assert r.floor == floor(p, idx, block, q_block)


def test_causal_block_loaded_if_any_row_of_the_program_sees_it():
    """N_q = 4 rows at positions 4..7 (N_k = 8), blocks of 2 keys starting at 0, 2, 4, 6; rows select {3, 0},
    {3, 1}, {3, 2}, {0, 1}. Block 3 starts at 6: rows 0 and 1 do not see it. Per query: 2 + 2 + 4 + 4 = 12 keys;
    groups of 2: rows 0..1 (last position 5) load {0, 1}, rows 2..3 (last 7) {0, 1, 2, 3}: 4 + 8 = 12; one group of
    4 (last 7): {0, 1, 2, 3} = 8 keys, block 3 once for row 2's sake. Not causal: 16, 6 + 8 = 14, 8. The index
    words are 2 per row read either way."""
    idx = np.array([[3, 0], [3, 1], [3, 2], [0, 1]])
    got = {}
    for causal in (True, False):
        p = Problem(N_q=4, N_k=8, d=8, causal=causal)
        for pol in ("per-query", "group:2", "group:4"):
            r = topk_sparse(p, idx, block=2, policy=pol, count_only=False)
            assert r.exact and r.errors["O"] < 1e-12 and r.words["indices"] == 8
            got[causal, pol] = r.words["K"] // 8
    assert got == {(True, "per-query"): 12, (True, "group:2"): 12, (True, "group:4"): 8,
                   (False, "per-query"): 16, (False, "group:2"): 14, (False, "group:4"): 8}  # fmt: skip


@pytest.mark.parametrize("kw, policy", [(CAUSAL[1], "group:3"), (CAUSAL[1], "gqa"), (CAUSAL[0], "per-query"),
                                        (CAUSAL[2], "gather"), (CAUSAL[0], "gather")])  # fmt: skip
def test_causal_and_invalid_outputs_equal_reference(kw, policy):
    """Keys after a row's position inside a loaded block are masked; rows with no key left (N_q > N_k, all -1)
    get O = 0 and L = -inf, as the reference written here."""
    p = Problem(**kw)
    nblk = -(-p.N_k // 4)
    Hm = p.H_q if policy == "group:3" else p.H_kv
    idx = with_invalid(selection(p, p.B, Hm, p.N_q, min(3, nblk), nblk, seed=4), seed=2)
    r = topk_sparse(p, idx, policy=policy, block=4, count_only=False, seed=5, Bc=3, invalid=-1)
    assert r.exact and r.errors["O"] < 1e-12 and r.errors["L"] < 1e-12
    rng = np.random.default_rng(5)
    Q = rng.standard_normal((p.B * p.H_q * p.N_q, p.d_qk))
    K = rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_qk))
    V = None if p.latent else rng.standard_normal((p.B * p.H_kv * p.N_k, p.d_v))
    O_ref = reference(p, Q, K, V, idx, 4, 1, 1 / np.sqrt(p.d_qk))
    assert np.abs(r.outputs["O"] - O_ref).max() < 1e-12
    empty = ~O_ref.any(axis=1)
    assert np.isneginf(r.outputs["L"][empty]).all() and np.isfinite(r.outputs["L"][~empty]).all()
    if kw is CAUSAL[1]:
        assert empty.sum() >= p.B * p.H_q * (p.N_q - p.N_k)  # the rows before the first key


def test_sources_file_mod_function(tmp_path):
    p = Problem(N_q=3, N_k=23, d=4)
    idx = np.array([[0, 4], [1, 2], [3, 0]], dtype=np.int32)
    np.save(tmp_path / "idx.npy", idx)
    (tmp_path / "sel.py").write_text(
        "import numpy as np\ndef pick(p):\n    return np.array([[0, 4], [1, 2], [3, 0]])\n"
    )
    want = topk_sparse(p, idx, block=5).words
    assert topk_sparse(p, f"file:{tmp_path / 'idx.npy'}", block=5).words == want
    assert topk_sparse(p, f"mod:{tmp_path / 'sel.py'}:pick", block=5).words == want
    assert topk_sparse(p, lambda prob: idx, block=5).words == want


BAD = [
    (np.array([[0, 4], [1, 2], [3, 9]]), "must be key blocks from 0 to 4"),
    (np.array([[0, 4], [1, 2], [3, -1]]), "-1 as no block needs invalid=-1"),
    (np.array([[0, 1], [1, 1], [3, 0]]), "at most once per row"),
    (np.array([[0.0, 1.0], [1, 2], [3, 0]]), "must be an integer array"),
    (np.array([[0, 1], [1, 2]]), "must have shape"),
    (np.zeros((3, 0), dtype=np.int64), "empty selection"),
    ("file:/nonexistent/x.npy", "must be a .npy file"),
    ("mod:/nonexistent/x.py:f", "readable Python file"),
    ("nonsense", "must be an integer array, file:PATH.npy"),
]


@pytest.mark.parametrize("indices, text", BAD)
def test_bad_indices_one_line(indices, text):
    p = Problem(N_q=3, N_k=23, d=4)
    with pytest.raises(InputError, match="indices") as e:
        topk_sparse(p, indices, block=5)
    assert text in str(e.value) and "\n" not in str(e.value)


OPTIONS = [(dict(policy="group:0"), "policy"), (dict(policy="blocks"), "policy"), (dict(block=0), "block"),
           (dict(policy="gather"), "one selection per key/value"), (dict(invalid=0), "invalid must be None"),
           (dict(invalid=True), "invalid must be None"), (dict(invalid=-1.0), "invalid must be None")]  # fmt: skip


def test_invalid_entries_other_than_minus_one_refused():
    p = Problem(N_q=3, N_k=23, d=4)
    with pytest.raises(InputError, match="indices must be key blocks from 0 to 4 .*-1 for no block"):
        topk_sparse(p, np.array([[0, -1], [-1, -1], [3, -2]]), block=5, invalid=-1)
    with pytest.raises(InputError, match="at most once per row"):
        topk_sparse(p, np.array([[0, 0], [-1, -1], [3, -1]]), block=5, invalid=-1)
    r = topk_sparse(p, np.array([[0, -1], [-1, -1], [3, -1]]), block=5, invalid=-1, count_only=False)
    assert r.words["K"] == 10 * 4 and r.words["indices"] == 6 and r.exact  # blocks 0 and 3; row 1 sees none
    assert r.outputs["L"][1] == -np.inf and not r.outputs["O"][1].any()


@pytest.mark.parametrize("kw, text", OPTIONS)
def test_bad_options_one_line(kw, text):
    p = Problem(H_q=2, H_kv=1, N_q=3, N_k=20, d=4)
    idx = np.zeros((1, 2, 3, 1), dtype=np.int64)
    with pytest.raises(InputError, match=text):
        topk_sparse(p, idx, **kw)


def test_cli_bad_indices_exit_2_nothing_written(tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.array([[0, 0]]))
    out = subprocess.run([sys.executable, "-m", "iosim.cli", "run", "topk-sparse", "--Nq", "1", "--Nk", "16", "--dqk",
                          "4", "--M", "1000", "--indices", f"file:{bad}", "--index-block", "4"],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    errors = [line for line in out.stderr.splitlines() if line.startswith("iosim: error")]
    assert len(errors) == 1 and "indices" in errors[0] and "at most once" in errors[0] and "Traceback" not in out.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad.npy"]


def test_cli_counts_and_refusals(tmp_path, capsys):
    from iosim.cli import main

    np.save(tmp_path / "idx.npy", np.array([[0, 2], [2, 3], [1, 3], [0, 1]], dtype=np.int32))
    base = ["run", "topk-sparse", "--Nq", "4", "--Nk", "60", "--d", "8", "--M", "2000", "--indices",
            f"file:{tmp_path / 'idx.npy'}", "--index-block", "16", "--count-only"]  # fmt: skip
    assert main([*base, "--policy", "group:4"]) == 0
    out = capsys.readouterr().out
    assert "K/V words read / their floor                             960 / 960 = 1.00" in out
    assert main([*base, "--policy", "per-query"]) == 0
    assert "1,920 / 960 = 2.00" in capsys.readouterr().out  # 120 keys per query row against a union of 60
    for extra, name in (
        (["--splits", "2"], "--splits"),
        (["--backward"], "--backward"),
        (["--mask", "causal"], "--mask"),
    ):
        assert main([*base, *extra]) == 2
        assert f"iosim: error: {name} is not read by topk-sparse" in capsys.readouterr().err
    assert main(["run", "flash2", "--N", "8", "--d", "4", "--M", "500", "--indices", "file:x.npy"]) == 2
    assert "--indices are read by topk-sparse" in capsys.readouterr().err


def test_experiment_17_reproduces_the_union(tmp_path):
    """The ~3x of vLLM PR #52963 from the seeded synthetic trace (quick grid): about 22 distinct blocks of 64 loaded,
    the group's K words at the floor, every count exact."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "17_topk_overlap.py"
    spec = importlib.util.spec_from_file_location("topk_overlap", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = type("G", (), mod.QUICK)
    rows = mod.measure(g)
    head = next(x for x in rows if x["core"] == 14)
    assert 21 <= head["union_blocks"] <= 23 and head["loaded_blocks_per_query"] == 64
    assert all(x["exact"] and x["group_at_floor"] for x in rows)
    assert head["ratio"] == pytest.approx(64 / head["union_blocks"])  # 4 k / |union|, averaged over sequences
    assert mod.verdict(rows, g).verdict.holds
    idx = mod.trace(3, 16, 64, 14, 1)  # the stated trace: 14 blocks common to the four tokens of each sequence
    assert all(len(set.intersection(*(set(t) for t in idx[b, 0]))) >= 14 for b in range(3))


def test_docstring_example_and_memory():
    import doctest

    import iosim.masking.topk_sparse

    assert doctest.testmod(iosim.masking.topk_sparse).failed == 0
    p = Problem(N_q=4, N_k=60, d=8)
    idx = np.array([[0, 2], [2, 3], [1, 3], [0, 1]])
    r = topk_sparse(p, idx, block=16, policy="group:4")
    assert topk_sparse(p, idx, block=16, policy="group:4", M=r.stats.peak).exact  # fits at exactly its peak
    with pytest.raises(InputError, match="M must be an integer of at least the schedule's working set, 400"):
        topk_sparse(p, idx, block=16, policy="group:4", M=r.stats.peak - 1)


def test_cli_causal_and_invalid_index(tmp_path, capsys):
    """--causal reaches the problem (the rows at positions 4..7 of test_causal_block_loaded_if_any_row_..., per
    query: 12 keys of K and of V against a floor of the 7 keys 0..6 the rows attend to); -1 entries need
    --invalid-index -1."""
    from iosim.cli import main

    np.save(tmp_path / "idx.npy", np.array([[3, 0], [3, 1], [3, 2], [0, 1]], dtype=np.int32))
    np.save(tmp_path / "pad.npy", np.array([[3, 0], [-1, 1], [3, -1], [-1, -1]], dtype=np.int32))
    base = ["run", "topk-sparse", "--Nq", "4", "--Nk", "8", "--d", "8", "--M", "2000", "--index-block", "2",
            "--count-only", "--causal", "--indices"]  # fmt: skip
    assert main([*base, f"file:{tmp_path / 'idx.npy'}"]) == 0
    out = capsys.readouterr().out
    assert "causal (bottom-right)" in out and "192 / 112 = 1.71" in out  # (12 + 12) x 8 / (7 + 7) x 8
    assert main([*base, f"file:{tmp_path / 'pad.npy'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "-1 as no block needs invalid=-1" in err[0]
    assert main([*base, f"file:{tmp_path / 'pad.npy'}", "--invalid-index", "-1"]) == 0
    out = capsys.readouterr().out  # rows 0..3 load {0}, {1}, {3} (it starts at 6 <= 6), {}: 6 keys; seen 0..3, 6
    assert "invalid index (selects no block)" in out and "96 / 80 = 1.20" in out
    with pytest.raises(SystemExit) as e:
        main([*base, f"file:{tmp_path / 'pad.npy'}", "--invalid-index", "0"])
    assert e.value.code == 2 and "--invalid-index" in capsys.readouterr().err
    assert main(["run", "flash2", "--N", "8", "--d", "4", "--M", "500", "--invalid-index", "-1"]) == 2
    assert "--invalid-index is read by topk-sparse" in capsys.readouterr().err
