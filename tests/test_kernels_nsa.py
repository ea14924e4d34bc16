"""flash-linear-attention's NSA selected-attention forward (``fla.ops.nsa.parallel.parallel_nsa_fwd``, fla-core),
counted in place from the installed package by iosim/kernels/examples/fla_nsa.py (nothing of fla copied here):
its output equals a float64 selected attention written here, and every array (Q, K, V, O, L, the indices) equals
both a per-program model written here and iosim's top-k schedule (``iosim.masking.topk_sparse``) with policy ``gqa`` on
a
causal problem (the queries the last T_q tokens), one program per (query token, key/value head) holding the group's
query heads. A block listed after its query's position and a -1 entry (fla's top-k padding) are read as index words
and skipped by the kernel, and left out by the causal schedule with ``invalid=-1``.

docs/sparse-indices.md's section on this kernel pastes ``iosim kernel``'s table and ``iosim run topk-sparse``'s
for the same selection; the first is checked here (the second by tests/test_sparse_indices_doc.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import pytest

# looked up, not imported: the counting process imports them (fla's import alone takes seconds)
MISSING = [m for m in ("triton", "torch", "fla") if importlib.util.find_spec(m) is None]
if MISSING:
    pytest.skip(f"{', '.join(MISSING)} not installed (pip install -e '.[triton,kernel-libs]')", allow_module_level=True)

from iosim import Problem  # noqa: E402
from iosim.masking.topk_sparse import topk_sparse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "iosim" / "kernels" / "examples" / "fla_nsa.py"
CONFIG = "num_warps=1,num_ctas=1,num_stages=1"  # one of the kernel's 12 autotune configs (none changes a load)
BLOCK = 16

# (a) ragged N (the last block, keys 96..99, is 4 wide); (b) 2 batch items, 2 KV heads, a ragged head dimension
# (d = 24 loads under a 32-wide mask) and d_v = 16; (c) prefill with one selection [0, 1] for every token: tokens
# 0..15 list block 1, which starts after them; (d) the same with a -1 entry (fla's top-k padding) in every row
AHEAD = [[[[0, 1]] * 32]]
PADDED = [[[[0, -1, 1]] * 32]]
CASES = [dict(N=100, N_q=8, d=16, H=16, kv_heads=1), dict(N=72, N_q=6, d=24, dv=16, B=2, H=32, kv_heads=2),
         dict(N=32, N_q=32, d=16, H=16, kv_heads=1, indices=AHEAD),
         dict(N=32, N_q=32, d=16, H=16, kv_heads=1, indices=PADDED)]  # fmt: skip


@pytest.fixture(scope="module")
def nsa():
    from iosim.kernels import count_batch

    return count_batch([(str(LAUNCHER), None, p) for p in CASES], "triton", config=CONFIG)


def dims(p: dict) -> tuple:
    return p.get("B", 1), p["H"], p["kv_heads"], p["N_q"], p["N"], p["d"], p.get("dv", p["d"])


def selection(arrays: dict) -> np.ndarray:
    """The indices the kernel read, (B, T_q, H_kv, S) -> iosim's (B, H_kv, T_q, S)."""
    return arrays["indices"].astype(np.int64).transpose(0, 2, 1, 3)


def hand_model(p: dict, sel: np.ndarray) -> dict:
    """Per program (b, query token t, KV head h) of parallel_nsa_fwd_kernel: Q's g rows (d), the S index words one
    by one, K (d) and V (d_v) of every selected block j with 0 <= j BS <= T_k - T_q + t (the rows below T_k: a ragged
    last block is c_j = min(BS, T_k - j BS) wide), O's g rows (d_v) and g logsumexps."""
    B, H, Hkv, Nq, N, d, dv = dims(p)
    g = H // Hkv
    w = {"Q": 0, "K": 0, "V": 0, "O": 0, "L": 0, "indices": 0}
    for b in range(B):
        for t in range(Nq):
            for h in range(Hkv):
                w["Q"] += g * d
                w["indices"] += sel.shape[3]
                for j in sel[b, h, t]:
                    if 0 <= j * BLOCK <= N - Nq + t:
                        c = min(BLOCK, N - j * BLOCK)
                        w["K"] += c * d
                        w["V"] += c * dv
                w["O"] += g * dv
                w["L"] += g
    return w


def reference(p: dict, arrays: dict, sel: np.ndarray):
    """float64 selected attention: query t of head hq attends to the keys of its KV head's selected blocks at or
    before its position T_k - T_q + t, a -1 entry none (natural-log logsumexp)."""
    B, H, Hkv, Nq, N, d, dv = dims(p)
    Q, K, V = arrays["Q"], arrays["K"], arrays["V"]
    O, L = np.zeros((B, Nq, H, dv)), np.zeros((B, Nq, H))
    for b in range(B):
        for t in range(Nq):
            for hq in range(H):
                h = hq // (H // Hkv)
                keys = np.concatenate([np.arange(j * BLOCK, min((j + 1) * BLOCK, N)) for j in sel[b, h, t] if j >= 0])
                keys = keys[keys <= N - Nq + t]
                s = (K[b, keys, h] @ Q[b, t, hq]) / np.sqrt(d)
                e = np.exp(s - s.max())
                O[b, t, hq] = e @ V[b, keys, h] / e.sum()
                L[b, t, hq] = s.max() + np.log(e.sum())
    return O, L


def per_array(counts) -> dict:
    return {k: a.reads + a.writes for k, a in counts.per_array.items()}


@pytest.mark.parametrize("i", range(len(CASES)))
def test_fla_nsa_output_is_selected_attention(nsa, i):
    p, (_, _, arrays) = CASES[i], nsa[i]
    O, L = reference(p, arrays, selection(arrays))
    assert np.abs(arrays["O"] - O).max() < 1e-5
    assert np.abs(arrays["L"] - L).max() < 1e-5


@pytest.mark.parametrize("i", range(len(CASES)))
def test_fla_nsa_counts_equal_the_per_program_model(nsa, i):
    p, (counts, numbers, arrays) = CASES[i], nsa[i]
    B, H, Hkv, Nq, *_ = dims(p)
    assert counts.programs == B * Hkv * Nq  # grid (T_q, NV = 1, B H_kv)
    assert counts.launch_info[0]["constexprs"]["BS"] == BLOCK and numbers["block"] == BLOCK
    assert all(a.reads == 0 or a.writes == 0 for a in counts.per_array.values())  # reads only or writes only
    assert per_array(counts) == hand_model(p, selection(arrays))


@pytest.mark.parametrize("i", range(len(CASES)))
def test_fla_nsa_equals_iosim_topk_gqa_policy(nsa, i):
    p, (counts, _, arrays) = CASES[i], nsa[i]
    B, H, Hkv, Nq, N, d, dv = dims(p)
    prob = Problem(B=B, H_q=H, H_kv=Hkv, N_q=Nq, N_k=N, d_qk=d, d_v=dv, causal=True)
    sel = selection(arrays)
    r = topk_sparse(prob, sel, policy="gqa", block=BLOCK, invalid=-1)
    got = {k: (a.reads, a.writes) for k, a in counts.per_array.items()}
    assert got == {k: (a.reads, a.writes) for k, a in r.stats.per_array.items()}
    assert r.exact and r.programs == counts.programs
    # per query head (per-query policy), the g heads of a group would each load the group's blocks
    per_query = topk_sparse(prob, sel, policy="per-query", block=BLOCK, invalid=-1).words
    assert per_query["K"] == (H // Hkv) * got["K"][0] and per_query["indices"] == (H // Hkv) * got["indices"][0]


@pytest.mark.parametrize("i", [2, 3])
def test_a_block_after_its_query_is_skipped_by_the_kernel_and_the_causal_schedule(nsa, i):
    counts, _, arrays = nsa[i]
    got = per_array(counts)
    sel = selection(arrays)
    # tokens 0..15 read index 1 (a word each; case (d) also a -1) but skip block 1: 16 tokens x 16 keys x d = 4,096
    # fewer words of K and of V than the 32 tokens x 2 blocks x 16 keys x 16 of the schedule without causal
    assert got["K"] == got["V"] == 32 * 2 * 16 * 16 - 16 * 16 * 16 == 12_288
    assert got["indices"] == 32 * sel.shape[3]
    causal = Problem(H_q=16, H_kv=1, N_q=32, N_k=32, d=16, causal=True)
    r = topk_sparse(causal, sel, policy="gqa", block=BLOCK, invalid=-1, count_only=False)
    assert r.words == got and r.exact and r.errors["O"] < 1e-12 and r.errors["L"] < 1e-12
    if i == 2:  # without causal the schedule loads block 1 for every token
        prob = Problem(H_q=16, H_kv=1, N_q=32, N_k=32, d=16)
        assert topk_sparse(prob, sel, policy="gqa", block=BLOCK).words["K"] == 16_384


# --- docs/sparse-indices.md: the command and the table it prints ---------------------------------------------------
PAGE = (ROOT / "docs" / "sparse-indices.md").read_text()
SECTION = PAGE[PAGE.index("## A public NSA kernel counted in place") :].split("\n## ")[0]
KERNEL = re.search(r"```bash\n(iosim kernel [^\n]*)\n```\n\n.*?```text\n(.*?)\n```", SECTION, flags=re.S)
RUN = re.search(r"```bash\n(iosim run topk-sparse [^\n]*)\n```\n\n```text\n(.*?)\n```", SECTION, flags=re.S)
PREFILL = re.search(r"```bash\n(iosim run topk-sparse [^\n]*:padded [^\n]*)\n```\n\n```text\n(.*?)\n```", SECTION, re.S)


def table(text: str) -> dict:
    """Array -> (reads, writes, bytes) of either table: ``iosim kernel``'s read and write bytes are summed."""
    rows = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] in ("Q", "K", "V", "O", "L", "indices"):
            n = [int(c.replace(",", "")) for c in cells[1:5] if re.fullmatch(r"[\d,]+", c)]
            rows[cells[0]] = (n[0], n[1], sum(n[2:4]))
    return rows


def timeless(text: str) -> list[str]:
    """The lines of a printed table with the counting time (the one line that varies) left out."""
    text = re.sub(r"counted in \d+\.\d+ s", "counted in T s", text)
    return [x.rstrip() for x in text.rstrip("\n").splitlines()]


def test_the_docs_kernel_table_is_what_the_command_prints(monkeypatch):
    from iosim.cli import main

    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(KERNEL[1].split()[1:]) == 0
    assert timeless(out.getvalue()) == timeless(KERNEL[2])
    # and its arrays are iosim run topk-sparse's for the same selection (that block: test_sparse_indices_doc.py)
    assert len(table(KERNEL[2])) == 6 and table(KERNEL[2]) == table(RUN[2])


def test_the_docs_prefill_table_is_the_kernels_count(nsa):
    """The page's causal prefill with a -1 entry (run by tests/test_sparse_indices_doc.py) is case (d) here: its
    selection function returns PADDED, and its table is the kernel's count (float32 and int32: 4 bytes a word)."""
    import runpy

    pick = runpy.run_path(str(ROOT / "experiments" / "data" / "nsa_prefill.py"))["padded"]
    assert "--causal --invalid-index -1" in PREFILL[1]
    assert pick(Problem(N_q=32, N_k=32, d=16)).tolist() == PADDED[0][0]
    counts = nsa[3][0]
    assert table(PREFILL[2]) == {k: (a.reads, a.writes, 4 * (a.reads + a.writes)) for k, a in counts.per_array.items()}
