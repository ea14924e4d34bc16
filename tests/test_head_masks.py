"""A mask that differs per (b, h) over a problem (iosim.masking.head_masks): a mask_mod reading b (document ids per
batch
item) and h (a window per head), or a BlockMask with an entry per (b, h), runs on flash1, flash2, standard and
square tiling, forward and backward, with every array's counts and the peak equal to the closed form; the cut into
parts is exact (a mask the same at every head counts the same cut or whole); each part counts what its own mask
given as an N x N array counts; the outputs equal the float64 reference of each head's mask; split-KV runs each
part's split kernel and one combine over the whole; packed GQA runs a group's rows under their own mask; the
floor, the bounds and the comparison read what the heads see; a trace is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

import iosim
from iosim import Problem
from iosim.base.errors import InputError
from iosim.cli import main
from iosim.hierarchy import Machine
from iosim.masking import head_masks, masks
from iosim.runner.api import run_keywords

DOCS = np.array([[0] * 20 + [1] * 9, [0] * 7 + [1] * 15 + [2] * 7])  # N_k = 29 tokens, documents per batch item


def doc_window(b, h, q_idx, kv_idx):  # documents per batch item, a causal window that grows with the head
    return (DOCS[b][q_idx] == DOCS[b][kv_idx]) & (q_idx >= kv_idx) & (kv_idx > q_idx - 3 - 4 * h)


def doc_only(b, h, q_idx, kv_idx):  # the same at every head of a batch item
    return (DOCS[b][q_idx] == DOCS[b][kv_idx]) & (q_idx >= kv_idx)


def per_group(b, h, q_idx, kv_idx):  # the same within each pair of query heads (g = 2)
    return doc_window(b, h // 2, q_idx, kv_idx)


def _exact(r) -> bool:
    return all(ps.stats.per_array == ps.predicted.per_array and ps.stats.peak == ps.predicted.peak
               for ps in r.passes.values())  # fmt: skip


def _counts(r) -> dict:
    return {k: (v.stats.per_array, v.stats.peak, v.predicted.per_array, v.predicted.peak) for k, v in r.passes.items()}


P = Problem(B=2, H_q=4, H_kv=2, N_q=17, N_k=29, d_qk=6, d_v=5)  # ragged: N_q != N_k, d_qk != d_v, g = 2


def _dense(fn, b, h, p=P):
    q, kv = np.arange(p.N_k)[:, None], np.arange(p.N_k)[None, :]
    return np.ascontiguousarray(np.broadcast_to(fn(b, h, q, kv), (p.N_k, p.N_k)))


PASSES = [("flash1", False), ("flash1", True), ("flash2", False), ("flash2", True), ("standard", False),
          ("square-tiling", False)]  # fmt: skip


@pytest.mark.parametrize("algo, backward", PASSES)
def test_per_head_mask_mod_is_exact_and_each_head_its_own_mask(algo, backward):
    """Counts equal the closed form per array and in peak; each (b, h) counts what its own mask as an N x N array
    counts on one head; outputs equal the float64 reference; the floor is at most the counts."""
    kw = dict(Br=4, Bc=5, backward=backward) if algo.startswith("flash") else {}
    r = run_keywords(algo, problem=P, M=900, mask=masks.from_mask_mod(doc_window), seed=1, **kw)
    assert _exact(r) and r.schedule["mask_parts"] == "8 (head)" and r.mask == "mod:doc_window per (b, h)"
    assert max(r.errors.values()) < 1e-12 and r.finite
    one = Problem(N_q=P.N_q, N_k=P.N_k, d_qk=P.d_qk, d_v=P.d_v)
    heads = [run_keywords(algo, problem=one, M=900, mask=_dense(doc_window, b, h), count_only=True, **kw)
             for b in range(P.B) for h in range(P.H_q)]  # fmt: skip
    fwd = heads[0].passes["forward"].stats
    for x in heads[1:]:
        fwd = fwd + x.passes["forward"].stats
    assert r.passes["forward"].stats.per_array == fwd.per_array and r.passes["forward"].stats.peak == fwd.peak
    for ps in r.passes.values():
        assert 0 < ps.lower_bound <= ps.stats.total


CUT_CASES = [("flash1", "per-head", {}, True), ("flash2", "per-head", {}, True), ("flash2", "packed", {}, True),
             ("flash1", "packed", {}, False), ("flash2", "per-head", {"page_size": 6}, False),
             ("flash1", "per-head", {"latent": True}, False), ("standard", "per-head", {}, False),
             ("square-tiling", "per-head", {}, False), ("standard", "per-head", {"square": True}, True),
             ("square-tiling", "per-head", {"square": True}, True), ("flash2", "per-head", {"splits": 2}, False),
             ("flash2", "packed", {"splits": 3}, False)]  # fmt: skip


@pytest.mark.parametrize("how, algo, gqa, sched, backward", [
    (how, *case) for how in head_masks.PARTS for case in CUT_CASES
])  # fmt: skip
def test_the_cut_is_exact(monkeypatch, how, algo, gqa, sched, backward):
    """A mask the same at every head, cut anyway: every pass's counts, peak, closed form and outputs equal the
    whole problem's (the parts' sums are the schedule over the whole problem)."""
    latent = sched.get("latent", False)
    Nq, dv = (29, 6) if sched.get("square") else (17, 5)  # the one-head algorithms' backward: N_q = N_k, d_qk = d_v
    p = Problem(B=2, H_q=4, H_kv=1 if latent else 2, N_q=Nq, N_k=29, d_qk=6, d_v=dv, latent=latent,
                page_size=sched.get("page_size"))  # fmt: skip
    kw = dict(problem=p, M=900, gqa=gqa, seed=3, backward=backward, splits=sched.get("splits", 1))
    if algo.startswith("flash"):
        kw.update(Br=4, Bc=5)
    whole = run_keywords(algo, mask=masks.from_mask_mod(doc_only, 0, 0), **kw)
    monkeypatch.setattr(head_masks, "uniform", lambda g: False)
    monkeypatch.setattr(head_masks, "cut", lambda p, g: how)
    cut = run_keywords(algo, mask=masks.from_mask_mod(lambda b, h, q, kv: doc_only(0 * b, 0 * h, q, kv)), **kw)
    assert cut.schedule["mask_parts"].endswith(f"({how})") and _exact(cut) and _exact(whole)
    assert _counts(cut) == _counts(whole) and cut.schedule["thread_blocks"] == whole.schedule["thread_blocks"]
    assert cut.schedule.get("combine_rows") == whole.schedule.get("combine_rows")
    for k, v in whole.outputs.items():
        if v is not None:
            np.testing.assert_allclose(cut.outputs[k], v, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fn, how, parts", [(doc_only, "batch", 2), (per_group, "kv-head", 4),
                                            (doc_window, "head", 8)])  # fmt: skip
def test_the_coarsest_cut_and_packed_gqa(fn, how, parts):
    """The cut is the coarsest within whose parts the mask is the same; packed GQA runs a part per key/value head
    when the g heads of a group differ (their packed rows under a mask of their own)."""
    for gqa in ("per-head", "packed"):
        r = iosim.run(
            iosim.Schedule("flash2", gqa=gqa, Br=4, Bc=5),
            problem=P,
            M=900,
            mask=masks.from_mask_mod(fn),
            count_only=True,
            backward=True,
        )
        n = P.B * P.H_kv if how == "head" and gqa == "packed" else parts
        assert _exact(r) and r.schedule["mask_parts"] == f"{n} ({how})"


def _stacked(fn, b, hk, p):
    """Group (b, hk)'s packed rows as the last g N_q query rows of one head: an N_k x N_k array whose rows
    N_k - g N_q + h N_q + q are head hk g + h's row q + N_k - N_q (its own mask, from the function)."""
    out = np.zeros((p.N_k, p.N_k), dtype=bool)
    R = p.g * p.N_q
    for h in range(p.g):
        rows = _dense(fn, b, hk * p.g + h, p)[p.N_k - p.N_q :]
        out[p.N_k - R + h * p.N_q : p.N_k - R + (h + 1) * p.N_q] = rows
    return out


@pytest.mark.parametrize("algo, backward, splits", [("flash1", False, 1), ("flash1", True, 1), ("flash2", False, 1),
                                                    ("flash2", True, 1), ("flash2", False, 3)])  # fmt: skip
def test_packed_gqa_with_heads_that_differ(algo, backward, splits):
    """Packed GQA when the g query heads of a group differ: one part per key/value head, its g N_q packed rows under
    their own mask. Counts equal the closed form per array and in peak; each group counts exactly what one head of
    g N_q query rows counts under the group's rows as an N x N array (an independent path: the element kind, not
    the packed MOD table); outputs equal the float64 reference of each head's own mask; the floor reads the keys
    some head of a group sees."""
    p = Problem(B=2, H_q=4, H_kv=2, N_q=7, N_k=29, d_qk=6, d_v=5)  # g N_q = 14 packed rows fit below N_k = 29
    kw = dict(M=900, gqa="packed", Br=4, Bc=5, backward=backward, splits=splits)
    rng = np.random.default_rng(4)
    Q, K, V = (rng.standard_normal(s) for s in ((2, 4, 7, 6), (2, 2, 29, 6), (2, 2, 29, 5)))
    r = run_keywords(algo, problem=p, mask=masks.from_mask_mod(doc_window), Q=Q, K=K, V=V, **kw)
    assert _exact(r) and r.schedule["mask_parts"] == "4 (head)" and r.finite
    assert max(r.errors.values()) < 1e-12
    one = Problem(N_q=p.g * p.N_q, N_k=p.N_k, d_qk=p.d_qk, d_v=p.d_v)
    groups = [run_keywords(algo, problem=one, mask=_stacked(doc_window, b, hk, p), count_only=True, **kw)
              for b in range(p.B) for hk in range(p.H_kv)]  # fmt: skip
    for name, ps in r.passes.items():
        total = groups[0].passes[name].stats
        for x in groups[1:]:
            total = total + x.passes[name].stats
        if splits == 1:  # (split-KV: one combine over the whole, its blocks not the groups')
            assert ps.stats.per_array == total.per_array and ps.stats.peak == max(
                x.passes[name].stats.peak for x in groups
            )
        else:
            assert {k: v for k, v in ps.stats.per_array.items() if k in ("Q", "K", "V")} == {
                k: v for k, v in total.per_array.items() if k in ("Q", "K", "V")}  # fmt: skip
    # the outputs against the float64 reference of each head under its own N x N mask
    from iosim.runner.references import problem_reference

    hp = Problem(N_q=p.N_q, N_k=p.N_k, d_qk=p.d_qk, d_v=p.d_v)
    for b in range(p.B):
        for h in range(p.H_q):
            tm = masks.compile_mask(_dense(doc_window, b, h, p), p.N_k)
            O, _ = problem_reference(hp, Q[b, h], K[b, h // p.g], V[b, h // p.g], 1 / np.sqrt(p.d_qk), tm)
            q = (b * p.H_q + h) * p.N_q
            np.testing.assert_allclose(r.outputs["O"][q : q + p.N_q], O, rtol=0, atol=1e-12)
    keys = sum(int(np.any([_dense(doc_window, b, h, p)[p.N_k - p.N_q :].any(axis=0)
                           for h in range(hk * p.g, (hk + 1) * p.g)], axis=0).sum())
               for b in range(p.B) for hk in range(p.H_kv))  # fmt: skip
    rows = sum(int(_dense(doc_window, b, h, p)[p.N_k - p.N_q :].any(axis=1).sum()) for b in range(p.B)
               for h in range(p.H_q))  # fmt: skip
    assert tuple(iosim.runner.api.problem_seen(p, masks.from_mask_mod(doc_window))) == (rows, keys)


def test_block_mask_per_head():
    """A BlockMask built per (b, h) counts what its mask_mod counts, exactly; pinned, it is one mask for all."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import create_block_mask

    tdocs = torch.from_numpy(DOCS)

    def tmod(b, h, q_idx, kv_idx):
        return (tdocs[b, q_idx] == tdocs[b, kv_idx]) & (q_idx >= kv_idx) & (kv_idx > q_idx - 3 - 4 * h)

    bm = create_block_mask(tmod, 2, 4, 29, 29, device="cpu", BLOCK_SIZE=8)
    kw = dict(problem=P, M=900, count_only=True, backward=True, Br=4, Bc=5)
    a = run_keywords("flash1", mask=masks.from_block_mask(bm), **kw)
    b = run_keywords("flash1", mask=masks.from_mask_mod(doc_window), **kw)
    assert _exact(a) and _counts(a) == _counts(b)
    pinned = run_keywords("flash1", mask=masks.from_block_mask(bm, 1, 3), **kw)
    assert "mask_parts" not in pinned.schedule and _exact(pinned)
    with pytest.raises(InputError, match="^block_mask has \\(B, H\\) = \\(2, 4\\)"):
        iosim.run("flash1", problem=Problem(B=3, H_q=4, N_q=17, N_k=29, d=6), M=900,
                  mask=masks.from_block_mask(bm), count_only=True)  # fmt: skip
    with pytest.raises(InputError, match="^block_mask h must be None"):
        masks.from_block_mask(bm, 0, 4)


def test_block_sparse_per_head_from_a_mask_object():
    """The block-sparse schedule classifies a per-(b, h) mask object at each (b, h), as it does the function."""
    from iosim.masking.block_sparse import block_sparse

    p = Problem(B=2, H_q=4, H_kv=2, N_q=29, N_k=29, d=8)
    a = block_sparse(p, masks.from_mask_mod(doc_window), block=8)
    b = block_sparse(p, doc_window, block=8, mask_B=2, mask_H=4)
    c = block_sparse(p, doc_window, block=8)  # the function reads b and h: classified at every (b, h)
    assert a.exact and a.census == b.census == c.census and a.census["heads_per_mask"] == 1
    assert block_sparse(p, doc_window, block=8, mask_B=1, mask_H=1).census["heads_per_mask"] == 8


@pytest.mark.parametrize("fn, how, gqa", [(doc_only, "batch", "packed"), (per_group, "kv-head", "packed"),
                                         (doc_window, "head", "per-head")])  # fmt: skip
@pytest.mark.parametrize("splits", [2, 3, 4])
def test_split_kv_per_head_mask(fn, how, gqa, splits):
    """Split-KV (flash2's forward) under a mask that differs per (b, h): each part's split kernel, then one combine
    kernel over every row (its blocks across the parts): counts equal the closed form per array and in peak; every
    array's counts are the sums of each (b, h) run alone under its mask as an N x N array with the same splits (the
    combine's counts do not depend on its blocks); outputs equal the reference. N_k = 29, B_c = 5: 6 column blocks,
    so 4 splits of 2 leave the last split no block, and the masks leave splits empty for many row blocks."""
    r = iosim.run(
        iosim.Schedule("flash2", gqa=gqa, splits=splits, Br=4, Bc=5),
        problem=P,
        M=900,
        mask=masks.from_mask_mod(fn),
        seed=2,
    )
    assert _exact(r) and r.schedule["mask_parts"].endswith(f"({how})") and r.schedule["splits"] == splits
    assert max(r.errors.values()) < 1e-12 and r.finite
    Rtot = P.B * P.H_q * P.N_q
    bm = min(Rtot, 900 // (splits + 2 * P.d_v + 1))  # the whole problem's combine block
    assert r.schedule["combine_rows"] == bm and r.main.stats.peak >= bm * (splits + 2 * P.d_v + 1)
    one = Problem(N_q=P.N_q, N_k=P.N_k, d_qk=P.d_qk, d_v=P.d_v)
    heads = [
        iosim.run(
            iosim.Schedule("flash2", splits=splits, Br=4, Bc=5),
            problem=one,
            M=900,
            mask=_dense(fn, b, h),
            count_only=True,
        )
        for b in range(P.B)
        for h in range(P.H_q)
    ]
    total = heads[0].main.stats
    for x in heads[1:]:
        total = total + x.main.stats
    if gqa == "per-head":  # packed reads K/V once per group; per head, once per query head
        assert r.main.stats.per_array == total.per_array
    assert {k: r.main.stats.per_array[k] for k in ("Opart", "Lpart", "O", "L")} == {
        k: total.per_array[k] for k in ("Opart", "Lpart", "O", "L")}  # fmt: skip


def test_refusals(tmp_path):
    """Options that do not apply: one line naming the parameter; the floor and the hierarchy take a mask that
    differs; the command line gives exit 2 and runs the per-(b, h) mask otherwise."""
    mod = masks.from_mask_mod(doc_window)
    with pytest.raises(InputError, match="^splits applies to flash2"):  # split-KV runs per part on flash2 alone
        iosim.run(iosim.Schedule("flash1", splits=2), problem=P, M=900, mask=mod, count_only=True)
    with pytest.raises(InputError, match="^splits is an inference option with no backward"):
        iosim.run(iosim.Schedule("flash2", splits=2), problem=P, M=900, mask=mod, backward=True, count_only=True)
    with pytest.raises(InputError, match="^trace is not recorded with a mask that differs"):
        iosim.run("flash2", problem=P, M=900, mask=mod, trace=True, count_only=True)
    assert iosim.runner.api.problem_seen(P, masks.from_mask_mod(doc_window, 1, 2)) is not None
    # each unit its own mask
    assert iosim.hierarchy("flash2", problem=P, M=900, mask=mod, device=Machine(C=0)).two_level > 0
    src = tmp_path / "m.py"
    src.write_text("def mod(b, h, q_idx, kv_idx):\n    return (q_idx >= kv_idx) & (kv_idx > q_idx - 2 - 3 * h)\n")
    base = ["run", "flash2", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--Nq", "17", "--Nk", "29", "--d", "6",
            "--M", "900", "--mask", f"mod:{src}:mod", "--count-only"]  # fmt: skip
    assert main([*base, "--json"]) == 0
    assert main([*base, "--splits", "2"]) == 0 and main([*base[:-1], "--splits", "3"]) == 0
    assert main([*base, "--splits", "2", "--gqa", "packed"]) == 0  # the heads of a group differ: packed rows


def test_a_mask_mod_that_never_reads_b_or_h_is_evaluated_once():
    """b and h that raise on every use tell a mask_mod that reads them (NumPy or torch, indexing, arithmetic,
    comparison) from one that does not, which runs as one mask for every head."""
    torch = pytest.importorskip("torch")
    from iosim.masking.mask_mod import reads_b_or_h

    tdoc = torch.from_numpy(DOCS)
    reads = [doc_window, doc_only, per_group, lambda b, h, q, kv: (q >= kv) & (h < 3),
             lambda b, h, q, kv: tdoc[b, q] == tdoc[b, kv], lambda b, h, q, kv: q - kv < [4, 8][h % 2]]  # fmt: skip
    never = [lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: DOCS[0][q] == DOCS[0][kv],
             lambda b, h, q, kv: torch.as_tensor(q) >= torch.as_tensor(kv)]  # fmt: skip
    assert all(reads_b_or_h(fn, 29) for fn in reads) and not any(reads_b_or_h(fn, 29) for fn in never)
    assert head_masks.grid(P, masks.from_mask_mod(never[1])) is None
    assert len(head_masks.grid(P, masks.from_mask_mod(doc_only))) == P.B


def test_the_floor_bounds_and_compare_take_a_mask_that_differs(tmp_path, capsys):
    """The compulsory floor under a mask that differs per (b, h) reads each query row that sees a key once and, per
    key/value head, the keys some query head of its group sees (the union, counted here from the N x N arrays);
    ``iosim bounds`` and ``iosim compare`` print it, and every schedule compare runs is exact above it."""
    import json

    src = tmp_path / "m.py"
    body = "(DOCS[b][q_idx] == DOCS[b][kv_idx]) & (q_idx >= kv_idx) & (kv_idx > q_idx - 3 - 4 * h)"
    src.write_text("import numpy as np\nDOCS = np.array([[0] * 20 + [1] * 9, [0] * 7 + [1] * 15 + [2] * 7])\n\n\n"
                   f"def doc_window(b, h, q_idx, kv_idx):\n    return {body}\n")  # fmt: skip
    tail = [dense[P.N_k - P.N_q :] for dense in (_dense(doc_window, b, h) for b in range(P.B) for h in range(P.H_q))]
    rows = sum(int(t.any(axis=1).sum()) for t in tail)
    keys = sum(int((tail[2 * k].any(axis=0) | tail[2 * k + 1].any(axis=0)).sum()) for k in range(P.B * P.H_kv))
    floor = rows * P.d_qk + P.B * P.H_q * P.N_q * P.d_v + keys * (P.d_qk + P.d_v)
    assert tuple(iosim.runner.api.problem_seen(P, masks.from_mask_mod(doc_window))) == (rows, keys)
    problem = ["--batch", "2", "--heads", "4", "--kv-heads", "2", "--Nq", "17", "--Nk", "29", "--dqk", "6", "--dv", "5",
               "--M", "900", "--mask", f"mod:{src}:doc_window"]  # fmt: skip
    capsys.readouterr()
    assert main(["bounds", *problem, "--json"]) == 0
    bounds = json.loads(capsys.readouterr().out)["bounds"]
    assert [b["value"] for b in bounds if b["name"] == "compulsory"] == [floor]
    assert main(["compare", *problem, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compulsory"] == floor and {r["schedule"].get("gqa") for r in out["compare"]} >= {"per-head", "packed"}
    assert all(r["exact"] and r["total"] >= floor for r in out["compare"])
