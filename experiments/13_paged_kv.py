# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 13: paged KV cache (vLLM): I/O against the page size P for tiles of B_c keys.

Question (issue 22): a paged cache stores each sequence's keys and values in pages of P tokens located through a
page table. A tile of B_c keys that straddles pages is loaded one page piece at a time, and each piece's table
entry is read. What does paging cost against a contiguous cache, for pages smaller than, equal to and larger than
a tile? flash2 forward (decoding: B = 8, H_q = 32, H_kv = 8 packed, N_q = 1, N_k = 32,768, d = 128, explicit
B_c = 128 so that every P is on the same tiles) and flash1, count-only, exact against io_model; P = 1 .. 1024.
Reported: words (K/V words are those of the contiguous cache: a piece costs its words), page-table words, the
pieces (K/V transfers) and the largest inner-step working set.

Run: ``iosim experiments run paged-kv``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from iosim.experiments import _common
from iosim.experiments._common import Verdict

import iosim
from iosim import Problem

NAME = "paged-kv"
TITLE = "Paged KV: I/O against the page size"
CLAIM = (
    "For a Q-outer schedule (flash2, FlashDecoding, vLLM) paging costs only the page-table entries in words, one "
    "per page piece; the K/V words equal the contiguous cache's, and pages smaller than a tile multiply the "
    "transfers by B_c / P. A K/V-outer schedule (flash1) pays more: each piece is an outer step with its round "
    "trip of O, l, m."
)
NEEDS = ("plot",)
BC, NK, M = 128, 32768, 65536


def run(out: Path, quick: bool = False) -> Verdict:
    pages = [1, 4, 16, 64, 128, 256, 1024] if not quick else [1, 16, 128, 1024]
    base = Problem(B=8, H_q=32, H_kv=8, N_q=1, N_k=NK, d=128)
    rows = []
    for algo in ("flash2", "flash1"):
        ref = iosim.run(algo, problem=base, M=M, gqa="packed", Bc=BC, count_only=True)
        for P in [None, *pages]:
            p = Problem(B=8, H_q=32, H_kv=8, N_q=1, N_k=NK, d=128, page_size=P)
            r = iosim.run(algo, problem=p, M=M, gqa="packed", Bc=BC, count_only=True)
            assert r.main.exact
            pa = r.stats.per_array
            table_words = pa["page_table"].reads if "page_table" in pa else 0
            kv = pa["K"].reads + pa["V"].reads
            groups = p.B * p.H_kv
            pieces = table_words // groups if P else -(-NK // BC)  # per group: transfers of K (and of V)
            ref_kv = ref.stats.per_array["K"].reads + ref.stats.per_array["V"].reads
            rows.append(dict(algorithm=algo, P=P or 0, total=r.stats.total, kv_words=kv, table_words=table_words,
                             extra_over_contiguous=r.stats.total / ref.stats.total - 1, pieces_per_group=pieces,
                             peak=r.stats.peak, same_kv=kv == ref_kv,
                             only_table=r.stats.total - ref.stats.total == table_words))  # fmt: skip
    table = [[x["algorithm"], str(x["P"] or "contiguous"), f"{x['total']:,}", f"{x['table_words']:,}",
              f"{100 * x['extra_over_contiguous']:.4f}%", f"{x['pieces_per_group']:,}", f"{x['peak']:,}"]
             for x in rows]  # fmt: skip
    same = all(x["same_kv"] for x in rows)
    worst = max(x["extra_over_contiguous"] for x in rows if x["algorithm"] == "flash2")
    only_table = all(x["only_table"] for x in rows if x["algorithm"] == "flash2")
    f1 = max(x["extra_over_contiguous"] for x in rows if x["algorithm"] == "flash1")
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"K/V words equal the contiguous cache's at every P ({'yes' if same else 'NO'}); flash2 pays only the "
            f"table ({'yes' if only_table else 'NO'}), at most {100 * worst:.3f}% (P = 1); flash1 up to "
            f"{100 * f1:.0f}% more; pieces per group from {NK:,} (P = 1) to {NK // BC} (P >= B_c)"
        ),
        figure=f"B_c = {BC}, N_k = {NK:,}",
        holds=same and only_table,
    )
    v.notes.append(
        "In the word model a page piece costs its words, so paging shows in the table words and in the number of "
        "transfers (pieces); with P < B_c the inner steps are the pieces, so S_ij and the peak shrink with P."
    )
    headers = ["algorithm", "P", "words", "page-table words", "over contiguous", "pieces per group", "peak"]
    return _common.write_outputs(out, "13_paged_kv", rows, table, headers, v, fig=_plot(rows))


def _plot(rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in ("flash2", "flash1"):
        sel = [x for x in rows if x["algorithm"] == algo and x["P"]]
        ax.plot([x["P"] for x in sel], [x["pieces_per_group"] for x in sel], marker="o", label=f"{algo}: pieces")
    ax.axvline(BC, color="k", lw=0.8, ls="--", label=f"B_c = {BC}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("page size P (tokens)")
    ax.set_ylabel("K/V transfers per (batch, KV head)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    return _common.script_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
