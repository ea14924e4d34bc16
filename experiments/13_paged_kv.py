# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 13: paged KV cache (vLLM): I/O against the page size P for tiles of B_c keys.

Question: a paged cache stores each sequence's keys and values in pages of P tokens located through a
page table. A tile of B_c keys that straddles pages is loaded one page piece at a time, and each piece's table
entry is read. What does paging cost against a contiguous cache, for pages smaller than, equal to and larger than
a tile? flash2 forward (decoding: B = 8, H_q = 32, H_kv = 8 packed, N_q = 1, N_k = 32,768, d = 128, explicit
B_c = 128 so that every P is on the same tiles) and flash1, count-only, exact against io_model; P = 1 .. 1024.
flash1 (K/V outer) twice: piece per step (each page piece of a tile an outer step of its own, with its own round
trip of Q_i, O_i, l_i, m_i: ``iosim run``'s schedule) and gather (the tile's keys gathered from their pages in one
outer step, :func:`iosim.algorithms.flash.flash1_problem` with ``gather=True``): what paging costs a K/V-outer
kernel that gathers is the table words alone; the piece-per-step cost is that schedule's, not paging's.
Reported: words (K/V words are those of the contiguous cache: a piece costs its words), page-table words, the
pieces (K/V transfers) and the largest inner-step working set.

Run: ``iosim experiments run paged-kv``.
"""

from __future__ import annotations

from iosim.algorithms import flash
from iosim.experiments import runner
from iosim.experiments._common import Verdict
from iosim.memory_model import TwoLevelMemory

import iosim
from iosim import Problem
from iosim.theory import io_model

NAME = "paged-kv"
TITLE = "Paged KV: I/O against the page size"
CLAIM = (
    "For a Q-outer schedule (flash2, FlashDecoding, vLLM) paging costs only the page-table entries in words, one "
    "per page piece; the K/V words equal the contiguous cache's, and pages smaller than a tile multiply the "
    "transfers by B_c / P. A K/V-outer schedule (flash1) that makes each piece an outer step pays a round trip of "
    "O, l, m per piece; one that gathers a tile's keys from their pages pays the table words only."
)
FULL = {"Bc": 128, "N_k": 32768, "M": 65536, "pages": [1, 4, 16, 64, 128, 256, 1024]}
QUICK = {"Bc": 128, "N_k": 32768, "M": 65536, "pages": [1, 16, 128, 1024]}


def measure(g) -> list[dict]:
    rows = []
    for algo in ("flash2", "flash1"):
        base = Problem(B=8, H_q=32, H_kv=8, N_q=1, N_k=g.N_k, d=128)
        ref = iosim.run(iosim.Schedule(algo, gqa="packed", Bc=g.Bc), problem=base, M=g.M, count_only=True)
        ref_kv = ref.stats.per_array["K"].reads + ref.stats.per_array["V"].reads
        for P in [None, *g.pages]:
            p = Problem(B=8, H_q=32, H_kv=8, N_q=1, N_k=g.N_k, d=128, page_size=P)
            r = iosim.run(iosim.Schedule(algo, gqa="packed", Bc=g.Bc), problem=p, M=g.M, count_only=True)
            pa = r.stats.per_array
            table_words = pa["page_table"].reads if "page_table" in pa else 0
            kv = pa["K"].reads + pa["V"].reads
            groups = p.B * p.H_kv
            pieces = table_words // groups if P else -(-g.N_k // g.Bc)  # per group: transfers of K (and of V)
            rows.append(dict(algorithm=algo, P=P or 0, total=r.stats.total, kv_words=kv, table_words=table_words,
                             extra_over_contiguous=r.stats.total / ref.stats.total - 1, pieces_per_group=pieces,
                             peak=r.stats.peak, same_kv=kv == ref_kv, exact=r.main.exact,
                             only_table=r.stats.total - ref.stats.total == table_words))  # fmt: skip
    t = ref.tiling  # flash1's tiles (B_c given; B_r by the rule, the same at every P)
    for P in [None, *g.pages]:  # flash1 gathering each tile from its pages: one outer step per column block
        p = Problem(B=8, H_q=32, H_kv=8, N_q=1, N_k=g.N_k, d=128, page_size=P)
        mem = TwoLevelMemory(g.M, fast=True)
        flash.flash1_problem(mem, p, None, None, None, None, Br=t.Br, Bc=t.Bc, gqa="packed", mla="shared",
                                scale=1.0, gather=True)  # fmt: skip
        st, pred = mem.stats(), io_model.flash1_problem(p, t.Br, t.Bc, "packed", gather=True)
        pa = st.per_array
        table_words = pa["page_table"].reads if "page_table" in pa else 0
        kv = pa["K"].reads + pa["V"].reads
        pieces = table_words // (p.B * p.H_kv) if P else -(-g.N_k // g.Bc)
        rows.append(dict(algorithm="flash1 gather", P=P or 0, total=st.total, kv_words=kv, table_words=table_words,
                         extra_over_contiguous=st.total / ref.stats.total - 1, pieces_per_group=pieces,
                         peak=st.peak, same_kv=kv == ref_kv, exact=st.per_array == pred.per_array
                         and st.peak == pred.peak, only_table=st.total - ref.stats.total == table_words))  # fmt: skip
    return rows


def verdict(rows, g) -> runner.Summary:
    table = [[x["algorithm"], str(x["P"] or "contiguous"), f"{x['total']:,}", f"{x['table_words']:,}",
              f"{100 * x['extra_over_contiguous']:.4f}%", f"{x['pieces_per_group']:,}", f"{x['peak']:,}"]
             for x in rows]  # fmt: skip
    same = all(x["same_kv"] for x in rows)
    worst = max(x["extra_over_contiguous"] for x in rows if x["algorithm"] == "flash2")
    only_table = all(x["only_table"] for x in rows if x["algorithm"] == "flash2")
    f1 = max(x["extra_over_contiguous"] for x in rows if x["algorithm"] == "flash1")
    gather = [x for x in rows if x["algorithm"] == "flash1 gather"]
    g1 = max(x["extra_over_contiguous"] for x in gather)
    gather_only_table = all(x["only_table"] and x["exact"] for x in gather)
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"K/V words equal the contiguous cache's at every P ({'yes' if same else 'NO'}); flash2 pays only the "
            f"table ({'yes' if only_table else 'NO'}), at most {100 * worst:.3f}% (P = 1); flash1 piece per step up "
            f"to {100 * f1:.0f}% more, flash1 gathering its tiles {100 * g1:.2f}% (the table only: "
            f"{'yes' if gather_only_table else 'NO'}); pieces per group from {g.N_k:,} (P = 1) to {g.N_k // g.Bc} "
            f"(P >= B_c)"
        ),
        figure=f"B_c = {g.Bc}, N_k = {g.N_k:,}",
        holds=same and only_table and gather_only_table,
    )
    v.notes.append(
        "In the word model a page piece costs its words, so paging shows in the table words and in the number of "
        "transfers (pieces); with P < B_c the inner steps are the pieces, so S_ij and the peak shrink with P (flash2, "
        "flash1 piece per step; flash1 gather keeps the whole tile B_c resident, the contiguous cache's peak)."
    )
    headers = ["algorithm", "P", "words", "page-table words", "over contiguous", "pieces per group", "peak"]
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in ("flash2", "flash1"):  # flash1 gather makes the same transfers as flash1 piece per step
        sel = [x for x in rows if x["algorithm"] == algo and x["P"]]
        ax.plot([x["P"] for x in sel], [x["pieces_per_group"] for x in sel], marker="o", label=f"{algo}: pieces")
    ax.axvline(g.Bc, color="k", lw=0.8, ls="--", label=f"B_c = {g.Bc}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("page size P (tokens)")
    ax.set_ylabel("K/V transfers per (batch, KV head)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())
